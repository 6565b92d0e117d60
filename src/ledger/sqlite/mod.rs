//! The SQLite ledger: opening with pragmas, schema migrations, the writer thread and the reader pool.

mod backup;
mod checkpoint;
mod errors;
mod expected;
mod failure;
mod history;
mod hold;
mod integrity;
mod jobs;
mod open;
mod rollups;
#[cfg(feature = "testing")]
mod testing;
mod wal_sync;
mod wal_watch;
mod write_lock;
mod writer;
#[cfg(feature = "bench")]
mod writer_alone;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags};

use super::contract::Backend;
use super::error::StorageError;
use super::model::now_ms;
use super::model::{
    Attempt, AttemptEnd, ClaimOutcome, Cursor, Dispatch, DispatchStop, DueExpectation, DueJobs,
    Expectation, Hold, JobDetail, JobPage, JobStats, LeasedAttempt, Leases, NewClaim, PollResult,
    Release, RetentionStep, RetryCount, RetryError, RetryFilter, State, RECEIVER_ACTOR,
};
use super::params::{ActionTaken, Actor, ProbeMove};
use super::portable_sql::Dialect;
use super::rollups::{delete_old_sql, MinuteRollup};
use crate::config::SqliteConfig;
use crate::job_id::JobId;
use crate::metrics::Snapshot;
use crate::route_name::RouteName;

pub use backup::{backup, BackupReport};
use checkpoint::Checkpointer;
pub use expected::{DELETE_RESOLVED_SQL, DUE_EXPECTATIONS_SQL};
use failure::Cause as FailureCause;
use failure::Failure;
pub use history::{ACTIONS_OF_JOB_SQL, ATTEMPTS_OF_JOB_SQL};
pub use hold::DELETE_ENDED_STOPS_SQL;
#[cfg(feature = "testing")]
pub use integrity::damage_for_test;
use integrity::BackgroundCheck;
pub use jobs::{
    insert_claim, COUNT_RETRY_MATCHING_SQL, DELETE_FINISHED_SQL, DUE_JOBS_SQL, EXPIRED_LEASES_SQL,
    NEXT_DUE_ON_ROUTE_SQL, NEXT_DUE_SQL, PURGE_BODIES_SQL, RETRY_MATCHING_SQL,
};
use open::{apply_pragmas, open_connection, open_existing_connection, open_for_writing};
use wal_watch::WalWatch;
use writer::Writer;
pub use writer::QUEUE_CAPACITY;
#[cfg(feature = "bench")]
pub use writer_alone::{PendingClaims, WriterAlone};

const READER_POOL_SIZE: u32 = 4;
/// A read of the service's (a console page, a scrape, the worker's look for due work) is
/// interrupted past this: none takes more than milliseconds on an indexed ledger, and a reader
/// that ran on would pin the WAL and hold one of the few pooled connections.
const READ_BUDGET: Duration = Duration::from_secs(5);
/// How many SQLite VM steps between two looks at the clock during a read.
const READ_BUDGET_STEPS: std::os::raw::c_int = 10_000;

/// The open SQLite ledger: the service's (one writer thread for every change, a pool for
/// reads), or the command line's (one connection).
pub struct SqliteLedger {
    connections: Connections,
    path: PathBuf,
    /// [`READ_BUDGET`] in ms (tests shorten it).
    read_budget_ms: std::sync::atomic::AtomicU64,
}

enum Connections {
    Service {
        writer: Writer,
        readers: r2d2::Pool<SqliteConnectionManager>,
        writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
        checkpointer: Mutex<Option<Checkpointer>>,
        /// The whole-file check, while it runs after the start (integrity.rs).
        check: Mutex<Option<BackgroundCheck>>,
        /// Other processes' writes (wal_watch.rs); `None` outside a tokio runtime, or where
        /// inotify is not available.
        wal_watch: Option<WalWatch>,
    },
    /// The command line's: each change a transaction of its own (a running service's writer
    /// waits for it, up to `busy_timeout`).
    Direct(Arc<Mutex<Connection>>),
}

fn default_read_budget() -> std::sync::atomic::AtomicU64 {
    u64::try_from(READ_BUDGET.as_millis())
        .unwrap_or(u64::MAX)
        .into()
}

