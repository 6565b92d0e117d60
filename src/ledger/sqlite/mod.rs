//! The SQLite ledger: opening with pragmas, schema migrations, the writer thread and the reader pool.

mod checkpoint;
mod expected;
mod failure;
mod jobs;
mod wal_sync;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags};

use super::model::{
    Attempt, AttemptEnd, ClaimOutcome, DueExpectation, DueJobs, Expectation, JobDetail, JobStats,
    JobSummary, LeasedAttempt, Leases, NewClaim, PollResult, RetentionStep, RetryError, State,
};
use super::{now_ms, Backend, Cause, StorageError};
use crate::config::{CheckAtStart, DatabaseConfig, Synchronous};
use crate::job_id::JobId;
use crate::metrics::Snapshot;

use checkpoint::Checkpointer;
pub use expected::{DELETE_RESOLVED_SQL, DUE_EXPECTATIONS_SQL};
pub use failure::Cause as FailureCause;
use failure::Failure;
pub use jobs::{
    insert_claim, DELETE_FINISHED_SQL, DUE_JOBS_SQL, EXPIRED_LEASES_SQL, NEXT_DUE_SQL,
    PURGE_BODIES_SQL,
};
use wal_sync::WalFile;
pub use writer::QUEUE_CAPACITY;
use writer::{Answering, Durability, Writer};

/// Schema migrations, applied in order; `PRAGMA user_version` counts how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/sqlite/0001_jobs.sql"),
    include_str!("../../../migrations/sqlite/0002_expected_jobs.sql"),
];

const READER_POOL_SIZE: u32 = 4;
/// The writer's own checkpoint threshold, in pages (128 MiB of WAL). The checkpointer thread
/// copies frames long before (see checkpoint.rs); the writer's checkpoint only finishes the job
/// and rewinds the WAL. Each of those stalls commits for one fsync of the database file, so
/// they are kept rare: on a 1.4 GiB ledger a 2000-page threshold cost a 70 ms stall every 0.3 s
/// (p99 65 ms); this one, a stall every few seconds (p99 8 ms).
const WRITER_AUTOCHECKPOINT_PAGES: u32 = 32768;
/// The WAL file is truncated back to this size when it rewinds. Above the size it reaches in
/// normal operation (the checkpoint threshold), so that each cycle overwrites space the file
/// already has: a limit below it made every cycle append to newly allocated space, which cost
/// ~20 % of the claim throughput (`loadgen --sqlite-alone`). Only a WAL that a long read
/// transaction made grow past it is cut back.
const WAL_SIZE_LIMIT_BYTES: u64 = 2 * WRITER_AUTOCHECKPOINT_PAGES as u64 * 4096;

impl From<rusqlite::Error> for StorageError {
    fn from(error: rusqlite::Error) -> Self {
        StorageError::Unavailable(Cause::new(error))
    }
}

impl From<rusqlite::Error> for RetryError {
    fn from(error: rusqlite::Error) -> Self {
        RetryError::Storage(error.into())
    }
}

impl From<r2d2::Error> for StorageError {
    fn from(error: r2d2::Error) -> Self {
        StorageError::Unavailable(Cause::new(error))
    }
}

/// The open SQLite ledger: the service's (one writer thread for every change, a pool for
/// reads), or the command line's (one connection).
pub struct SqliteLedger {
    connections: Connections,
    path: PathBuf,
}

enum Connections {
    Service {
        writer: Writer,
        readers: r2d2::Pool<SqliteConnectionManager>,
        writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
        checkpointer: Mutex<Option<Checkpointer>>,
    },
    /// The command line's: each change a transaction of its own (a running service's writer
    /// waits for it, up to `busy_timeout`).
    Direct(Arc<Mutex<Connection>>),
}

impl SqliteLedger {
    /// Creates the file if needed, checks that it is ours and whole, migrates it, and starts
    /// the writer thread.
    pub fn open(config: &DatabaseConfig) -> anyhow::Result<SqliteLedger> {
        let (conn, durability) = open_for_writing(config)?;
        let settings = config.clone();
        let readers = r2d2::Pool::builder()
            .max_size(READER_POOL_SIZE)
            .build(
                SqliteConnectionManager::file(&config.path)
                    .with_init(move |conn| apply_pragmas(conn, &settings)),
            )
            .context("cannot open the reader pool")?;
        let failure = Arc::new(Failure::default());
        let checkpointer = Checkpointer::start(
            open_connection(&config.path, config, OpenFlags::default())?,
            failure.clone(),
        )?;
        let (writer, thread) = Writer::start(conn, config.max_batch, durability, failure)?;
        Ok(SqliteLedger {
            connections: Connections::Service {
                writer,
                readers,
                writer_thread: Mutex::new(Some(thread)),
                checkpointer: Mutex::new(Some(checkpointer)),
            },
            path: config.path.clone(),
        })
    }

