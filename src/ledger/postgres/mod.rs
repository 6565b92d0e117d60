//! The PostgreSQL ledger: any number of receivers on one database, with the SQLite ledger's
//! guarantees.
//!
//! - Claims from concurrent deliveries are grouped: one multi-row `INSERT ... ON CONFLICT
//!   (job_id) DO NOTHING` per batch, in autocommit (one round trip, one commit), up to
//!   [`CLAIM_BATCHES_IN_FLIGHT`] batches at once on pooled connections. A delivery is answered
//!   only after its batch committed; an error, including a connection lost after the commit
//!   was sent (outcome unknown), is a 503 and never a 2xx. Rows are inserted in job_id order so
//!   that concurrent batches (from this receiver or another) cannot deadlock.
//! - A job starts on one receiver only: the start is a conditional `UPDATE` on a row taken with
//!   `FOR UPDATE SKIP LOCKED` (a receiver never waits for another's start), and the attempt
//!   number fences a receiver that lost its lease.
//! - Every claim batch sends `NOTIFY sume_jobs` with its commit; each receiver LISTENs on a
//!   connection of its own and wakes its worker, so work claimed anywhere starts promptly.
//! - Lease take-back, retention and reconciliation polls are conditional updates or take their
//!   rows with `SKIP LOCKED`: each row is handled once however many receivers run them.
//! - Migrations run in one transaction under an advisory lock; a schema newer than this binary
//!   knows is refused.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::{DbError, Severity, SqlState};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, NoTls, Row, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

mod sql;

use super::model::{
    expectation_counts, unfinished_counts, Attempt, AttemptEnd, ClaimOutcome, DueExpectation,
    DueJobs, Expectation, JobDetail, JobStats, JobSummary, LeasedAttempt, Leases, NewClaim,
    PollResult, RetentionStep, RetryError, Source, State,
};
use super::{duration_ms, now_ms, Backend, Cause, StorageError};
use crate::config::{DatabaseConfig, PostgresUrl};
use crate::event_type::EventType;
use crate::job_id::JobId;
use crate::metrics::Snapshot;
use crate::throttle::Throttled;

