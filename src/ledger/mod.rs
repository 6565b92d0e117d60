//! The ledger: every job and expectation, durable before any answer; SQLite or PostgreSQL.
//!
//! [`Ledger`] is what the rest of the service sees: the operations of the contract (`contract.rs`: claim,
//! start and end an attempt, take back leases, due work, retention, reconciliation, counts,
//! inspection), each backend implementing them in its own dialect: SQLite with one writer
//! thread and group commit ([`sqlite`]), PostgreSQL with a pool, batched claims and row locks
//! for N receivers ([`postgres`]). The domain types are in `model.rs`.

mod contract;
mod model;
pub mod postgres;
pub mod sqlite;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::DatabaseConfig;
use crate::metrics::{AttemptResult, METRICS};

pub use contract::Backend;
pub use model::{
    Attempt, AttemptEnd, ClaimOutcome, DueExpectation, DueJobs, Expectation, JobDetail, JobStats,
    JobSummary, LeasedAttempt, Leases, NewClaim, PollResult, RetentionStep, RetryError, Source,
    State,
};
use postgres::PostgresLedger;
pub use sqlite::{backup, BackupReport, PendingClaims, SqliteLedger, WriterAlone};

/// Why a ledger operation failed, by what the caller should do about it. Cheap to clone: one
/// failed group commit fails every waiter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StorageError {
    /// The database did not take the change (locked, unreachable, an error): nothing was
    /// written; try again later (a delivery: 503, and Sume retries).
    #[error("the ledger did not take the change: {0}")]
    Unavailable(Cause),
    /// Too many changes wait already: refused at once instead of queued; try again later.
    #[error("the ledger's queue is full")]
    Overloaded,
    /// The change may or may not be durable (the connection broke after the commit was sent,
    /// or the wait for a synchronous standby was cancelled): answer it as a failure, and a
    /// retry finds the row if it is there.
    #[error("the outcome of the commit is unknown: {0}")]
    OutcomeUnknown(Cause),
    /// The ledger failed for good (the disk, a thread): nothing more will be written, and the
    /// service stops.
    #[error("the ledger failed: {0}")]
    Failed(Cause),
    /// The ledger is closed: nothing more will be written.
    #[error("the ledger is closed")]
    Closed,
}

/// The error beneath a [`StorageError`], shared by every clone.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause(Arc::new(error))
    }

    /// A cause that is only a message.
    pub fn message(text: impl Into<String>) -> Cause {
        let error: Box<dyn std::error::Error + Send + Sync> = text.into().into();
        Cause(error.into())
    }

    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

/// The error and its sources (drivers put the server's message in a source).
impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Equal when they say the same (for tests that compare outcomes).
impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        self.to_string() == other.to_string()
    }
}

/// The ledger stopped because the disk failed a write, a sync or a checkpoint. Linux may have
/// dropped the pages it could not write while it still serves them from its cache, so a process
/// started again in this boot could read, and answer "duplicate" for, jobs the disk does not
/// hold. The service exits with [`STORAGE_LOST_EXIT_STATUS`], which the unit never restarts.
#[derive(Debug, thiserror::Error)]
#[error(
    "the disk failed under the ledger {location}: reboot before starting the service again (a \
     start in this boot would trust the page cache), check the disk (dmesg, smartctl), and \
     restore the ledger from a backup if the start's check finds it damaged"
)]
pub struct StorageLost {
    pub location: String,
}

/// The exit status after [`StorageLost`] (EX_IOERR); the unit lists it in
/// `RestartPreventExitStatus=`.
pub const STORAGE_LOST_EXIT_STATUS: u8 = 74;

/// Milliseconds since the Unix epoch: the unit of every time column.
pub fn now_ms() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

pub fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The open ledger: a service's, or the command line's (opened without the background tasks).
pub enum Ledger {
    Sqlite(SqliteLedger),
    Postgres(PostgresLedger),
}

