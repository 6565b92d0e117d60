//! The ledger: every job and expectation, durable before any answer; SQLite or PostgreSQL.
//!
//! [`Ledger`] is what the rest of the service sees: one method per operation (claim, start and
//! end an attempt, take back leases, due work, retention, reconciliation, counts). Each backend
//! implements them its own way: SQLite with one writer thread and group commit
//! ([`sqlite`]), PostgreSQL with a pool, batched claims and row locks for N receivers
//! ([`postgres`]). Statements both can run are written once, here and in [`jobs`] and
//! [`expected`], in SQLite's `?N` form; the PostgreSQL side rewrites the placeholders.

mod expected;
mod jobs;
pub mod postgres;
pub mod sqlite;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::DatabaseConfig;
use crate::job_id::JobId;
use crate::metrics::Snapshot;

pub use expected::*;
pub use jobs::*;
use postgres::PostgresLedger;
pub use sqlite::{
    backup, BackupReport, PendingClaims, SqliteLedger, WriterAlone, WRITER_QUEUE_CAPACITY,
};

/// Why a ledger operation failed. Cheap to clone: one failed group commit fails every waiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    #[error("database is locked by another connection")]
    Busy,
    #[error("database error: {0}")]
    Sqlite(String),
    #[error("PostgreSQL error: {0}")]
    Postgres(String),
    /// The connection broke after the commit was sent: the change may or may not be durable,
    /// so it must be answered as a failure (Sume retries, and a retry finds the row if it is).
    #[error(
        "the connection to PostgreSQL was lost during the commit; its outcome is unknown: {0}"
    )]
    OutcomeUnknown(String),
    #[error("ledger is closed")]
    Closed,
    #[error("the ledger writer's queue is full")]
    Overloaded,
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

/// The open ledger of a running service.
pub enum Ledger {
    Sqlite(SqliteLedger),
    Postgres(PostgresLedger),
}

/// Runs the same call on whichever backend the ledger is.
macro_rules! on_backend {
    ($ledger:expr, $backend:ident => $call:expr) => {
        match $ledger {
            Ledger::Sqlite($backend) => $call,
            Ledger::Postgres($backend) => $call,
        }
    };
}

impl Ledger {
    /// Opens the configured backend: `database.url` names a PostgreSQL database, otherwise the
    /// SQLite file at `database.path`. Creates and migrates the schema as needed.
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