impl SqliteLedger {
    /// Creates the file if needed, checks that it is ours (and whole: now, or in the
    /// background, integrity.rs), migrates it, and starts the writer thread.
    pub fn open(config: &SqliteConfig) -> anyhow::Result<SqliteLedger> {
        let check_later = config.check_at_start != crate::config::CheckAtStart::Off
            && !integrity::check_before_serving(config);
        let (conn, durability) = open_for_writing(config)?;
        let settings = config.clone();
        let readers = r2d2::Pool::builder()
            .max_size(READER_POOL_SIZE)
            .build(
                SqliteConnectionManager::file(&config.path)
                    // Readers never write: SQLite refuses it if one tried.
                    .with_init(move |conn| {
                        apply_pragmas(conn, &settings)?;
                        conn.execute_batch("PRAGMA query_only = ON")
                    }),
            )
            .context("cannot open the reader pool")?;
        let failure = Arc::new(Failure::default());
        let checkpointer = Checkpointer::start(
            open_connection(&config.path, config, OpenFlags::default())?,
            failure.clone(),
        )?;
        let wake = checkpointer.wake();
        let check = check_later
            .then(|| BackgroundCheck::start(config, failure.clone()))
            .transpose()
            .context("cannot start the ledger check")?;
        let (writer, thread) =
            Writer::start(conn, config.max_batch, durability, failure, move || {
                wake.committed()
            })?;
        let wal_watch = tokio::runtime::Handle::try_current().ok().and_then(|_| {
            WalWatch::start(&config.path)
                .inspect_err(|error| {
                    tracing::warn!(%error, "cannot watch the ledger's WAL: an idle worker looks in the ledger every second")
                })
                .ok()
        });
        Ok(SqliteLedger {
            connections: Connections::Service {
                writer,
                readers,
                writer_thread: Mutex::new(Some(thread)),
                checkpointer: Mutex::new(Some(checkpointer)),
                check: Mutex::new(check),
                wal_watch,
            },
            path: config.path.clone(),
            read_budget_ms: default_read_budget(),
        })
    }

    /// Opens an existing, migrated ledger for the command line; refuses to create one or to use
    /// one that is not migrated.
    pub fn open_existing(config: &SqliteConfig) -> anyhow::Result<SqliteLedger> {
        Ok(SqliteLedger {
            connections: Connections::Direct(Arc::new(Mutex::new(open_existing_connection(
                config,
            )?))),
            path: config.path.clone(),
            read_budget_ms: default_read_budget(),
        })
    }

    /// Runs `op` inside a transaction: the service's on the writer thread (group commit, where
    /// `op` may run twice: see writer/mod.rs), resolved once committed and durable.
    async fn write<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        match &self.connections {
            Connections::Service { writer, .. } => writer.submit(op).await,
            Connections::Direct(conn) => {
                let conn = conn.clone();
                tokio::task::spawn_blocking(move || {
                    let mut conn = conn.lock().expect("not poisoned");
                    let transaction =
                        conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                    let value = op(&transaction)?;
                    transaction.commit()?;
                    Ok(value)
                })
                .await
                .map_err(|_| StorageError::Closed)?
            }
        }
    }

    /// Runs `op` on a read connection, off the async runtime.
    async fn read<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        match &self.connections {
            Connections::Service { readers, .. } => {
                let pool = readers.clone();
                let budget = Duration::from_millis(
                    self.read_budget_ms
                        .load(std::sync::atomic::Ordering::Relaxed),
                );
                tokio::task::spawn_blocking(move || {
                    let conn = pool.get()?;
                    let started = std::time::Instant::now();
                    conn.progress_handler(
                        READ_BUDGET_STEPS,
                        Some(move || started.elapsed() > budget),
                    )?;
                    let read = op(&conn);
                    conn.progress_handler(0, None::<fn() -> bool>)?;
                    Ok(read?)
                })
                .await
                .map_err(|_| StorageError::Closed)?
            }
            Connections::Direct(conn) => {
                let conn = conn.clone();
                tokio::task::spawn_blocking(move || Ok(op(&conn.lock().expect("not poisoned"))?))
                    .await
                    .map_err(|_| StorageError::Closed)?
            }
        }
    }

    /// The WAL watch, while it works.
    fn wal_watch(&self) -> Option<&WalWatch> {
        match &self.connections {
            Connections::Service { wal_watch, .. } => {
                wal_watch.as_ref().filter(|watch| watch.is_working())
            }
            Connections::Direct(_) => None,
        }
    }

    fn writer(&self) -> Option<&Writer> {
        match &self.connections {
            Connections::Service { writer, .. } => Some(writer),
            Connections::Direct(_) => None,
        }
    }

    /// Stops the writer thread after it has committed everything queued before this call.
    pub fn stop(&self) {
        let Connections::Service {
            writer,
            writer_thread,
            checkpointer,
            check,
            ..
        } = &self.connections
        else {
            return;
        };
        if let Some(check) = check.lock().expect("not poisoned").take() {
            check.stop();
        }
        writer.stop();
        if let Some(thread) = writer_thread.lock().expect("not poisoned").take() {
            let _ = thread.join();
        }
        if let Some(checkpointer) = checkpointer.lock().expect("not poisoned").take() {
            checkpointer.stop();
        }
    }

    /// Why the ledger failed, once it has.
    fn failure_cause(&self) -> Option<FailureCause> {
        self.writer()?.failure().cause()
    }
}