    /// Opens an existing, migrated ledger for the command line (see [`open_existing`]).
    pub fn open_existing(config: &DatabaseConfig) -> anyhow::Result<SqliteLedger> {
        Ok(SqliteLedger {
            connections: Connections::Direct(Arc::new(Mutex::new(open_existing(config)?))),
            path: config.path.clone(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `op` inside a transaction: the service's on the writer thread (group commit),
    /// resolved once committed and durable.
    async fn write<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
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
                tokio::task::spawn_blocking(move || Ok(op(&*pool.get()?)?))
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
            ..
        } = &self.connections
        else {
            return;
        };
        writer.stop();
        if let Some(thread) = writer_thread.lock().expect("not poisoned").take() {
            let _ = thread.join();
        }
        if let Some(checkpointer) = checkpointer.lock().expect("not poisoned").take() {
            checkpointer.stop();
        }
    }

    /// Why the ledger failed, once it has.
    pub fn failure_cause(&self) -> Option<FailureCause> {
        self.writer()?.failure().cause()
    }

    /// Runs any change on the writer, as part of a group commit: for tests of the writer
    /// itself (a failing statement in a batch, the queue's bound).
    #[cfg(feature = "testing")]
    pub async fn write_for_test<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.write(op).await
    }
}

impl Backend for SqliteLedger {
    /// Refused at once with [`StorageError::Overloaded`] when the writer's queue is full, so
    /// that the delivery is answered 503 instead of waiting.
    async fn claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError> {
        match self.writer() {
            Some(writer) => writer.try_claim(claim).await,
            None => {
                self.write(move |conn| jobs::insert_claim(conn, &claim, now_ms()))
                    .await
            }
        }
    }