/// Schema migrations, applied in order; the `sume_schema` table records how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_jobs.sql"),
    include_str!("../../../migrations/postgres/0002_expected_jobs.sql"),
    include_str!("../../../migrations/postgres/0003_leased_by.sql"),
];
/// The advisory lock that serialises migrations between receivers starting at once.
const MIGRATION_LOCK: i64 = 0x5355_4d45_0001;
/// The channel claims and `jobs retry` notify, and every receiver listens on.
const CHANNEL: &str = "sume_jobs";
/// Connections per receiver: the claim batches in flight, the worker's transitions, reads.
const POOL_SIZE: usize = 8;
/// Claims waiting for their batch; past it a delivery is refused at once (503).
const CLAIM_QUEUE_CAPACITY: usize = 1024;
/// Claim batches committing at once: while one waits for its commit the next fills up, and a
/// round trip to a remote server overlaps another batch's. More only split the same claims into
/// smaller batches competing for the server's CPU: on the 2-vCPU development VM (server on the
/// same machine) 1 / 2 / 4 / 8 in flight gave 27.1k / 24.4k / 21.0k / 15.9k deliveries/s on
/// the full path and 38.8k / 46.0k / 33.6k / 23.3k claims/s alone (C = 64).
const CLAIM_BATCHES_IN_FLIGHT: usize = 2;
/// How long a connection attempt may take before the operation fails (503 for a claim).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// After a failed commit, how often the database is probed until it answers again (readiness).
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a start waits for PostgreSQL to accept connections (a machine booting with its
/// database, a failover in progress) before it gives up; the unit's TimeoutStartSec is longer,
/// and systemd would otherwise give up after a few quick restarts.
const START_PATIENCE: Duration = Duration::from_secs(60);
/// How often a start tries again meanwhile.
const START_RETRY: Duration = Duration::from_millis(500);
/// After a lost LISTEN connection, how long before connecting again.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// A failed statement. A server error means PostgreSQL rolled the statement back, and a client
/// side error (a value that cannot be sent) means nothing was sent; but a connection lost
/// during the statement may have been lost after its commit reached the server.
fn statement_error(error: tokio_postgres::Error) -> StorageError {
    let connection_lost = error.is_closed()
        || std::error::Error::source(&error).is_some_and(|cause| cause.is::<std::io::Error>());
    if error.code().is_none() && connection_lost {
        StorageError::OutcomeUnknown(Cause::new(error))
    } else {
        StorageError::Unavailable(Cause::new(error))
    }
}

/// The error with its cause: tokio-postgres puts the server's message in the source.
fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn pool_error(error: deadpool_postgres::PoolError) -> StorageError {
    StorageError::Unavailable(Cause::new(error))
}

/// A claim for the batcher, or (`None`) the watchdog's probe, answered with the next batch.
type ClaimRequest = (
    Option<NewClaim>,
    oneshot::Sender<Result<ClaimOutcome, StorageError>>,
);

/// The open PostgreSQL ledger of a running receiver.
pub struct PostgresLedger {
    pool: Pool,
    /// The claim batcher's queue; `None` on the command line, which claims in place.
    claims: Option<mpsc::Sender<ClaimRequest>>,
    /// The claim batcher and the LISTEN task; awaited at close.
    tasks: Mutex<Option<JoinSet<()>>>,
    stopping: CancellationToken,
    last_commit_ok: Arc<AtomicBool>,
    /// Cancelled if the claim batcher died of a panic: nothing can be claimed any more.
    failed: CancellationToken,
    work_added: Arc<Notify>,
    location: String,
    /// This receiver's name on its leases (`database.receiver`).
    receiver: String,
}

impl PostgresLedger {
    /// Connects, checks the server's durability setting, migrates under the advisory lock, and
    /// starts the claim batcher and the LISTEN task.
    pub async fn open(url: &PostgresUrl, config: &DatabaseConfig) -> anyhow::Result<Self> {
        let pg_config = url.config(CONNECT_TIMEOUT);
        let location = url.location();
        let tls = Tls::new(url, config.ca_file.as_deref())?;
        let mut client = connect_at_start(&tls, &pg_config, &location).await?;
        let synchronous_commit = check_durability(&client, &location).await?;
        migrate(&mut client, &location).await?;
        drop(client);
        // Checked once, held on every connection: a later `ALTER ROLE ... SET
        // synchronous_commit = off` cannot reach a connection the pool opens afterwards.
        let mut pg_config = pg_config;
        let options = pg_config.get_options().unwrap_or_default();
        pg_config.options(format!("{options} -c synchronous_commit={synchronous_commit}").trim());

        let pool = Pool::builder(tls.manager(&pg_config))
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .context("cannot build the PostgreSQL connection pool")?;

        let (claims, inbox) = mpsc::channel(CLAIM_QUEUE_CAPACITY);
        let stopping = CancellationToken::new();
        let last_commit_ok = Arc::new(AtomicBool::new(true));
        let failed = CancellationToken::new();
        let work_added = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        let batcher = tokio::spawn(run_batcher(
            pool.clone(),
            inbox,
            config.max_batch,
            stopping.clone(),
            last_commit_ok.clone(),
        ));
        tasks.spawn({
            let failed = failed.clone();
            async move {
                if batcher.await.is_err() {
                    tracing::error!(
                        "the PostgreSQL claim batcher panicked; nothing can be claimed any more"
                    );
                    failed.cancel();
                }
            }
        });
        tasks.spawn(listen(pg_config, tls, work_added.clone(), stopping.clone()));
        tracing::info!(ledger = %location, "PostgreSQL ledger open");
        Ok(PostgresLedger {
            pool,
            claims: Some(claims),
            tasks: Mutex::new(Some(tasks)),
            stopping,
            last_commit_ok,
            failed,
            work_added,
            location,
            receiver: config.receiver.clone(),
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StorageError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// Runs a statement; returns its rows.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StorageError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(statement_error)?;
        client
            .query(&statement, params)
            .await
            .map_err(statement_error)
    }

    /// Runs a statement; returns how many rows it changed.
    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<usize, StorageError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(statement_error)?;
        let changed = client
            .execute(&statement, params)
            .await
            .map_err(statement_error)?;
        Ok(changed as usize)
    }

    /// Connects for the command line and checks that the schema is the one this binary knows
    /// (the service migrates it; the command line never does). No claim batcher, no LISTEN.
    pub async fn open_existing(url: &PostgresUrl, config: &DatabaseConfig) -> anyhow::Result<Self> {
        let location = url.location();
        let tls = Tls::new(url, config.ca_file.as_deref())?;
        let pg_config = url.config(CONNECT_TIMEOUT);
        let client = tls
            .connect(&pg_config)
            .await
            .map_err(|error| anyhow::anyhow!(error_text(&error)))
            .with_context(|| format!("cannot connect to PostgreSQL at {location}"))?;
        let version = client
            .query_opt("SELECT version FROM sume_schema", &[])
            .await
            .ok()
            .flatten()
            .map_or(0, |row| row.get::<_, i32>(0));
        if version as usize != MIGRATIONS.len() {
            bail!(
                "the ledger at {location} has schema version {version}, this binary expects {}: \
                 start the service once to create or migrate it, or use the matching \
                 sume-receiver",
                MIGRATIONS.len()
            );
        }
        drop(client);
        let pool = Pool::builder(tls.manager(&pg_config))
            .max_size(1)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .context("cannot build the PostgreSQL connection pool")?;
        Ok(PostgresLedger {
            pool,
            claims: None,
            tasks: Mutex::new(None),
            stopping: CancellationToken::new(),
            last_commit_ok: Arc::new(AtomicBool::new(true)),
            failed: CancellationToken::new(),
            work_added: Arc::new(Notify::new()),
            location,
            receiver: config.receiver.clone(),
        })
    }
}

impl Backend for PostgresLedger {
    async fn claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError> {
        let Some(claims) = &self.claims else {
            // The command line's ledger: a batch of one, in place.
            let job_id = claim.job_id.as_str().to_owned();
            let claimed = insert_claims(&self.pool, &[&claim])
                .await
                .map_err(ClaimsError::into_storage)?;
            return Ok(if claimed.contains(&job_id) {
                ClaimOutcome::Claimed
            } else {
                ClaimOutcome::Duplicate
            });
        };
        through_batcher(claims, Some(claim)).await
    }

    async fn start_attempt(
        &self,
        job_id: &JobId,
        now: i64,
        lease_expires_at: i64,
    ) -> Result<Option<Attempt>, StorageError> {
        let rows = self
            .query(
                sql::START_ATTEMPT_SQL,
                &[&job_id.as_str(), &lease_expires_at, &now, &self.receiver],
            )
            .await?;
        Ok(rows.first().map(|row| Attempt {
            job_id: job_id.clone(),
            number: row.get::<_, i32>(0).unsigned_abs(),
            event_type: row.get(1),
            source: Source::parse(row.get(2)),
            body: row.get(3),
        }))
    }

    async fn finish_attempt(
        &self,
        attempt: &Attempt,
        end: &AttemptEnd,
        now: i64,
    ) -> Result<Option<State>, StorageError> {
        let (state, error, retry_at) = end.outcome();
        let finished_at = state.is_finished().then_some(now);
        let changed = self
            .execute(
                sql::FINISH_ATTEMPT_SQL,
                &[
                    &attempt.job_id.as_str(),
                    &attempt_number(attempt),
                    &state.as_str(),
                    &error,
                    &retry_at,
                    &finished_at,
                    &now,
                ],
            )
            .await?;
        Ok((changed == 1).then_some(state))
    }

    async fn release_attempt(&self, attempt: &Attempt, now: i64) -> Result<bool, StorageError> {
        let changed = self
            .execute(
                sql::RELEASE_ATTEMPT_SQL,
                &[&attempt.job_id.as_str(), &attempt_number(attempt), &now],
            )
            .await?;
        Ok(changed == 1)
    }

    /// At start, the leases held under this receiver's name; other receivers' leases wait
    /// for their expiry.
    async fn leases_to_take_back(
        &self,
        leases: Leases,
    ) -> Result<Vec<LeasedAttempt>, StorageError> {
        let rows = match leases {
            Leases::ExpiredBefore(cutoff) => {
                self.query(sql::EXPIRED_LEASES_SQL, &[&cutoff]).await?
            }
            Leases::HeldBeforeThisStart => {
                self.query(sql::OWN_LEASES_SQL, &[&self.receiver]).await?
            }
        };
        Ok(rows
            .iter()
            .map(|row| LeasedAttempt {
                job_id: row.get(0),
                number: row.get::<_, i32>(1).into(),
            })
            .collect())
    }

    async fn take_back_lease(
        &self,
        lease: &LeasedAttempt,
        cutoff: i64,
        now: i64,
        max_attempts: u32,
        error: &str,
    ) -> Result<Option<State>, StorageError> {
        let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
        let number = i32::try_from(lease.number).unwrap_or(i32::MAX);
        let rows = self
            .query(
                sql::TAKE_BACK_LEASE_SQL,
                &[&lease.job_id, &now, &max_attempts, &error, &cutoff, &number],
            )
            .await?;
        Ok(rows
            .first()
            .map(|row| row.get::<_, &str>(0).parse().unwrap_or(State::Retrying)))
    }

    async fn due_jobs(&self, now: i64, limit: usize) -> Result<DueJobs, StorageError> {
        let rows = self
            .query(sql::DUE_JOBS_SQL, &[&now, &(limit as i64)])
            .await?;
        let next_at = self.query(sql::NEXT_DUE_SQL, &[]).await?;
        Ok(DueJobs::sort(
            rows.iter().map(|row| row.get(0)).collect(),
            next_at.first().and_then(|row| row.get(0)),
        ))
    }

    async fn give_up(&self, job_id: &str, error: &str, now: i64) -> Result<bool, StorageError> {
        let changed = self
            .execute(sql::GIVE_UP_SQL, &[&job_id, &now, &error])
            .await?;
        Ok(changed == 1)
    }

    /// Resolves when a claim batch or `jobs retry` notified the channel (any receiver's).
    async fn work_added_elsewhere(&self) {
        self.work_added.notified().await
    }

    async fn retention_step(
        &self,
        step: RetentionStep,
        before: i64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        let statement = match step {
            RetentionStep::PurgeBodies => sql::PURGE_BODIES_SQL,
            RetentionStep::DeleteFinished => sql::DELETE_FINISHED_SQL,
            RetentionStep::DeleteResolvedExpectations => sql::DELETE_RESOLVED_SQL,
        };
        self.execute(statement, &[&before, &(limit as i64)]).await
    }

    async fn expect_job(
        &self,
        job_id: &JobId,
        now: i64,
        first_poll_at: i64,
    ) -> Result<bool, StorageError> {
        let inserted = self
            .execute(
                sql::EXPECT_JOB_SQL,
                &[&job_id.as_str(), &now, &first_poll_at],
            )
            .await?;
        Ok(inserted == 1)
    }

    async fn resolve_arrived(&self, now: i64) -> Result<usize, StorageError> {
        self.execute(sql::RESOLVE_ARRIVED_SQL, &[&now]).await
    }

    /// Takes due expectations and moves their next poll `lease` ahead, so that no other
    /// receiver polls them meanwhile (and one does, if this receiver dies before recording).
    async fn due_expectations(
        &self,
        now: i64,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DueExpectation>, StorageError> {
        let leased_until = now + duration_ms(lease);
        let rows = self
            .query(
                sql::TAKE_DUE_EXPECTATIONS_SQL,
                &[&now, &(limit as i64), &leased_until],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| DueExpectation {
                job_id: row.get(0),
                expected_at: row.get(1),
                polls: row.get::<_, i32>(2).unsigned_abs(),
            })
            .collect())
    }

    async fn record_poll(
        &self,
        job_id: &str,
        result: &PollResult,
        now: i64,
    ) -> Result<(), StorageError> {
        let (state, status, error, next_poll_at, resolved_at) = result.columns(now);
        self.execute(
            sql::RECORD_POLL_SQL,
            &[
                &job_id,
                &state,
                &status,
                &error,
                &next_poll_at,
                &resolved_at,
            ],
        )
        .await
        .map(drop)
    }

    async fn metrics_snapshot(&self) -> Result<Snapshot, StorageError> {
        let unfinished = self.query(sql::COUNT_UNFINISHED_SQL, &[]).await?;
        let oldest = self.query(sql::OLDEST_UNFINISHED_SQL, &[]).await?;
        let expected = self.query(sql::COUNT_EXPECTATIONS_SQL, &[]).await?;
        let size = self
            .query("SELECT pg_database_size(current_database())", &[])
            .await?;
        let oldest: Option<i64> = oldest.first().and_then(|row| row.get(0));
        Ok(Snapshot {
            unfinished: unfinished_counts(state_counts(&unfinished))
                .into_iter()
                .map(|(state, count)| (state.as_str(), count))
                .collect(),
            oldest_unfinished_age_seconds: oldest
                .map_or(0.0, |at| (now_ms() - at).max(0) as f64 / 1000.0),
            expected: expectation_counts(state_counts(&expected)),
            ledger_bytes: size
                .first()
                .map_or(0, |row| row.get::<_, i64>(0).unsigned_abs()),
            wal_bytes: None,
            claim_queue_depth: self.claim_queue_depth() as u64,
        })
    }

    async fn count_finished(&self) -> Result<(u64, u64), StorageError> {
        let rows = self.query(sql::COUNT_FINISHED_SQL, &[]).await?;
        let row = rows
            .first()
            .ok_or_else(|| StorageError::Unavailable(Cause::message("count returned no row")))?;
        Ok((
            row.get::<_, i64>(0).unsigned_abs(),
            row.get::<_, i64>(1).unsigned_abs(),
        ))
    }

    /// Through the claim batcher, so that a wedged batcher fails the probe too.
    async fn probe(&self) -> Result<(), StorageError> {
        match &self.claims {
            Some(claims) => through_batcher(claims, None).await.map(drop),
            None => self.query("SELECT 1", &[]).await.map(drop),
        }
    }

    async fn failed(&self) {
        self.failed.cancelled().await
    }

    /// Commits every claim queued before this call, then stops the batcher and the listener.
    async fn close(&self) {
        self.stopping.cancel();
        let tasks = self.tasks.lock().expect("not poisoned").take();
        if let Some(mut tasks) = tasks {
            while tasks.join_next().await.is_some() {}
        }
        self.pool.close();
    }

    async fn list_jobs(
        &self,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<JobSummary>, StorageError> {
        let rows = self
            .query(
                sql::LIST_JOBS_SQL,
                &[&state.map(State::as_str), &(limit as i64)],
            )
            .await?;
        Ok(rows.iter().map(summary_from_row).collect())
    }

    async fn show_job(&self, job_id: &str) -> Result<Option<JobDetail>, StorageError> {
        let rows = self.query(sql::SHOW_JOB_SQL, &[&job_id]).await?;
        Ok(rows.first().map(|row| JobDetail {
            summary: summary_from_row(row),
            lease_expires_at: row.get(9),
            updated_at: row.get(10),
            body: row.get(11),
        }))
    }

    async fn retry_job(&self, job_id: &str, now: i64) -> Result<(), RetryError> {
        if self.execute(sql::RETRY_JOB_SQL, &[&job_id, &now]).await? == 1 {
            self.execute(&format!("NOTIFY {CHANNEL}"), &[]).await?;
            return Ok(());
        }
        let found = self.query(sql::RETRY_REFUSAL_SQL, &[&job_id]).await?;
        Err(RetryError::refusal(
            job_id,
            found.first().map(|row| (row.get(0), row.get(1))),
        ))
    }

    async fn job_stats(&self, now: i64) -> Result<JobStats, StorageError> {
        let by_state = self.query(sql::COUNT_BY_STATE_SQL, &[]).await?;
        let (hour_ago, day_ago) = JobStats::since(now);
        let counts = self.query(sql::STATS_SQL, &[&hour_ago, &day_ago]).await?;
        let row = counts
            .first()
            .ok_or_else(|| StorageError::Unavailable(Cause::message("stats returned no row")))?;
        Ok(JobStats::from_counts(
            state_counts(&by_state),
            (row.get(0), row.get(1), row.get(2)),
        ))
    }

    async fn job_ids_like(&self, pattern: &str) -> Result<Vec<String>, StorageError> {
        let rows = self.query(sql::JOB_IDS_LIKE_SQL, &[&pattern]).await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    async fn list_expectations(&self, limit: usize) -> Result<Vec<Expectation>, StorageError> {
        let rows = self
            .query(sql::LIST_EXPECTATIONS_SQL, &[&(limit as i64)])
            .await?;
        Ok(rows
            .iter()
            .map(|row| Expectation {
                job_id: row.get(0),
                state: row.get(1),
                expected_at: row.get(2),
                next_poll_at: row.get(3),
                polls: row.get::<_, i32>(4).unsigned_abs(),
                last_status: row.get(5),
                last_error: row.get(6),
            })
            .collect())
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn claim_queue_depth(&self) -> usize {
        self.claims
            .as_ref()
            .map_or(0, |claims| CLAIM_QUEUE_CAPACITY - claims.capacity())
    }

    fn readiness(&self) -> Result<(), &'static str> {
        if self.failed.is_cancelled() {
            return Err("the ledger's claim batcher has stopped");
        }
        if !self.last_commit_ok.load(Ordering::Relaxed) {
            return Err("PostgreSQL did not take the last claims (probed every second)");
        }
        if self.claim_queue_depth() * 10 >= CLAIM_QUEUE_CAPACITY * 9 {
            return Err("the ledger's claim queue is nearly full");
        }
        Ok(())
    }
}

/// Queues a claim (or the probe) for the batcher and waits for its batch; refused at once when
/// the queue is full.
async fn through_batcher(
    claims: &mpsc::Sender<ClaimRequest>,
    claim: Option<NewClaim>,
) -> Result<ClaimOutcome, StorageError> {
    let (reply, answer) = oneshot::channel();
    claims
        .try_send((claim, reply))
        .map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => StorageError::Overloaded,
            mpsc::error::TrySendError::Closed(_) => StorageError::Closed,
        })?;
    answer.await.map_err(|_| StorageError::Closed)?
}

fn attempt_number(attempt: &Attempt) -> i32 {
    i32::try_from(attempt.number).unwrap_or(i32::MAX)
}

/// (state, count) rows of a `GROUP BY state` count.
fn state_counts(rows: &[Row]) -> Vec<(String, i64)> {
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// The first connection of a start: tried again while PostgreSQL is not there yet (refused,
/// unreachable, starting up, shutting down) for up to [`START_PATIENCE`]; any other failure
/// (authentication, TLS, no such database) ends the start at once.
async fn connect_at_start(
    tls: &Tls,
    pg_config: &tokio_postgres::Config,
    location: &str,
) -> anyhow::Result<Client> {
    let started = std::time::Instant::now();
    let mut waiting = false;
    loop {
        match tls.connect(pg_config).await {
            Ok(client) => {
                if waiting {
                    tracing::info!(ledger = %location, waited_ms = started.elapsed().as_millis() as u64, "PostgreSQL accepts connections");
                }
                return Ok(client);
            }
            Err(error) if not_there_yet(&error) && started.elapsed() < START_PATIENCE => {
                if !waiting {
                    tracing::warn!(ledger = %location, error = %error_text(&error), patience = ?START_PATIENCE, "PostgreSQL does not accept connections yet; trying again");
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(
                        "waiting for PostgreSQL",
                    )]);
                    waiting = true;
                }
                tokio::time::sleep(START_RETRY).await;
            }
            Err(error) => {
                return Err(anyhow::anyhow!(error_text(&error)))
                    .with_context(|| format!("cannot connect to PostgreSQL at {location}"))
            }
        }
    }
}

/// Whether a failed connection means the server is not (yet) there, as opposed to refusing us.
fn not_there_yet(error: &tokio_postgres::Error) -> bool {
    if let Some(code) = error.code() {
        // Class 57: operator intervention (starting up, shutting down); 08: connection
        // exception.
        return code.code().starts_with("57") || code.code().starts_with("08");
    }
    // Closed by the other end before it said anything: a server (or proxy) still starting.
    if error.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            // A TLS failure arrives as an I/O error too: that is no reason to wait.
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return false;
            }
            use std::io::ErrorKind::*;
            return matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | NotConnected
                    | TimedOut
                    | UnexpectedEof
                    | BrokenPipe
                    | HostUnreachable
                    | NetworkUnreachable
                    | AddrNotAvailable
            );
        }
        source = cause.source();
    }
    false
}

