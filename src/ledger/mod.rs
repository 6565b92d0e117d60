//! The ledger: every job and expectation, durable before any answer; SQLite or PostgreSQL.
//!
//! [`Ledger`] is what the rest of the service sees: the operations of the contract
//! (`contract.rs`: claim, start and end an attempt, take back leases, due work, retention,
//! reconciliation, counts, inspection), each backend implementing them in its own dialect:
//! SQLite with one writer thread and group commit ([`sqlite`]), PostgreSQL with a pool, batched
//! claims and row locks for N receivers ([`postgres`]). The domain types are in `model.rs`,
//! the errors in `error.rs`; neither backend imports anything from this file.

mod contract;
mod dead_letters;
mod error;
mod model;
mod params;
mod portable_sql;
pub mod postgres;
mod rollups;
pub mod sqlite;
mod stops;
mod work_side;

use std::sync::Arc;

use anyhow::Context;

use crate::config::{LedgerConfig, PostgresUrl};
use crate::logging::Escaped;
use crate::metrics::{AttemptResult, METRICS};

use contract::forwarding_method;
pub use contract::Backend;
pub use dead_letters::{GroupRetry, GROUP_RETRY_BATCH};
pub use error::{
    fatal_exit_status, Cause, LedgerDamaged, StorageError, StorageLost, DAMAGED_EXIT_STATUS,
    STORAGE_LOST_EXIT_STATUS,
};
pub use model::{
    duration_ms, now_ms, ActionRecord, Attempt, AttemptEnd, AttemptRecord, AttemptRows,
    ClaimOutcome, Cursor, DeadGroup, Dispatch, DispatchStop, DueExpectation, DueJobs, Expectation,
    Failure, FinishedState, Hold, JobDetail, JobFilter, JobPage, JobStats, JobSummary,
    LeasedAttempt, Leases, NewClaim, PollResult, Release, RetentionStep, RetryCount, RetryError,
    RetryFilter, Routing, Source, State, StopKind, HISTORY_PER_JOB,
};
pub use params::{ActionTaken, Actor, ProbeMove};
pub use stops::{waiting_spans, STOPS_PER_JOB};
/// Rows of its list a page filtered by event type reads at most.
pub const ROWS_READ_PER_FILTERED_PAGE: usize = 10_000;
/// Rows read per query while filtering.
const ROWS_READ_PER_CHUNK: usize = 1_000;

pub use portable_sql::{dispatch_stops_sql, list_jobs_sql, stats_sql, Dialect, JOB_COUNTS_SQL};
pub use postgres::PostgresLedger;
pub use rollups::MinuteRollup;
pub use sqlite::{backup, BackupReport, SqliteLedger};
#[cfg(feature = "bench")]
pub use sqlite::{PendingClaims, WriterAlone};
pub use work_side::{WorkSide, WorkSideState};

/// The open ledger: a service's, or the command line's (opened without the background tasks).
pub enum Ledger {
    Sqlite(SqliteLedger),
    Postgres(PostgresLedger),
}

impl Ledger {
    contract::operations!(forwarding_method);

    /// [`Ledger::open_at`], PostgreSQL's URL read now (the command line, the tests).
    pub async fn open(config: &LedgerConfig) -> anyhow::Result<Arc<Ledger>> {
        let url = match config {
            LedgerConfig::Postgres(postgres) => Some(postgres.url()?),
            LedgerConfig::Sqlite(_) => None,
        };
        Ledger::open_at(config, url.as_ref()).await
    }