impl Ledger {
    /// Opens the configured backend for the service: `database.url` names a PostgreSQL
    /// database, otherwise the SQLite file at `database.path`. Creates and migrates the schema
    /// as needed.
    pub async fn open(config: &DatabaseConfig) -> anyhow::Result<Arc<Ledger>> {
        let ledger = match config.postgres_url()? {
            Some(url) => Ledger::Postgres(PostgresLedger::open(&url, config).await?),
            None => {
                let config = config.clone();
                Ledger::Sqlite(
                    tokio::task::spawn_blocking(move || SqliteLedger::open(&config)).await??,
                )
            }
        };
        Ok(Arc::new(ledger))
    }

    /// Opens the ledger for the command line: reads and single changes, no background tasks.
    /// Refuses a ledger that does not exist or is not migrated (only the service migrates).
    pub async fn open_existing(config: &DatabaseConfig) -> anyhow::Result<Ledger> {
        Ok(match config.postgres_url()? {
            Some(url) => Ledger::Postgres(PostgresLedger::open_existing(&url, config).await?),
            None => {
                let config = config.clone();
                Ledger::Sqlite(
                    tokio::task::spawn_blocking(move || SqliteLedger::open_existing(&config))
                        .await??,
                )
            }
        })
    }

    /// The SQLite backend, for what only it has (its file).
    pub fn sqlite(&self) -> Option<&SqliteLedger> {
        match self {
            Ledger::Sqlite(ledger) => Some(ledger),
            Ledger::Postgres(_) => None,
        }
    }

    /// Takes back `leases`, except those `still_running` says this process is running (their
    /// handler timeout is enforced on the monotonic clock, so a jump of the wall clock must not
    /// hand them out twice). Each attempt taken back counts as failed with `error`; its job is
    /// due again at `now`, or dead after its last attempt. Safe on several receivers at once:
    /// each lease is taken back once (the attempt number fences it). How many it took back.
    pub async fn expire_leases(
        &self,
        leases: Leases,
        now: i64,
        max_attempts: u32,
        error: &'static str,
        still_running: impl Fn(&str) -> bool + Send,
    ) -> Result<usize, StorageError> {
        let cutoff = match leases {
            Leases::ExpiredBefore(cutoff) => cutoff,
            Leases::HeldBeforeThisStart => i64::MAX,
        };
        let mut taken_back = 0;
        for lease in self.leases_to_take_back(leases).await? {
            if still_running(&lease.job_id) {
                continue;
            }
            let Some(state) = self
                .take_back_lease(&lease, cutoff, now, max_attempts, error)
                .await?
            else {
                continue;
            };
            if state == State::Dead {
                METRICS.record_attempt_end(AttemptResult::Dead, None);
                tracing::error!(job_id = ?lease.job_id, "job dead: its last attempt never finished");
            } else {
                METRICS.record_attempt_end(AttemptResult::Failed, None);
            }
            taken_back += 1;
        }
        Ok(taken_back)
    }

    /// Makes jobs whose stored id can never run `dead`, with the reason as their last error, so
    /// that they stop coming back as due work. No attempt ran: only the finished count changes
    /// ([`Ledger::recount_finished`]).
    pub async fn give_up_unrunnable(
        &self,
        unrunnable: Vec<(String, String)>,
        now: i64,
    ) -> Result<(), StorageError> {
        for (job_id, reason) in &unrunnable {
            let error = format!("the stored job_id cannot run: {reason}");
            if self.give_up(job_id, &error, now).await? {
                tracing::error!(job_id = ?job_id, reason, "job dead: its stored job_id cannot run");
            }
        }
        Ok(())
    }

    /// Counts done and dead jobs afresh for `/metrics` (at start, after retention).
    pub async fn recount_finished(&self) -> Result<(), StorageError> {
        let (done, dead) = self.count_finished().await?;
        METRICS.set_finished_jobs(done, dead);
        Ok(())
    }
}