impl Backend for SqliteLedger {
    /// Refused at once with [`StorageError::Overloaded`] when the writer's queue is full, so
    /// that the delivery is answered 503 instead of waiting.
    async fn claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError> {
        match self.writer() {
            Some(writer) => writer.try_claim(claim).await,
            // The command line's ledger, without a writer thread: boxed, so that this rare
            // path's future does not size (and every delivery copy) the claim's.
            None => {
                Box::pin(self.write(move |conn| jobs::insert_claim(conn, &claim, now_ms()))).await
            }
        }
    }

    async fn start_attempt(
        &self,
        job_id: &JobId,
        route: &RouteName,
        now: i64,
        lease_expires_at: i64,
    ) -> Result<Option<Attempt>, StorageError> {
        let (job_id, route) = (job_id.clone(), route.clone());
        self.write(move |conn| jobs::start_attempt(conn, &job_id, &route, now, lease_expires_at))
            .await
    }

    async fn finish_attempt(
        &self,
        attempt: &Attempt,
        end: &AttemptEnd,
        now: i64,
    ) -> Result<Option<State>, StorageError> {
        let (attempt, end) = (attempt.clone(), end.clone());
        self.write(move |conn| jobs::finish_attempt(conn, &attempt, &end, now))
            .await
    }

    async fn release_attempt(
        &self,
        attempt: &Attempt,
        release: &Release,
        now: i64,
    ) -> Result<bool, StorageError> {
        let (attempt, release) = (attempt.clone(), release.clone());
        self.write(move |conn| jobs::release_attempt(conn, &attempt, &release, now))
            .await
    }

    /// No other process can hold a lease on this file: at start, every one is ours.
    async fn leases_to_take_back(
        &self,
        leases: Leases,
    ) -> Result<Vec<LeasedAttempt>, StorageError> {
        let cutoff = match leases {
            Leases::ExpiredBefore(cutoff) => cutoff,
            Leases::HeldBeforeThisStart => i64::MAX,
        };
        self.read(move |conn| jobs::expired_leases(conn, cutoff))
            .await
    }

    async fn take_back_lease(
        &self,
        lease: &LeasedAttempt,
        cutoff: i64,
        now: i64,
        max_attempts: u32,
        error: &str,
    ) -> Result<Option<State>, StorageError> {
        let (lease, error) = (lease.clone(), error.to_owned());
        self.write(move |conn| {
            jobs::take_back_lease(conn, &lease, cutoff, now, max_attempts, &error)
        })
        .await
    }

    /// Another process's commit (`jobs retry`), seen on the WAL file (wal_watch.rs).
    async fn work_added_elsewhere(&self) {
        match self.wal_watch() {
            Some(watch) => watch.changed().await,
            None => std::future::pending().await,
        }
    }