/// Refuses a server that could lose a claim it reported committed (`fsync = off`, or
/// `synchronous_commit = off` for our role), warns on `full_page_writes = off` (a torn page
/// after a power loss can damage the table). Returns the `synchronous_commit` in force, which
/// every connection then holds.
async fn check_durability(
    client: &tokio_postgres::Client,
    location: &str,
) -> anyhow::Result<String> {
    let setting = |name: &'static str| async move {
        let row = client
            .query_one(&format!("SHOW {name}"), &[])
            .await
            .map_err(|error| anyhow::anyhow!(error_text(&error)))?;
        anyhow::Ok(row.get::<_, String>(0))
    };
    if setting("fsync").await? == "off" {
        bail!(
            "PostgreSQL at {location} runs with fsync = off: it reports commits that a power \
             loss or an OS crash can take back, so a claim answered 2xx could be lost. \
             sume-receiver refuses it: set fsync = on in postgresql.conf and reload"
        );
    }
    if setting("full_page_writes").await? == "off" {
        tracing::warn!(ledger = %location, "PostgreSQL runs with full_page_writes = off: unless the file system never tears a page (ZFS), a power loss can damage the jobs table");
    }
    let synchronous_commit = setting("synchronous_commit").await?;
    if synchronous_commit == "off" {
        bail!(
            "PostgreSQL at {location} has synchronous_commit = off: a claim could be answered \
             2xx and then lost in a crash. sume-receiver requires on, local, remote_write or \
             remote_apply (with a standby and failover: on or remote_apply, and the standby in \
             synchronous_standby_names). Set it for our role or database: \
             ALTER ROLE ... SET synchronous_commit = on"
        );
    }
    Ok(synchronous_commit)
}