    async fn start_attempt(
        &self,
        job_id: &JobId,
        now: i64,
        lease_expires_at: i64,
    ) -> Result<Option<Attempt>, StorageError> {
        let job_id = job_id.clone();
        self.write(move |conn| jobs::start_attempt(conn, &job_id, now, lease_expires_at))
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

    async fn release_attempt(&self, attempt: &Attempt, now: i64) -> Result<bool, StorageError> {
        let attempt = attempt.clone();
        self.write(move |conn| jobs::release_attempt(conn, &attempt, now))
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

    async fn due_jobs(&self, now: i64, limit: usize) -> Result<DueJobs, StorageError> {
        self.read(move |conn| jobs::due_jobs(conn, now, limit))
            .await
    }

    async fn give_up(&self, job_id: &str, error: &str, now: i64) -> Result<bool, StorageError> {
        let (job_id, error) = (job_id.to_owned(), error.to_owned());
        self.write(move |conn| jobs::give_up(conn, &job_id, &error, now))
            .await
    }

    async fn retention_step(
        &self,
        step: RetentionStep,
        before: i64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        self.write(move |conn| {
            let sql = match step {
                RetentionStep::PurgeBodies => jobs::PURGE_BODIES_SQL,
                RetentionStep::DeleteFinished => jobs::DELETE_FINISHED_SQL,
                RetentionStep::DeleteResolvedExpectations => expected::DELETE_RESOLVED_SQL,
            };
            conn.prepare_cached(sql)?
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

    /// Unfinished jobs by state (partial indexes only), the oldest one's age, expected jobs,
    /// file sizes, the writer's queue.
    async fn metrics_snapshot(&self) -> Result<Snapshot, StorageError> {
        let (unfinished, oldest, expected) = self
            .read(|conn| {
                Ok((
                    jobs::count_unfinished(conn)?,
                    jobs::oldest_unfinished(conn)?,
                    expected::count_expectations(conn)?,
                ))
            })
            .await?;
        let size = |suffix: &str| {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            std::fs::metadata(path).map_or(0, |meta| meta.len())
        };
        Ok(Snapshot {
            unfinished: unfinished
                .into_iter()
                .map(|(state, count)| (state.as_str(), count))
                .collect(),
            oldest_unfinished_age_seconds: oldest
                .map_or(0.0, |at| (now_ms() - at).max(0) as f64 / 1000.0),
            expected,
            ledger_bytes: size(""),
            wal_bytes: Some(size("-wal")),
            claim_queue_depth: self.claim_queue_depth() as u64,
        })
    }

    async fn count_finished(&self) -> Result<(u64, u64), StorageError> {
        self.read(jobs::count_finished).await
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
        limit: usize,
    ) -> Result<Vec<JobSummary>, StorageError> {
        self.read(move |conn| jobs::list_jobs(conn, state, limit))
            .await
    }

    async fn show_job(&self, job_id: &str) -> Result<Option<JobDetail>, StorageError> {
        let job_id = job_id.to_owned();
        self.read(move |conn| jobs::show_job(conn, &job_id)).await
    }

    async fn retry_job(&self, job_id: &str, now: i64) -> Result<(), RetryError> {
        let job_id = job_id.to_owned();
        self.write(move |conn| jobs::retry_job(conn, &job_id, now))
            .await?
    }

    async fn job_stats(&self, now: i64) -> Result<JobStats, StorageError> {
        self.read(move |conn| jobs::job_stats(conn, now)).await
    }

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

    fn claim_queue_depth(&self) -> usize {
        self.writer().map_or(0, Writer::queued)
    }

    /// The writer is alive, its last commit went through, and its queue has room.
    fn readiness(&self) -> Result<(), &'static str> {
        let Some(writer) = self.writer() else {
            return Ok(());
        };
        if writer.failure().is_failed() {
            return Err("the ledger failed (see the log): it acknowledges nothing any more");
        }
        if !writer.last_commit_ok() {
            return Err("the last ledger commit failed");
        }
        if writer.queued() * 10 >= QUEUE_CAPACITY * 9 {
            return Err("the ledger writer's queue is nearly full");
        }
        Ok(())
    }

    fn is_storage_lost(&self) -> bool {
        self.failure_cause() == Some(FailureCause::StorageLost)
    }
}

/// The writer's connection: the file created if needed, checked to be ours and whole, migrated,
/// and tuned for the writer; and how its commits become durable.
fn open_for_writing(config: &DatabaseConfig) -> anyhow::Result<(Connection, Durability)> {
    if let Some(dir) = config
        .path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create database directory {}", dir.display()))?;
    }
    create_private_file(&config.path)?;
    let mut conn = open_unconfigured(&config.path, config, OpenFlags::default())?;
    let version = check_ownership(&conn, &config.path)?;
    check_integrity(&conn, &config.path, config.check_at_start)?;
    apply_pragmas(&conn, config)
        .with_context(|| format!("cannot configure database {}", config.path.display()))?;
    migrate(&mut conn, &config.path, version)?;
    conn.execute_batch(&format!(
        "PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES};"
    ))?;
    conn.wal_hook(Some(checkpoint::checkpoint_after_commit));
    let wal = WalFile::open(&conn)
        .with_context(|| format!("cannot open the WAL of {}", config.path.display()))?;
    wal.sync_inherited().with_context(|| {
        format!(
            "cannot make what the ledger {} holds durable (fsync)",
            config.path.display()
        )
    })?;
    let durability = match config.synchronous {
        Synchronous::Normal => Durability::AtCommit,
        // The same fsync of the WAL as FULL's inside COMMIT, on the WAL syncer's thread, so that
        // the writer may commit the next batch meanwhile (wal_sync.rs says why that is as safe).
        Synchronous::Full => {
            conn.execute_batch("PRAGMA synchronous = NORMAL")?;
            Durability::AfterWalSync(wal.into_sync())
        }
    };
    Ok((conn, durability))
}

/// The ledger's writer connection, WAL syncer and checkpointer with no queue, no runtime and no
/// HTTP in front: batches of claims go straight through the writer's commit on the caller's
/// thread. The limit the request path is measured against (`loadgen --sqlite-alone`).
pub struct WriterAlone {
    conn: Connection,
    answering: Option<Answering>,
    checkpointer: Option<Checkpointer>,
}

/// The claims of one committed batch, answered once durable.
pub struct PendingClaims(Vec<tokio::sync::oneshot::Receiver<Result<ClaimOutcome, StorageError>>>);

impl PendingClaims {
    /// Blocks until every claim of the batch is answered.
    pub fn wait(self) -> Result<Vec<ClaimOutcome>, StorageError> {
        self.0
            .into_iter()
            .map(|answer| answer.blocking_recv().map_err(|_| StorageError::Closed)?)
            .collect()
    }
}

impl WriterAlone {
    /// Opens the ledger as the service does (checks, migrations, the writer's settings).
    pub fn open(config: &DatabaseConfig) -> anyhow::Result<WriterAlone> {
        let (conn, durability) = open_for_writing(config)?;
        let failure = Arc::new(Failure::default());
        let answering = Answering::start(durability, failure.clone())?;
        let checkpointer = Checkpointer::start(
            open_connection(&config.path, config, OpenFlags::default())?,
            failure,
        )?;
        Ok(WriterAlone {
            conn,
            answering: Some(answering),
            checkpointer: Some(checkpointer),
        })
    }

    /// Commits `claims` in one transaction, as the writer thread does with claims that arrived
    /// together; the next batch may be committed before this one is answered.
    pub fn claim(&self, claims: Vec<NewClaim>) -> PendingClaims {
        let answering = self.answering.as_ref().expect("only taken on drop");
        PendingClaims(writer::commit_claims(&self.conn, claims, answering))
    }
}

impl Drop for WriterAlone {
    fn drop(&mut self) {
        if let Some(answering) = self.answering.take() {
            answering.finish();
        }
        if let Some(checkpointer) = self.checkpointer.take() {
            checkpointer.stop();
        }
    }
}

/// Opens an existing ledger for the CLI; refuses to create one or to use an unmigrated one.
pub fn open_existing(config: &DatabaseConfig) -> anyhow::Result<Connection> {
    let path = &config.path;
    if !path.exists() {
        bail!(
            "no ledger at {} (check database.path; the service creates it when it first starts)",
            path.display()
        );
    }
    let conn = open_unconfigured(path, config, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    let version = check_ownership(&conn, path)?;
    if version != MIGRATIONS.len() {
        bail!(
            "ledger {} has schema version {version}, this binary expects {}: start the service once \
             to migrate it, or use the matching sume-receiver",
            path.display(),
            MIGRATIONS.len()
        );
    }
    apply_pragmas(&conn, config)
        .with_context(|| format!("cannot configure database {}", path.display()))?;
    Ok(conn)
}

/// What `backup` made.
#[derive(Debug, Clone)]
pub struct BackupReport {
    pub jobs: u64,
    pub bytes: u64,
}

/// Writes a consistent copy of the ledger to `target` while the service may be running
/// (`VACUUM INTO`: one read transaction, so writers go on), private to its owner, then runs
/// `PRAGMA integrity_check` on the copy. Refuses to overwrite anything.
pub fn backup(config: &DatabaseConfig, target: &Path) -> anyhow::Result<BackupReport> {
    if config.uses_postgres() {
        bail!(
            "backup copies a SQLite ledger; this ledger is PostgreSQL (database.url): back it \
             up with pg_dump or your provider's backups (the jobs and expected_jobs tables)"
        );
    }
    let conn = open_existing(config)?;
    if std::fs::symlink_metadata(target).is_ok() {
        bail!(
            "{} already exists: refusing to overwrite it, name a new file",
            target.display()
        );
    }
    create_private_file(target)?;
    let copied = conn
        .execute("VACUUM INTO ?1", [target.to_string_lossy()])
        .with_context(|| format!("cannot copy the ledger to {}", target.display()));
    if let Err(error) = copied {
        let _ = std::fs::remove_file(target);
        return Err(error);
    }
    let copy = Connection::open_with_flags(target, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let check: String = copy.query_row("PRAGMA integrity_check(1)", [], |row| row.get(0))?;
    if check != "ok" {
        bail!(
            "the copy at {} failed PRAGMA integrity_check: {check:?} (is the ledger itself \
             damaged? try `sume-receiver check-config` with check_at_start = \"full\")",
            target.display()
        );
    }
    Ok(BackupReport {
        jobs: copy
            .query_row("SELECT count(*) FROM jobs", [], |row| row.get::<_, i64>(0))?
            .unsigned_abs(),
        bytes: std::fs::metadata(target)?.len(),
    })
}

/// Creates the ledger file readable by its owner only, whatever the umask; SQLite gives the
/// WAL and shared-memory files the same mode. An existing file is left as it is.
fn create_private_file(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => {
            Err(error).with_context(|| format!("cannot create the ledger {}", path.display()))
        }
    }
}

/// A connection that has written nothing yet: the checks below run before any pragma that
/// would change the file (WAL mode is recorded in its header).
fn open_unconfigured(
    path: &Path,
    config: &DatabaseConfig,
    flags: OpenFlags,
) -> anyhow::Result<Connection> {
    let flags = flags | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)
        .with_context(|| format!("cannot open database {}", path.display()))?;
    conn.busy_timeout(config.busy_timeout)?;
    Ok(conn)
}

fn open_connection(
    path: &Path,
    config: &DatabaseConfig,
    flags: OpenFlags,
) -> anyhow::Result<Connection> {
    let conn = open_unconfigured(path, config, flags)?;
    apply_pragmas(&conn, config)
        .with_context(|| format!("cannot configure database {}", path.display()))?;
    Ok(conn)
}

/// Refuses a file that is not a ledger of ours: another application's database (tables but no
/// schema version of ours) or a ledger newer than this binary. Returns the schema version.
fn check_ownership(conn: &Connection, path: &Path) -> anyhow::Result<usize> {
    let read = || -> rusqlite::Result<(i64, i64)> {
        let version = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        let objects = conn.query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))?;
        Ok((version, objects))
    };
    let (version, objects) = read().with_context(|| {
        format!(
            "cannot read {} as a SQLite database (is database.path the ledger?)",
            path.display()
        )
    })?;
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version == 0 && objects > 0 {
        bail!(
            "{} is not a sume-receiver ledger: it already holds {objects} tables, indexes or \
             views but no schema version of ours (another application's database?); it was \
             left untouched. Point database.path at a new file",
            path.display()
        );
    }
    if version > MIGRATIONS.len() {
        bail!(
            "database {} has schema version {version}, newer than this binary knows ({}); \
             refusing to touch it: upgrade sume-receiver",
            path.display(),
            MIGRATIONS.len()
        );
    }
    Ok(version)
}

/// Runs SQLite's own consistency check, as configured; a damaged ledger is refused with the way
/// out, instead of serving from it and failing later.
fn check_integrity(conn: &Connection, path: &Path, check: CheckAtStart) -> anyhow::Result<()> {
    let pragma = match check {
        CheckAtStart::Off => return Ok(()),
        CheckAtStart::Quick => "quick_check",
        CheckAtStart::Full => "integrity_check",
    };
    let started = std::time::Instant::now();
    let findings = conn
        .prepare(&format!("PRAGMA {pragma}(5)"))
        .and_then(|mut statement| {
            statement
                .query_map([], |row| row.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        });
    let findings = match findings {
        Ok(findings) if findings == ["ok"] => {
            tracing::info!(
                check = pragma,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "ledger checked"
            );
            return Ok(());
        }
        Ok(findings) => findings.join("; "),
        Err(error) => error.to_string(),
    };
    let path = path.display();
    bail!(
        "the ledger {path} is damaged (PRAGMA {pragma}: {findings:?}); refusing to serve from it. \
         Stop the service and restore the ledger from a backup, or salvage what is readable: \
         `sqlite3 {path} .recover | sqlite3 {path}.recovered`, then move the recovered file to \
         {path} (keep the damaged one aside). database.check_at_start = \"off\" skips this check"
    )
}

/// Pragmas every connection gets at open; none of them persist in the file except WAL mode.
fn apply_pragmas(conn: &Connection, config: &DatabaseConfig) -> rusqlite::Result<()> {
    conn.busy_timeout(config.busy_timeout)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode stayed {mode}; WAL is required"
        )));
    }
    let synchronous = match config.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON;"
    ))
}