    async fn due_jobs(
        &self,
        route: &RouteName,
        now: i64,
        limit: usize,
    ) -> Result<DueJobs, StorageError> {
        let route = route.clone();
        self.read(move |conn| jobs::due_jobs(conn, &route, now, limit))
            .await
    }

    async fn next_due_at(&self) -> Result<Option<i64>, StorageError> {
        self.read(jobs::next_due_at).await
    }

    async fn give_up(&self, job_id: &str, error: &str, now: i64) -> Result<bool, StorageError> {
        let (job_id, error) = (job_id.to_owned(), error.to_owned());
        self.write(move |conn| {
            jobs::give_up(
                conn,
                &job_id,
                &error,
                ("give_up", RECEIVER_ACTOR),
                None,
                now,
            )
        })
        .await
    }

    async fn cancel_job(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        let (job_id, route, by) = (job_id.to_owned(), route.cloned(), actor.by.clone());
        let error = actor.cancelled();
        self.write(move |conn| {
            let recorded = ("cancel", by.as_str());
            jobs::give_up(conn, job_id.as_str(), &error, recorded, route.as_ref(), now)
        })
        .await
    }

    async fn retention_step(
        &self,
        step: RetentionStep,
        before: i64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        self.write(move |conn| {
            let sql: std::borrow::Cow<str> = match step {
                RetentionStep::PurgeBodies => jobs::PURGE_BODIES_SQL.into(),
                RetentionStep::DeleteFinished => jobs::DELETE_FINISHED_SQL.into(),
                RetentionStep::DeleteEndedStops => hold::DELETE_ENDED_STOPS_SQL.into(),
                RetentionStep::DeleteResolvedExpectations => expected::DELETE_RESOLVED_SQL.into(),
                RetentionStep::DeleteOldRollups => delete_old_sql(Dialect::Sqlite).into(),
            };
            conn.prepare_cached(&sql)?
                .execute(rusqlite::params![before, limit as i64])
        })
        .await
    }

    async fn release_free_pages(&self, pages: usize) -> Result<bool, StorageError> {
        self.write(move |conn| {
            // The pragma frees one page per step: it must be stepped to its end (execute_batch
            // would step it once).
            let mut statement = conn.prepare(&format!("PRAGMA incremental_vacuum({pages})"))?;
            let mut rows = statement.query([])?;
            while rows.next()?.is_some() {}
            conn.query_row("PRAGMA freelist_count", [], |row| row.get::<_, i64>(0))
        })
        .await
        .map(|left| left > 0)
    }

    async fn store_rollup(&self, rollup: &MinuteRollup) -> Result<(), StorageError> {
        let rollup = *rollup;
        self.write(move |conn| rollups::store_rollup(conn, &rollup))
            .await
    }

    async fn rollups_since(
        &self,
        minute: i64,
        limit: usize,
    ) -> Result<Vec<MinuteRollup>, StorageError> {
        self.read(move |conn| rollups::rollups_since(conn, minute, limit))
            .await
    }

    async fn expect_job(
        &self,
        job_id: &JobId,
        now: i64,
        first_poll_at: i64,
    ) -> Result<bool, StorageError> {
        let job_id = job_id.clone();
        self.write(move |conn| expected::expect_job(conn, &job_id, now, first_poll_at))
            .await
    }

    async fn resolve_arrived(&self, now: i64) -> Result<usize, StorageError> {
        self.write(move |conn| expected::resolve_arrived(conn, now))
            .await
    }

    /// One process polls: no lease is needed, `_lease` is for the shared PostgreSQL ledger.
    async fn due_expectations(
        &self,
        now: i64,
        limit: usize,
        _lease: Duration,
    ) -> Result<Vec<DueExpectation>, StorageError> {
        self.read(move |conn| expected::due_expectations(conn, now, limit))
            .await
    }

    async fn record_poll(
        &self,
        job_id: &str,
        result: &PollResult,
        now: i64,
    ) -> Result<(), StorageError> {
        let (job_id, result) = (job_id.to_owned(), result.clone());
        self.write(move |conn| expected::record_poll(conn, &job_id, &result, now))
            .await
    }

