//! The SQLite ledger: opening with pragmas, schema migrations, the writer thread and the reader pool.

mod checkpoint;
mod expected;
mod jobs;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::config::{DatabaseConfig, Synchronous};

use checkpoint::Checkpointer;
pub use expected::*;
pub use jobs::*;
use writer::Writer;

/// Schema migrations, applied in order; `PRAGMA user_version` counts how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/0001_jobs.sql"),
    include_str!("../../migrations/0002_expected_jobs.sql"),
];

const READER_POOL_SIZE: u32 = 4;
/// The writer's own checkpoint threshold, in pages (128 MiB of WAL). The checkpointer thread
/// copies frames long before (see checkpoint.rs); the writer's checkpoint only finishes the job
/// and rewinds the WAL. Each of those stalls commits for one fsync of the database file, so
/// they are kept rare: on a 1.4 GiB ledger a 2000-page threshold cost a 70 ms stall every 0.3 s
/// (p99 65 ms); this one, a stall every few seconds (p99 8 ms).
const WRITER_AUTOCHECKPOINT_PAGES: u32 = 32768;
/// The WAL file is truncated back to this size after it rewinds.
const WAL_SIZE_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

/// Why a ledger operation failed. Cheap to clone: one failed group commit fails every waiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    #[error("database is locked by another connection")]
    Busy,
    #[error("database error: {0}")]
    Sqlite(String),
    #[error("ledger is closed")]
    Closed,
}

impl From<rusqlite::Error> for StorageError {
    fn from(error: rusqlite::Error) -> Self {
        match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StorageError::Busy,
            _ => StorageError::Sqlite(error.to_string()),
        }
    }
}

impl From<r2d2::Error> for StorageError {
    fn from(error: r2d2::Error) -> Self {
        StorageError::Sqlite(error.to_string())
    }
}

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

/// The open ledger of a running service: one writer thread for every change, a pool for reads.
pub struct Ledger {
    writer: Writer,
    readers: r2d2::Pool<SqliteConnectionManager>,
    path: PathBuf,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    checkpointer: Mutex<Option<Checkpointer>>,
}

impl Ledger {
    /// Creates the file if needed, migrates it, and starts the writer thread.
    pub fn open(config: &DatabaseConfig) -> anyhow::Result<Arc<Ledger>> {
        if let Some(dir) = config
            .path
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create database directory {}", dir.display()))?;
        }
        let mut conn = open_connection(&config.path, config, OpenFlags::default())?;
        migrate(&mut conn, &config.path)?;
        let settings = config.clone();
        let readers = r2d2::Pool::builder()
            .max_size(READER_POOL_SIZE)
            .build(
                SqliteConnectionManager::file(&config.path)
                    .with_init(move |conn| apply_pragmas(conn, &settings)),
            )
            .context("cannot open the reader pool")?;
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = {WRITER_AUTOCHECKPOINT_PAGES};
             PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES};"
        ))?;
        let checkpointer =
            Checkpointer::start(open_connection(&config.path, config, OpenFlags::default())?)?;
        let (writer, thread) = Writer::start(conn, config.max_batch)?;
        Ok(Arc::new(Ledger {
            writer,
            readers,
            path: config.path.clone(),
            writer_thread: Mutex::new(Some(thread)),
            checkpointer: Mutex::new(Some(checkpointer)),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `op` on the writer thread inside a group-commit transaction; resolves once committed.
    pub async fn write<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.writer.submit(op).await
    }

    /// Runs `op` on a pooled read connection, off the async runtime.
    pub async fn read<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let pool = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = pool.get()?;
            Ok(op(&conn)?)
        })
        .await
        .map_err(|_| StorageError::Closed)?
    }

    /// Returns unused pages to the file system, at most `pages` of them; `true` if some remain.
    pub async fn release_free_pages(&self, pages: usize) -> Result<bool, StorageError> {
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

    pub async fn claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError> {
        self.write(move |conn| insert_claim(conn, &claim, now_ms()))
            .await
    }

    /// Stops the writer thread after it has committed everything queued before this call.
    pub fn close(&self) {
        self.writer.stop();
        if let Some(thread) = self.writer_thread.lock().expect("not poisoned").take() {
            let _ = thread.join();
        }
        if let Some(checkpointer) = self.checkpointer.lock().expect("not poisoned").take() {
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
    let conn = open_connection(path, config, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    let version = schema_version(&conn)?;
    if version != MIGRATIONS.len() {
        bail!(
            "ledger {} has schema version {version}, this binary expects {}: start the service once \
             to migrate it, or use the matching sume-receiver",
            path.display(),
            MIGRATIONS.len()
        );
    }
    Ok(conn)
}

fn open_connection(
    path: &Path,
    config: &DatabaseConfig,
    flags: OpenFlags,
) -> anyhow::Result<Connection> {
    let flags = flags | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)
        .with_context(|| format!("cannot open database {}", path.display()))?;
    apply_pragmas(&conn, config)
        .with_context(|| format!("cannot configure database {}", path.display()))?;
    Ok(conn)
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

fn schema_version(conn: &Connection) -> anyhow::Result<usize> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    Ok(usize::try_from(version).unwrap_or(usize::MAX))
}

fn migrate(conn: &mut Connection, path: &Path) -> anyhow::Result<()> {
    let version = schema_version(conn)?;
    if version > MIGRATIONS.len() {
        bail!(
            "database {} has schema version {version}, newer than this binary knows ({}); \
             refusing to touch it: upgrade sume-receiver",
            path.display(),
            MIGRATIONS.len()
        );
    }
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
    use super::*;

    fn test_config(dir: &Path) -> DatabaseConfig {
        DatabaseConfig {
            path: dir.join("ledger.sqlite3"),
            ..DatabaseConfig::default()
        }
    }

    /// A fresh, configured but unmigrated connection in `dir`.
    fn fresh_connection(dir: &Path) -> (DatabaseConfig, Connection) {
        let config = test_config(dir);
        let conn = open_connection(&config.path, &config, OpenFlags::default()).unwrap();
        (config, conn)
    }

    #[test]
    fn migrations_set_the_version_and_are_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let (config, mut conn) = fresh_connection(dir.path());
        migrate(&mut conn, &config.path).unwrap();
        migrate(&mut conn, &config.path).unwrap();
        assert_eq!(schema_version(&conn).unwrap(), MIGRATIONS.len());
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn new_ledgers_use_incremental_auto_vacuum() {
        let dir = tempfile::tempdir().unwrap();
        let (config, mut conn) = fresh_connection(dir.path());
        migrate(&mut conn, &config.path).unwrap();
        let mode: i64 = conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, 2, "2 = incremental");
    }

    #[test]
    fn refuses_a_newer_database() {
        let dir = tempfile::tempdir().unwrap();
        let (config, mut conn) = fresh_connection(dir.path());
        conn.pragma_update(None, "user_version", 99).unwrap();
        let error = migrate(&mut conn, &config.path).unwrap_err().to_string();
        assert!(error.contains("newer than this binary knows"), "{error}");
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