/// Applies the missing migrations in one transaction, under the advisory lock that makes
/// receivers starting at once take turns.
async fn migrate(client: &mut tokio_postgres::Client, location: &str) -> anyhow::Result<()> {
    let postgres = |error: tokio_postgres::Error| anyhow::anyhow!(error_text(&error));
    let tx = client.transaction().await.map_err(postgres)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(postgres)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS sume_schema (
             version integer NOT NULL,
             -- one row only
             single boolean PRIMARY KEY DEFAULT true CHECK (single)
         )",
    )
    .await
    .map_err(postgres)?;
    let version = tx
        .query_opt("SELECT version FROM sume_schema", &[])
        .await
        .map_err(postgres)?
        .map_or(0, |row| row.get::<_, i32>(0));
    let version = usize::try_from(version).unwrap_or(0);
    if version > MIGRATIONS.len() {
        bail!(
            "the ledger at {location} has schema version {version}, newer than this binary \
             knows ({}); refusing to touch it: upgrade sume-receiver",
            MIGRATIONS.len()
        );
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        tx.batch_execute(sql)
            .await
            .map_err(postgres)
            .with_context(|| {
                format!(
                    "migration {} failed on {location} (does database.url name a database \
                     another application uses? give sume-receiver a database of its own)",
                    index + 1
                )
            })?;
        tracing::info!(version = index + 1, "applied schema migration");
    }
    // A start that finds the schema current writes nothing (its commit waits for no standby).
    if version < MIGRATIONS.len() {
        let latest = MIGRATIONS.len() as i32;
        tx.execute(
            "INSERT INTO sume_schema (version) VALUES ($1)
             ON CONFLICT (single) DO UPDATE SET version = excluded.version",
            &[&latest],
        )
        .await
        .map_err(postgres)?;
    }
    tx.commit().await.map_err(postgres)?;
    Ok(())
}