    /// Jobs by state, the oldest unfinished one's age, expected jobs, file
    /// sizes, the writer's queue.
    async fn metrics_snapshot(&self) -> Result<Snapshot, StorageError> {
        let (counts, oldest, expected, work) = self
            .read(|conn| {
                Ok((
                    jobs::job_counts(conn)?,
                    jobs::oldest_unfinished(conn)?,
                    expected::count_expectations(conn)?,
                    jobs::work_by_route(conn)?,
                ))
            })
            .await?;
        let size = |suffix: &str| {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            std::fs::metadata(path).map_or(0, |meta| meta.len())
        };
        Ok(Snapshot {
            jobs: counts
                .into_iter()
                .map(|(state, count)| (state.as_str(), count))
                .collect(),
            oldest_unfinished_age_seconds: oldest
                .map_or(0.0, |at| (now_ms() - at).max(0) as f64 / 1000.0),
            expected,
            ledger_bytes: size(""),
            wal_bytes: Some(size("-wal")),
            claim_queue_depth: self.claim_queue_depth() as u64,
            work,
        })
    }

    async fn probe(&self) -> Result<(), StorageError> {
        self.write(|_| Ok(())).await
    }

    /// A thread panicked, or the disk failed: from then on nothing is acknowledged.
    async fn failed(&self) {
        match self.writer() {
            Some(writer) => writer.failure().failed().await,
            None => std::future::pending().await,
        }
    }

    async fn close(&self) {
        self.stop();
    }

    async fn list_jobs(
        &self,
        state: Option<State>,
        after: Option<&Cursor>,
        since: Option<i64>,
        limit: usize,
    ) -> Result<JobPage, StorageError> {
        let after = after.cloned();
        self.read(move |conn| jobs::list_jobs(conn, state, after.as_ref(), since, limit))
            .await
    }

    async fn jobs_on_route(
        &self,
        route: &RouteName,
        job_ids: &[String],
    ) -> Result<Vec<String>, StorageError> {
        let (route, job_ids) = (route.clone(), job_ids.to_vec());
        self.read(move |conn| jobs::jobs_on_route(conn, &route, &job_ids))
            .await
    }

    async fn show_job(&self, job_id: &JobId) -> Result<Option<JobDetail>, StorageError> {
        let job_id = job_id.to_owned();
        self.read(move |conn| jobs::show_job(conn, job_id.as_str()))
            .await
    }

    async fn trace_context(&self, job_id: &JobId) -> Result<Option<String>, StorageError> {
        let job_id = job_id.to_owned();
        self.read(move |conn| jobs::trace_context(conn, job_id.as_str()))
            .await
    }

    async fn retry_job(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
        now: i64,
    ) -> Result<(), RetryError> {
        let (job_id, route, actor) = (job_id.to_owned(), route.cloned(), actor.clone());
        self.write(move |conn| jobs::retry_job(conn, job_id.as_str(), route.as_ref(), &actor, now))
            .await?
    }

    async fn retry_matching(
        &self,
        filter: &RetryFilter,
        actor: &Actor,
        now: i64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        let (filter, actor) = (filter.clone(), actor.clone());
        self.write(move |conn| jobs::retry_matching(conn, &filter, &actor, now, limit))
            .await
    }

    async fn count_retry_matching(&self, filter: &RetryFilter) -> Result<RetryCount, StorageError> {
        let filter = filter.clone();
        self.read(move |conn| jobs::count_retry_matching(conn, &filter))
            .await
    }

    async fn run_now(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        let (job_id, route, actor) = (job_id.to_owned(), route.cloned(), actor.clone());
        self.write(move |conn| jobs::run_now(conn, job_id.as_str(), route.as_ref(), &actor, now))
            .await
    }

    async fn record_duplicates(&self, seen: &[(JobId, u32, i64)]) -> Result<(), StorageError> {
        let seen = seen.to_vec();
        self.write(move |conn| jobs::record_duplicates(conn, &seen))
            .await
    }