    /// Whether other receivers may use this ledger at the same time (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self, Ledger::Postgres(_))
    }

    /// The SQLite backend, for what only it has (the file, raw statements in tests).
    pub fn sqlite(&self) -> Option<&SqliteLedger> {
        match self {
            Ledger::Sqlite(ledger) => Some(ledger),
            Ledger::Postgres(_) => None,
        }
    }

    /// Where the ledger is, for logs: a file path, or PostgreSQL's host and database (never
    /// the password).
    pub fn location(&self) -> String {
        match self {
            Ledger::Sqlite(ledger) => ledger.path().display().to_string(),
            Ledger::Postgres(ledger) => ledger.location().to_owned(),
        }
    }

    /// Records a delivery's claim; [`StorageError::Overloaded`] at once when too many wait.
    pub async fn claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError> {
        let queued = std::time::Instant::now();
        let outcome = on_backend!(self, ledger => ledger.claim(claim).await);
        crate::metrics::METRICS.record_claim_commit(queued.elapsed().as_secs_f64());
        outcome
    }

    pub async fn start_attempt(
        &self,
        job_id: &JobId,
        now: i64,
        lease_expires_at: i64,
    ) -> Result<Option<Attempt>, StorageError> {
        on_backend!(self, ledger => ledger.start_attempt(job_id, now, lease_expires_at).await)
    }

    pub async fn finish_attempt(
        &self,
        attempt: &Attempt,
        end: &AttemptEnd,
        now: i64,
    ) -> Result<Option<State>, StorageError> {
        on_backend!(self, ledger => ledger.finish_attempt(attempt, end, now).await)
    }

    pub async fn release_attempt(&self, attempt: &Attempt, now: i64) -> Result<bool, StorageError> {
        on_backend!(self, ledger => ledger.release_attempt(attempt, now).await)
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
        still_running: impl Fn(&str) -> bool + Send + 'static,
    ) -> Result<usize, StorageError> {
        on_backend!(self, ledger => ledger.expire_leases(leases, now, max_attempts, error, still_running).await)
    }

    pub async fn due_jobs(&self, now: i64, limit: usize) -> Result<DueJobs, StorageError> {
        on_backend!(self, ledger => ledger.due_jobs(now, limit).await)
    }

    pub async fn give_up_unrunnable(
        &self,
        unrunnable: Vec<(String, String)>,
        now: i64,
    ) -> Result<(), StorageError> {
        on_backend!(self, ledger => ledger.give_up_unrunnable(unrunnable, now).await)
    }

    /// Resolves once new work may be in the ledger that this process did not put there (a claim
    /// on another receiver); never, for SQLite, where this process is the only writer.
    pub async fn work_added_elsewhere(&self) {
        match self {
            Ledger::Sqlite(_) => std::future::pending().await,
            Ledger::Postgres(ledger) => ledger.work_added_elsewhere().await,
        }
    }

    /// One retention step, at most `limit` rows; how many it changed.
    pub async fn retention_step(
        &self,
        step: RetentionStep,
        before: i64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        on_backend!(self, ledger => ledger.retention_step(step, before, limit).await)
    }

    /// Returns unused pages to the file system (SQLite), at most `pages` of them; `true` if some
    /// remain. PostgreSQL's autovacuum does this on its own.
    pub async fn release_free_pages(&self, pages: usize) -> Result<bool, StorageError> {
        match self {
            Ledger::Sqlite(ledger) => ledger.release_free_pages(pages).await,
            Ledger::Postgres(_) => Ok(false),
        }
    }

    pub async fn expect_job(
        &self,
        job_id: &JobId,
        now: i64,
        first_poll_at: i64,
    ) -> Result<bool, StorageError> {
        on_backend!(self, ledger => ledger.expect_job(job_id, now, first_poll_at).await)
    }

    pub async fn resolve_arrived(&self, now: i64) -> Result<usize, StorageError> {
        on_backend!(self, ledger => ledger.resolve_arrived(now).await)
    }

    /// Expectations due for a poll, at most `limit`. With several receivers each one is handed
    /// to one of them only (PostgreSQL moves its next poll past `lease` while it is polled).
    pub async fn due_expectations(
        &self,
        now: i64,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DueExpectation>, StorageError> {
        on_backend!(self, ledger => ledger.due_expectations(now, limit, lease).await)
    }

    pub async fn record_poll(
        &self,
        job_id: &str,
        result: &PollResult,
        now: i64,
    ) -> Result<(), StorageError> {
        on_backend!(self, ledger => ledger.record_poll(job_id, result, now).await)
    }

    /// What `/metrics` shows of the ledger.
    pub async fn metrics_snapshot(&self) -> Result<Snapshot, StorageError> {
        on_backend!(self, ledger => ledger.metrics_snapshot().await)
    }

    /// Counts done and dead jobs afresh for `/metrics` (at start, after retention).
    pub async fn recount_finished(&self) -> Result<(), StorageError> {
        let (done, dead) = on_backend!(self, ledger => ledger.count_finished().await)?;
        crate::metrics::METRICS.set_finished_jobs(done, dead);
        Ok(())
    }

    /// A change that commits nothing, through the same path as claims: proves that the ledger
    /// takes changes now (the watchdog's probe).
    pub async fn probe(&self) -> Result<(), StorageError> {
        on_backend!(self, ledger => ledger.probe().await)
    }

    /// Claims waiting for their commit.
    pub fn writer_queue_depth(&self) -> usize {
        on_backend!(self, ledger => ledger.writer_queue_depth())
    }

    /// Whether a delivery sent now would be claimed; the reason when not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        on_backend!(self, ledger => ledger.readiness())
    }

    /// Resolves if the ledger can never commit again (its writer died): the service must exit
    /// so that systemd restarts it.
    pub async fn writer_failed(&self) {
        on_backend!(self, ledger => ledger.writer_failed().await)
    }

    /// Stops after everything queued before this call is committed.
    pub async fn close(&self) {
        match self {
            Ledger::Sqlite(ledger) => ledger.close(),
            Ledger::Postgres(ledger) => ledger.close().await,
        }
    }
}