/// Groups queued claims into batches and commits them; answers each claim after its batch.
async fn run_batcher(
    pool: Pool,
    mut inbox: mpsc::Receiver<ClaimRequest>,
    max_batch: usize,
    stopping: CancellationToken,
    last_commit_ok: Arc<AtomicBool>,
) {
    let in_flight = Arc::new(Semaphore::new(CLAIM_BATCHES_IN_FLIGHT));
    let mut batches = JoinSet::new();
    let failures = Arc::new(Mutex::new(Throttled::new("claims failed")));
    loop {
        let first = tokio::select! {
            item = inbox.recv() => item,
            () = stopping.cancelled() => None,
            () = tokio::time::sleep(PROBE_INTERVAL), if !last_commit_ok.load(Ordering::Relaxed) => {
                probe(&pool, &last_commit_ok).await;
                continue;
            }
        };
        let Some(first) = first else { break };
        // Waiting for a free slot is when the next batch fills up.
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match inbox.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (pool, ok, failures) = (pool.clone(), last_commit_ok.clone(), failures.clone());
        batches.spawn(async move {
            commit_batch(&pool, batch, &ok, &failures).await;
            drop(permit);
        });
        while batches.try_join_next().is_some() {}
    }
    // Stopping: everything queued before the stop still gets its answer.
    inbox.close();
    let mut rest = Vec::new();
    while let Ok(item) = inbox.try_recv() {
        rest.push(item);
    }
    while !rest.is_empty() {
        let batch: Vec<ClaimRequest> = rest.drain(..rest.len().min(max_batch.max(1))).collect();
        commit_batch(&pool, batch, &last_commit_ok, &failures).await;
    }
    while batches.join_next().await.is_some() {}
    tracing::debug!("claim batcher stopped");
}