    /// Opens the configured backend for the service: PostgreSQL at `url`, read by the caller
    /// (the service's is the one its start-up check read:
    /// [`Credentials`](crate::config::Credentials)). Creates and migrates the schema as needed.
    pub async fn open_at(
        config: &LedgerConfig,
        url: Option<&PostgresUrl>,
    ) -> anyhow::Result<Arc<Ledger>> {
        let ledger = match config {
            LedgerConfig::Postgres(config) => {
                let url = url.context("no URL given for the PostgreSQL ledger")?;
                Ledger::Postgres(PostgresLedger::open(url, config).await?)
            }
            LedgerConfig::Sqlite(config) => {
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
    pub async fn open_existing(config: &LedgerConfig) -> anyhow::Result<Ledger> {
        Ok(match config {
            LedgerConfig::Postgres(config) => {
                Ledger::Postgres(PostgresLedger::open_existing(&config.url()?, config).await?)
            }
            LedgerConfig::Sqlite(config) => {
                let config = config.clone();
                Ledger::Sqlite(
                    tokio::task::spawn_blocking(move || SqliteLedger::open_existing(&config))
                        .await??,
                )
            }
        })
    }

    /// The SQLite backend, for the tests of its writer ([`SqliteLedger::write_for_test`]).
    #[cfg(feature = "testing")]
    pub fn sqlite(&self) -> Option<&SqliteLedger> {
        match self {
            Ledger::Sqlite(ledger) => Some(ledger),
            Ledger::Postgres(_) => None,
        }
    }

    pub fn postgres(&self) -> Option<&PostgresLedger> {
        match self {
            Ledger::Postgres(ledger) => Some(ledger),
            Ledger::Sqlite(_) => None,
        }
    }

    /// Takes back `leases`, except those `still_running` says this process is running (their
    /// handler timeout is enforced on the monotonic clock, so a jump of the wall clock must not
    /// hand them out twice). Each attempt taken back counts as failed with `error`; its work is
    /// due again at `now`, or dead after its route's last attempt (`max_attempts` of the
    /// route). Safe on several receivers at once: each lease is taken back once (the attempt
    /// number fences it). How many it took back.
    pub async fn expire_leases(
        &self,
        leases: Leases,
        now: i64,
        max_attempts: impl Fn(&str) -> u32 + Send,
        error: &'static str,
        still_running: impl Fn(&str, &str) -> bool + Send,
    ) -> Result<usize, StorageError> {
        let cutoff = match leases {
            Leases::ExpiredBefore(cutoff) => cutoff,
            Leases::HeldBeforeThisStart => i64::MAX,
        };
        let mut taken_back = 0;
        for lease in self.leases_to_take_back(leases).await? {
            if still_running(&lease.job_id, &lease.route) {
                continue;
            }
            let max_attempts = max_attempts(&lease.route);
            let Some(state) = self
                .take_back_lease(&lease, cutoff, now, max_attempts, error)
                .await?
            else {
                continue;
            };
            if state == State::Dead {
                METRICS.record_attempt_end(&lease.route, AttemptResult::Dead, None);
                tracing::error!(job_id = %Escaped(&lease.job_id), route = %Escaped(&lease.route), "job dead on a route: its last attempt never finished");
            } else {
                METRICS.record_attempt_end(&lease.route, AttemptResult::Failed, None);
            }
            taken_back += 1;
        }
        Ok(taken_back)
    }

    /// One page of the jobs `filter` keeps, newest first, after `after`. The event type and
    /// the route do not order any list: a page reads at most [`ROWS_READ_PER_FILTERED_PAGE`]
    /// rows of its list, so that a type or a route few jobs have costs a bounded page, which
    /// then ends short with where to go on.
    pub async fn find_jobs(
        &self,
        filter: &JobFilter,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<JobPage, StorageError> {
        let mut cursor = match (after, filter.before) {
            (Some(after), _) => Some(after.clone()),
            // Before that time: after a cursor at it with an id that sorts first.
            (None, Some(before)) => Some(Cursor {
                at: before,
                job_id: String::new(),
            }),
            (None, None) => None,
        };
        if limit == 0 || (filter.event_type.is_none() && filter.route.is_none()) {
            return self
                .list_jobs(filter.state, cursor.as_ref(), filter.since, limit)
                .await;
        }
        let mut kept = Vec::new();
        let mut read = 0;
        while read < ROWS_READ_PER_FILTERED_PAGE {
            let rows = self
                .list_jobs(
                    filter.state,
                    cursor.as_ref(),
                    filter.since,
                    ROWS_READ_PER_CHUNK,
                )
                .await?;
            read += rows.jobs.len();
            let on_route = match &filter.route {
                Some(route) => {
                    let ids: Vec<String> = rows.jobs.iter().map(|job| job.job_id.clone()).collect();
                    Some(self.jobs_on_route(route, &ids).await?)
                }
                None => None,
            };
            for (at, job) in rows.listed_at.into_iter().zip(rows.jobs) {
                let of_type = filter
                    .event_type
                    .as_ref()
                    .is_none_or(|wanted| job.event_type.as_ref() == Some(wanted));
                let routed = on_route
                    .as_ref()
                    .is_none_or(|ids| ids.contains(&job.job_id));
                if of_type && routed {
                    kept.push((at, job));
                    if kept.len() == limit {
                        // Full: the next page starts after the last job kept.
                        return Ok(JobPage::from_rows(kept, limit));
                    }
                }
            }
            cursor = rows.next;
            if cursor.is_none() {
                break;
            }
        }
        // Short: the next page (if any) starts where the reading stopped.
        Ok(JobPage {
            next: cursor,
            ..JobPage::from_rows(kept, 0)
        })
    }

    /// Makes jobs whose stored id can never run `dead`, with the reason as their last error, so
    /// that they stop coming back as due work. No attempt ran.
    pub async fn give_up_unrunnable(
        &self,
        unrunnable: Vec<(String, String)>,
        now: i64,
    ) -> Result<(), StorageError> {
        for (job_id, reason) in &unrunnable {
            let error = format!("the stored job_id cannot run: {reason}");
            if self.give_up(job_id, &error, now).await? {
                tracing::error!(job_id = %Escaped(job_id), reason, "job dead: its stored job_id cannot run");
            }
        }
        Ok(())
    }
}