/// Which leases [`Ledger::expire_leases`] takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leases {
    /// Those that expired before this time (Unix ms): their holder overran or is gone.
    ExpiredBefore(i64),
    /// At start: those this receiver held when it stopped (its attempts were cut short), at
    /// once. On SQLite every running row; on PostgreSQL those leased under this receiver's
    /// name (`database.receiver`), while other receivers' leases wait for their expiry.
    HeldBeforeThisStart,
}

/// The bounded statements retention repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionStep {
    /// Drops the bodies of jobs finished before the cutoff (a tombstone row remains).
    PurgeBodies,
    /// Forgets jobs finished before the cutoff: a Redeliver of one is a new job.
    DeleteFinished,
    /// Forgets expectations resolved before the cutoff.
    DeleteResolvedExpectations,
}

/// A ledger opened by the command line, without the service's background machinery: reads and
/// single changes for `jobs ...`. Refuses a ledger that does not exist or is not migrated.
pub enum Inspector {
    Sqlite(rusqlite::Connection),
    Postgres(postgres::Inspector),
}

impl Inspector {
    pub fn open(config: &DatabaseConfig) -> anyhow::Result<Inspector> {
        Ok(match config.postgres_url()? {
            Some(url) => Inspector::Postgres(postgres::Inspector::open(&url, config)?),
            None => Inspector::Sqlite(sqlite::open_existing(config)?),
        })
    }

    pub fn list_jobs(
        &mut self,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<JobSummary>, StorageError> {
        match self {
            Inspector::Sqlite(conn) => Ok(jobs::list_jobs(conn, state, limit)?),
            Inspector::Postgres(inspector) => inspector.list_jobs(state, limit),
        }
    }

    pub fn show_job(&mut self, job_id: &str) -> Result<Option<JobDetail>, StorageError> {
        match self {
            Inspector::Sqlite(conn) => Ok(jobs::show_job(conn, job_id)?),
            Inspector::Postgres(inspector) => inspector.show_job(job_id),
        }
    }

    pub fn retry_job(&mut self, job_id: &str, now: i64) -> Result<(), RetryError> {
        match self {
            Inspector::Sqlite(conn) => jobs::retry_job(conn, job_id, now),
            Inspector::Postgres(inspector) => inspector.retry_job(job_id, now),
        }
    }

    pub fn job_stats(&mut self, now: i64) -> Result<JobStats, StorageError> {
        match self {
            Inspector::Sqlite(conn) => Ok(jobs::job_stats(conn, now)?),
            Inspector::Postgres(inspector) => inspector.job_stats(now),
        }
    }

    pub fn expect_job(
        &mut self,
        job_id: &JobId,
        now: i64,
        first_poll_at: i64,
    ) -> Result<bool, StorageError> {
        match self {
            Inspector::Sqlite(conn) => Ok(expected::expect_job(conn, job_id, now, first_poll_at)?),
            Inspector::Postgres(inspector) => inspector.expect_job(job_id, now, first_poll_at),
        }
    }

    pub fn job_ids_like(&mut self, pattern: &str) -> Result<Vec<String>, StorageError> {
        match self {
            Inspector::Sqlite(conn) => {
                let mut statement = conn.prepare(jobs::JOB_IDS_LIKE_SQL)?;
                let rows = statement.query_map([pattern], |row| row.get(0))?;
                Ok(rows.collect::<rusqlite::Result<_>>()?)
            }
            Inspector::Postgres(inspector) => inspector.job_ids_like(pattern),
        }
    }

    pub fn list_expectations(&mut self, limit: usize) -> Result<Vec<Expectation>, StorageError> {
        match self {
            Inspector::Sqlite(conn) => Ok(expected::list_expectations(conn, limit)?),
            Inspector::Postgres(inspector) => inspector.list_expectations(limit),
        }
    }
}