/// Once the database answers again, readiness says so (no claim may arrive while not ready).
async fn probe(pool: &Pool, last_commit_ok: &AtomicBool) {
    if let Ok(client) = pool.get().await {
        if client.simple_query("SELECT 1").await.is_ok() {
            tracing::info!("PostgreSQL answers again");
            last_commit_ok.store(true, Ordering::Relaxed);
        }
    }
}

async fn commit_batch(
    pool: &Pool,
    batch: Vec<ClaimRequest>,
    last_commit_ok: &AtomicBool,
    failures: &Mutex<Throttled>,
) {
    let mut ordered: Vec<&NewClaim> = batch
        .iter()
        .filter_map(|(claim, _)| claim.as_ref())
        .collect();
    let size = ordered.len();
    ordered.sort_by(|a, b| a.job_id.as_str().cmp(b.job_id.as_str()));
    ordered.dedup_by(|a, b| a.job_id == b.job_id);
    let mut result = if ordered.is_empty() {
        // Probes only: a statement on a pooled connection, as a batch's.
        select_one(pool).await
    } else {
        insert_claims(pool, &ordered).await
    };
    // Claims PostgreSQL refused alone, with why.
    let mut refused = std::collections::HashMap::new();
    if let (Err(ClaimsError::RowRefused(_)), true) = (&result, ordered.len() > 1) {
        // One row PostgreSQL would not take fails the statement: the others are claimed one
        // by one, so that only the bad one is refused.
        let mut claimed = std::collections::HashSet::new();
        for claim in &ordered {
            match insert_claims(pool, std::slice::from_ref(claim)).await {
                Ok(new) => claimed.extend(new),
                Err(error) => {
                    refused.insert(claim.job_id.as_str().to_owned(), error.into_storage());
                }
            }
        }
        result = Ok(claimed);
    }
    let result = result.map_err(ClaimsError::into_storage);
    match &result {
        Ok(_) => {
            last_commit_ok.store(true, Ordering::Relaxed);
            failures.lock().expect("not poisoned").recovered();
        }
        Err(error) => {
            last_commit_ok.store(false, Ordering::Relaxed);
            failures
                .lock()
                .expect("not poisoned")
                .warn(&format!("{error} (batch of {size})"));
        }
    }
    if size > 0 {
        crate::metrics::METRICS.record_commit(size, result.is_ok());
    }
    // The first request for each new job_id is its claim; every other one a duplicate.
    let mut claimed = match result {
        Ok(claimed) => claimed,
        Err(error) => {
            for (_, reply) in batch {
                let _ = reply.send(Err(error.clone()));
            }
            return;
        }
    };
    for (claim, reply) in batch {
        let Some(claim) = claim else {
            // The probe: the batch went through.
            let _ = reply.send(Ok(ClaimOutcome::Duplicate));
            continue;
        };
        let outcome = if let Some(error) = refused.get(claim.job_id.as_str()) {
            Err(error.clone())
        } else if claimed.remove(claim.job_id.as_str()) {
            Ok(ClaimOutcome::Claimed)
        } else {
            Ok(ClaimOutcome::Duplicate)
        };
        let _ = reply.send(outcome);
    }
}