    async fn record_action(
        &self,
        job_id: &JobId,
        taken: ActionTaken<'_>,
        now: i64,
    ) -> Result<bool, StorageError> {
        let (job_id, action, actor) = (
            job_id.to_owned(),
            taken.action.to_owned(),
            taken.actor.clone(),
        );
        self.write(move |conn| {
            history::record_action_if_known(conn, job_id.as_str(), &action, &actor, now)
        })
        .await
    }

    async fn dispatch(&self) -> Result<Dispatch, StorageError> {
        self.read(jobs::dispatch).await
    }

    async fn set_dispatch(
        &self,
        paused: bool,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        let actor = actor.clone();
        self.write(move |conn| jobs::set_dispatch(conn, paused, &actor, now))
            .await
    }

    async fn route_dispatch(&self, route: &RouteName) -> Result<Dispatch, StorageError> {
        let route = route.clone();
        self.read(move |conn| jobs::route_dispatch(conn, &route))
            .await
    }

    async fn set_route_dispatch(
        &self,
        route: &RouteName,
        paused: bool,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        let (route, actor) = (route.clone(), actor.clone());
        self.write(move |conn| jobs::set_route_dispatch(conn, &route, paused, &actor, now))
            .await
    }

    async fn hold(&self, route: &RouteName) -> Result<Option<Hold>, StorageError> {
        let route = route.clone();
        self.read(move |conn| hold::hold(conn, &route)).await
    }

    async fn holds(&self) -> Result<Vec<Hold>, StorageError> {
        self.read(hold::holds).await
    }

    async fn open_hold(&self, opened: &Hold) -> Result<bool, StorageError> {
        let opened = opened.clone();
        self.write(move |conn| hold::open_hold(conn, &opened)).await
    }

    async fn move_probe(&self, moved: &ProbeMove) -> Result<bool, StorageError> {
        let moved = moved.clone();
        self.write(move |conn| hold::move_probe(conn, &moved)).await
    }

    async fn end_hold(
        &self,
        route: &RouteName,
        since: i64,
        now: i64,
    ) -> Result<Option<Hold>, StorageError> {
        let route = route.clone();
        self.write(move |conn| hold::end_hold(conn, &route, since, now))
            .await
    }

    async fn dispatch_stops(
        &self,
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Vec<DispatchStop>, StorageError> {
        self.read(move |conn| hold::dispatch_stops(conn, from, to, limit))
            .await
    }

    async fn job_stats(&self, now: i64) -> Result<JobStats, StorageError> {
        self.read(move |conn| jobs::job_stats(conn, now)).await
    }

    #[cfg(feature = "bench")]
    async fn job_ids_like(&self, pattern: &str) -> Result<Vec<String>, StorageError> {
        let pattern = pattern.to_owned();
        self.read(move |conn| jobs::job_ids_like(conn, &pattern))
            .await
    }

    async fn list_expectations(&self, limit: usize) -> Result<Vec<Expectation>, StorageError> {
        self.read(move |conn| expected::list_expectations(conn, limit))
            .await
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn sees_work_added_elsewhere(&self) -> bool {
        self.wal_watch().is_some()
    }

    fn claim_queue_depth(&self) -> usize {
        self.writer().map_or(0, Writer::queued)
    }

    /// The writer is alive, its last commit went through, and its queue has room.
    fn readiness(&self) -> Result<(), &'static str> {
        let Some(writer) = self.writer() else {
            return Ok(());
        };
        if let Some(failure) = self.write_failure() {
            return Err(failure);
        }
        if writer.queued() * 10 >= QUEUE_CAPACITY * 9 {
            return Err("the ledger writer's queue is nearly full");
        }
        Ok(())
    }

    fn write_failure(&self) -> Option<&'static str> {
        let writer = self.writer()?;
        Some(match writer.failure().cause() {
            None => return writer.commits().fault(),
            Some(FailureCause::Damaged) => {
                "the ledger check found damage (see the log): it acknowledges nothing any more"
            }
            Some(_) => "the ledger failed (see the log): it acknowledges nothing any more",
        })
    }

    fn is_storage_lost(&self) -> bool {
        self.failure_cause() == Some(FailureCause::StorageLost)
    }

    fn is_damaged(&self) -> bool {
        self.failure_cause() == Some(FailureCause::Damaged)
    }
}