/// Applies the migrations after `version` (checked by [`check_ownership`]).
fn migrate(conn: &mut Connection, path: &Path, version: usize) -> anyhow::Result<()> {
    if version == 0 {
        // Lets retention give freed pages back to the file system (PRAGMA incremental_vacuum)
        // instead of keeping the file at its peak. The VACUUM applies it to the still empty file.
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")?;
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)
            .with_context(|| format!("migration {} failed on {}", index + 1, path.display()))?;
        tx.pragma_update(None, "user_version", (index + 1) as i64)?;
        tx.commit()?;
        tracing::info!(version = index + 1, "applied schema migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn test_config(dir: &Path) -> DatabaseConfig {
        DatabaseConfig {
            path: dir.join("ledger.sqlite3"),
            ..DatabaseConfig::default()
        }
    }

    fn schema_version(conn: &Connection) -> usize {
        conn.query_row("PRAGMA user_version", [], |row| row.get::<_, i64>(0))
            .unwrap() as usize
    }

    /// A database of someone else's at the ledger's path, made with a plain connection
    /// (rollback journal, as SQLite creates files by default).
    fn foreign_database(config: &DatabaseConfig, sql: &str) -> Vec<u8> {
        let conn = Connection::open(&config.path).unwrap();
        conn.execute_batch(sql).unwrap();
        drop(conn);
        std::fs::read(&config.path).unwrap()
    }

    #[test]
    fn migrations_set_the_version_and_are_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        let mut conn = open_connection(&config.path, &config, OpenFlags::default()).unwrap();
        migrate(&mut conn, &config.path, 0).unwrap();
        let version = schema_version(&conn);
        migrate(&mut conn, &config.path, version).unwrap();
        assert_eq!(schema_version(&conn), MIGRATIONS.len());
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let auto_vacuum: i64 = conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .unwrap();
        assert_eq!(auto_vacuum, 2, "2 = incremental");
    }

    #[test]
    fn refuses_a_newer_ledger_before_writing_anything() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        let before = foreign_database(
            &config,
            "CREATE TABLE jobs (job_id TEXT); PRAGMA user_version = 99;",
        );
        let error = format!("{:#}", SqliteLedger::open(&config).err().unwrap());
        assert!(error.contains("newer than this binary knows"), "{error}");
        let error = format!("{:#}", open_existing(&config).unwrap_err());
        assert!(error.contains("newer than this binary knows"), "{error}");
        assert!(
            std::fs::read(&config.path).unwrap() == before,
            "the file must be left byte for byte (it was switched to WAL mode before the fix)"
        );
    }

    #[test]
    fn refuses_another_applications_database_and_leaves_it_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        let before = foreign_database(
            &config,
            "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL);
             INSERT INTO invoices (total) VALUES (12.5);",
        );
        let error = format!("{:#}", SqliteLedger::open(&config).err().unwrap());
        assert!(error.contains("is not a sume-receiver ledger"), "{error}");
        let error = format!("{:#}", open_existing(&config).unwrap_err());
        assert!(error.contains("is not a sume-receiver ledger"), "{error}");
        assert!(std::fs::read(&config.path).unwrap() == before);
        assert!(!dir.path().join("ledger.sqlite3-wal").exists());
    }

    #[test]
    fn refuses_a_file_that_is_not_a_database() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        std::fs::write(
            &config.path,
            "[server]\nlisten = \"0.0.0.0:80\"\n".repeat(200),
        )
        .unwrap();
        let error = format!("{:#}", SqliteLedger::open(&config).err().unwrap());
        assert!(error.contains("cannot read"), "{error}");
    }

    #[test]
    fn an_empty_file_becomes_a_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        std::fs::write(&config.path, "").unwrap();
        SqliteLedger::open(&config).unwrap().stop();
        let conn = Connection::open(&config.path).unwrap();
        assert_eq!(schema_version(&conn), MIGRATIONS.len());
    }

    #[test]
    fn refuses_a_damaged_ledger_and_says_how_to_recover() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        SqliteLedger::open(&config).unwrap().stop();
        let conn = Connection::open(&config.path).unwrap();
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO jobs (job_id, state, body, received_at, updated_at)
             SELECT 'job-' || i, 'done', hex(randomblob(500)), i, i FROM n;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |row| row.get(0))
            .unwrap();
        drop(conn);
        // One page in the middle of the file overwritten, as a bad sector or a stray write would.
        let mut bytes = std::fs::read(&config.path).unwrap();
        let page = (pages / 2) as usize * 4096;
        bytes[page..page + 4096].fill(0x55);
        std::fs::write(&config.path, bytes).unwrap();

        let error = format!("{:#}", SqliteLedger::open(&config).err().unwrap());
        assert!(error.contains("is damaged"), "{error}");
        assert!(error.contains(".recover"), "{error}");
        let unchecked = DatabaseConfig {
            check_at_start: CheckAtStart::Off,
            ..config
        };
        SqliteLedger::open(&unchecked).unwrap().stop();
    }

    #[test]
    fn ledger_files_are_private_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        let ledger = SqliteLedger::open(&config).unwrap();
        for name in ["ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"] {
            let mode = std::fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}: {mode:o}");
        }
        ledger.stop();
    }

    #[test]
    fn open_existing_refuses_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let error = open_existing(&test_config(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no ledger at"), "{error}");
    }
}