/// Why a batch of claims was not taken.
enum ClaimsError {
    /// PostgreSQL refused a value of some row (a data exception or a constraint): the statement
    /// failed whole, and the rows may be tried alone.
    RowRefused(StorageError),
    Other(StorageError),
}

impl ClaimsError {
    fn into_storage(self) -> StorageError {
        match self {
            ClaimsError::RowRefused(error) | ClaimsError::Other(error) => error,
        }
    }
}

impl From<StorageError> for ClaimsError {
    fn from(error: StorageError) -> Self {
        ClaimsError::Other(error)
    }
}

fn claims_error(error: tokio_postgres::Error) -> ClaimsError {
    let class = error.code().map(|code| &code.code()[..2]);
    let refused = matches!(class, Some("22" | "23"));
    let error = statement_error(error);
    if refused {
        ClaimsError::RowRefused(error)
    } else {
        ClaimsError::Other(error)
    }
}

async fn select_one(pool: &Pool) -> Result<std::collections::HashSet<String>, ClaimsError> {
    let client = pool.get().await.map_err(pool_error)?;
    client
        .simple_query("SELECT 1")
        .await
        .map_err(statement_error)?;
    Ok(std::collections::HashSet::new())
}

/// Inserts the claims in one statement; returns the job_ids that were new. A wait for the
/// synchronous standby cancelled meanwhile (see [`CANCELLED_STANDBY_WAITS`]) makes the outcome
/// unknown, although PostgreSQL reported success.
async fn insert_claims(
    pool: &Pool,
    claims: &[&NewClaim],
) -> Result<std::collections::HashSet<String>, ClaimsError> {
    let client = pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(sql::INSERT_CLAIMS_SQL)
        .await
        .map_err(statement_error)?;
    let cancelled_waits = CANCELLED_STANDBY_WAITS.load(Ordering::SeqCst);
    let job_ids: Vec<&str> = claims.iter().map(|c| c.job_id.as_str()).collect();
    let sources: Vec<&str> = claims.iter().map(|c| c.source.as_str()).collect();
    let event_types: Vec<Option<&str>> = claims
        .iter()
        .map(|c| c.event_type.as_ref().map(EventType::as_str))
        .collect();
    let bodies: Vec<&str> = claims.iter().map(|c| c.body.as_str()).collect();
    let rows = client
        .query(
            &statement,
            &[&job_ids, &sources, &event_types, &bodies, &now_ms()],
        )
        .await
        .map_err(claims_error)?;
    if CANCELLED_STANDBY_WAITS.load(Ordering::SeqCst) != cancelled_waits {
        return Err(StorageError::OutcomeUnknown(Cause::message(
            "PostgreSQL cancelled the wait for the synchronous standby: committed locally, \
             perhaps not replicated",
        ))
        .into());
    }
    Ok(rows.iter().filter_map(|row| row.get(0)).collect())
}

/// Waits for the synchronous standby that PostgreSQL cancelled (`pg_cancel_backend`, a "kill
/// long queries" script) on any pooled connection. PostgreSQL then reports the commit as done,
/// saying only in a WARNING that the standby may not have it; the notice reaches the
/// connection's task before the statement's answer reaches the caller. Counted across the
/// pool: another connection's cancel during a claim costs that claim a needless 503 (Sume
/// retries), never a false 200.
static CANCELLED_STANDBY_WAITS: AtomicU64 = AtomicU64::new(0);

/// The cancel's WARNING has no SQLSTATE of its own (01000) and a translated text, so every
/// warning counts; the termination's carries ADMIN_SHUTDOWN. A claim raises no other warning.
fn note_notice(notice: &DbError) {
    let warning = notice.parsed_severity() == Some(Severity::Warning)
        || notice.code().code().starts_with("01");
    if warning || notice.code() == &SqlState::ADMIN_SHUTDOWN {
        CANCELLED_STANDBY_WAITS.fetch_add(1, Ordering::SeqCst);
        tracing::warn!(notice = %notice, "PostgreSQL warned during a statement (a cancelled wait for the synchronous standby?): claims committed meanwhile are answered 503");
    }
}

/// How the pool connects: as deadpool does, but the connection's task reads its notices.
struct WatchingConnect<T> {
    tls: T,
}

impl<T> deadpool_postgres::Connect for WatchingConnect<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> Pin<
        Box<
            dyn Future<
                    Output = Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
                > + Send
                + '_,
        >,
    > {
        let (tls, pg_config) = (self.tls.clone(), pg_config.clone());
        Box::pin(async move {
            let (client, mut connection) = pg_config.connect(tls).await?;
            let task = tokio::spawn(async move {
                while let Some(message) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    match message {
                        Ok(AsyncMessage::Notice(notice)) => note_notice(&notice),
                        Ok(_) => {}
                        Err(error) => {
                            tracing::debug!(%error, "PostgreSQL connection ended");
                            break;
                        }
                    }
                }
            });
            Ok((client, task))
        })
    }
}

/// Listens for claims of every receiver on a connection of its own; wakes the worker for each
/// notification, and once after every (re)connection, since some may have been missed.
async fn listen(
    pg_config: tokio_postgres::Config,
    tls: Tls,
    work_added: Arc<Notify>,
    stopping: CancellationToken,
) {
    let mut failures = Throttled::new("cannot listen for new work on PostgreSQL; retrying");
    loop {
        let listening = async {
            match &tls {
                Tls::Off => listen_until_lost(&pg_config, NoTls, &work_added).await,
                Tls::Verified(connector) => {
                    listen_until_lost(&pg_config, connector.clone(), &work_added).await
                }
            }
        };
        tokio::select! {
            result = listening => {
                if let Err(error) = result {
                    failures.warn(&error_text(&error));
                }
            }
            () = stopping.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(LISTEN_RETRY) => {}
            () = stopping.cancelled() => return,
        }
    }
}

/// One LISTEN connection, until it is lost: each notification wakes the worker, and so does
/// the start (notifications sent while no connection listened are lost).
async fn listen_until_lost<T>(
    pg_config: &tokio_postgres::Config,
    tls: T,
    work_added: &Arc<Notify>,
) -> Result<(), tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = pg_config.connect(tls).await?;
    let wake = work_added.clone();
    let messages = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                Ok(_) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    work_added.notify_one();
    let ended = messages.await;
    drop(client);
    ended.unwrap_or(Ok(()))
}

/// How connections to PostgreSQL are made: in the clear, or over TLS when the URL asks for it
/// (`sslmode=require`), the server's certificate and host name verified against the system's
/// CA certificates and `database.ca_file`.
#[derive(Clone)]
enum Tls {
    Off,
    Verified(MakeRustlsConnect),
}

impl Tls {
    fn new(url: &PostgresUrl, ca_file: Option<&std::path::Path>) -> anyhow::Result<Tls> {
        let config = url.config(CONNECT_TIMEOUT);
        if config.get_ssl_mode() != SslMode::Require {
            if !url.is_local() {
                tracing::warn!(ledger = %url.location(), "the connection to PostgreSQL is not encrypted: add sslmode=require to database.url");
            }
            return Ok(Tls::Off);
        }
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(file) = ca_file {
            use rustls::pki_types::pem::PemObject;
            let certificates = rustls::pki_types::CertificateDer::pem_file_iter(file)
                .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
                .with_context(|| {
                    format!(
                        "database.ca_file: cannot read PEM certificates from {}",
                        file.display()
                    )
                })?;
            if certificates.is_empty() {
                bail!("database.ca_file: no certificate in {}", file.display());
            }
            for certificate in certificates {
                roots.add(certificate).with_context(|| {
                    format!(
                        "database.ca_file: a certificate in {} is not usable",
                        file.display()
                    )
                })?;
            }
        }
        if roots.is_empty() {
            bail!("sslmode=require, but there is no CA certificate to verify PostgreSQL's with: install the system's (ca-certificates) or set database.ca_file");
        }
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::Verified(MakeRustlsConnect::new(client)))
    }

    /// Connects; the connection runs on a task of its own until the client is dropped.
    async fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> Result<Client, tokio_postgres::Error> {
        async fn spawned<T>(
            config: &tokio_postgres::Config,
            tls: T,
        ) -> Result<Client, tokio_postgres::Error>
        where
            T: MakeTlsConnect<Socket>,
            T::Stream: Send + 'static,
        {
            let (client, connection) = config.connect(tls).await?;
            tokio::spawn(connection);
            Ok(client)
        }
        match self {
            Tls::Off => spawned(config, NoTls).await,
            Tls::Verified(connector) => spawned(config, connector.clone()).await,
        }
    }

    fn manager(&self, config: &tokio_postgres::Config) -> Manager {
        let recycling = || ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        match self {
            Tls::Off => {
                Manager::from_connect(config.clone(), WatchingConnect { tls: NoTls }, recycling())
            }
            Tls::Verified(connector) => Manager::from_connect(
                config.clone(),
                WatchingConnect {
                    tls: connector.clone(),
                },
                recycling(),
            ),
        }
    }
}

fn summary_from_row(row: &Row) -> JobSummary {
    JobSummary {
        job_id: row.get(0),
        state: row.get(1),
        source: row.get(2),
        event_type: row.get(3),
        attempts: row.get::<_, i32>(4).unsigned_abs(),
        received_at: row.get(5),
        next_attempt_at: row.get(6),
        finished_at: row.get(7),
        last_error: row.get(8),
    }
}
