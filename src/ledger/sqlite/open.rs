//! Opening a SQLite ledger: the file made private, checked to be ours and whole, migrated, tuned.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use rusqlite::{Connection, OpenFlags};

use super::checkpoint::{self, WAL_SIZE_LIMIT_BYTES};
use super::integrity;
use super::wal_sync::WalFile;
use super::writer::Durability;
use crate::config::{SqliteConfig, Synchronous};

/// SQLite's virtual machine steps between two looks at the clock while a migration runs.
const STEPS_BETWEEN_REPORTS: std::os::raw::c_int = 100_000;

/// Schema migrations, applied in order; `PRAGMA user_version` counts how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/sqlite/0001_jobs.sql"),
    include_str!("../../../migrations/sqlite/0002_expected_jobs.sql"),
    include_str!("../../../migrations/sqlite/0003_history.sql"),
    include_str!("../../../migrations/sqlite/0004_job_counts.sql"),
    include_str!("../../../migrations/sqlite/0005_checks_without_in_lists.sql"),
    include_str!("../../../migrations/sqlite/0006_hold.sql"),
    include_str!("../../../migrations/sqlite/0007_dispatch_stops.sql"),
    include_str!("../../../migrations/sqlite/0008_minute_rollups.sql"),
    include_str!("../../../migrations/sqlite/0009_routes.sql"),
    include_str!("../../../migrations/sqlite/0010_trace_context.sql"),
    include_str!("../../../migrations/sqlite/0011_job_routes_by_job_number.sql"),
];

/// The writer's connection: the file created if needed, checked to be ours (and whole, when the
/// whole check runs before serving: integrity.rs), migrated, and tuned for the writer; and how
/// its commits become durable.
pub(super) fn open_for_writing(config: &SqliteConfig) -> anyhow::Result<(Connection, Durability)> {
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
    if integrity::check_before_serving(config) {
        integrity::check_now(&conn, config)?;
    }
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
        // The same fsync of the WAL as FULL's inside COMMIT, made after it by the writer or the
        // WAL syncer's thread (wal_sync.rs says why that is as safe, writer/mod.rs which thread).
        Synchronous::Full => {
            conn.execute_batch("PRAGMA synchronous = NORMAL")?;
            Durability::AfterWalSync(wal.into_sync())
        }
    };
    Ok((conn, durability))
}

/// Opens an existing ledger for the CLI; refuses to create one or to use an unmigrated one.
pub(super) fn open_existing_connection(config: &SqliteConfig) -> anyhow::Result<Connection> {
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

/// Creates the ledger file readable by its owner only, whatever the umask; SQLite gives the
/// WAL and shared-memory files the same mode. An existing file is left as it is.
pub(super) fn create_private_file(path: &Path) -> anyhow::Result<()> {
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
    config: &SqliteConfig,
    flags: OpenFlags,
) -> anyhow::Result<Connection> {
    let flags = flags | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)
        .with_context(|| format!("cannot open database {}", path.display()))?;
    conn.busy_timeout(config.busy_timeout)?;
    Ok(conn)
}

pub(super) fn open_connection(
    path: &Path,
    config: &SqliteConfig,
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

/// Pragmas every connection gets at open; none of them persist in the file except WAL mode.
pub(super) fn apply_pragmas(conn: &Connection, config: &SqliteConfig) -> rusqlite::Result<()> {
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
        // A migration that copies a table (0011) takes as long as the ledger is large: systemd
        // hears that it goes on, and the start's timeout moves with it.
        let (started, mut last_report) = (Instant::now(), Instant::now());
        conn.progress_handler(
            STEPS_BETWEEN_REPORTS,
            Some(move || {
                if last_report.elapsed() >= integrity::PROGRESS_EVERY {
                    last_report = Instant::now();
                    let elapsed_s = started.elapsed().as_secs();
                    tracing::info!(version = index + 1, elapsed_s, "migrating the ledger");
                    integrity::still_starting(&format!(
                        "migrating the ledger to schema version {}: {elapsed_s} s",
                        index + 1
                    ));
                }
                false
            }),
        )?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)
            .with_context(|| format!("migration {} failed on {}", index + 1, path.display()))?;
        // A migration may edit sqlite_schema in place (0005), which SQLite does not count as
        // a schema change; its procedure for such edits bumps the schema version, so that
        // connections that read the schema before read it again. After any other migration
        // it is merely one more.
        let schema_version: i64 = tx.query_row("PRAGMA schema_version", [], |row| row.get(0))?;
        tx.pragma_update(None, "schema_version", schema_version + 1)?;
        tx.pragma_update(None, "user_version", (index + 1) as i64)?;
        tx.commit()?;
        conn.progress_handler(0, None::<fn() -> bool>)?;
        tracing::info!(version = index + 1, "applied schema migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::super::SqliteLedger;
    use super::*;
    use crate::config::CheckAtStart;
    use crate::ledger::contract::Backend;

    fn test_config(dir: &Path) -> SqliteConfig {
        SqliteConfig {
            path: dir.join("ledger.sqlite3"),
            ..SqliteConfig::default()
        }
    }

    fn schema_version(conn: &Connection) -> usize {
        conn.query_row("PRAGMA user_version", [], |row| row.get::<_, i64>(0))
            .unwrap() as usize
    }

    /// A database of someone else's at the ledger's path, made with a plain connection
    /// (rollback journal, as SQLite creates files by default).
    fn foreign_database(config: &SqliteConfig, sql: &str) -> Vec<u8> {
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

    /// The opcodes SQLite compiles `sql` to.
    fn program(conn: &Connection, sql: &str) -> Vec<String> {
        let mut statement = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        let opcodes = statement.query_map([], |row| row.get(1)).unwrap();
        opcodes.collect::<Result<_, _>>().unwrap()
    }

    const CLAIM: &str = "INSERT INTO jobs (job_id, state, source, body, received_at, \
         next_attempt_at, updated_at) VALUES ('j1', 'claimed', 'webhook', '{}', 1, 1, 1) \
         ON CONFLICT (job_id) DO NOTHING";
    const ATTEMPT_END: &str = "UPDATE job_attempts SET outcome = 'done' WHERE id = 1";

    /// Regression: `state IN (...)` in the jobs CHECK made every claim build a temporary
    /// B-tree (migration 0005). A ledger migrated from version 4 keeps its rows and its checks,
    /// for the connection that migrated it and for one that had read the schema before (a
    /// `sqlite3` shell left open over an upgrade): without the schema version's bump, that one
    /// kept the old text.
    #[test]
    fn checks_build_no_temporary_table_and_still_refuse_what_they_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        let mut conn = open_connection(&config.path, &config, OpenFlags::default()).unwrap();
        for sql in &MIGRATIONS[..4] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch(&format!(
            "PRAGMA user_version = 4; {CLAIM}; INSERT INTO job_attempts \
             (id, job_id, number, cause, started_at) VALUES (1, 'j1', 1, 'first', 1);"
        ))
        .unwrap();
        assert!(program(&conn, CLAIM).contains(&"OpenEphemeral".to_owned()));
        let other = open_connection(&config.path, &config, OpenFlags::default()).unwrap();
        other
            .query_row("SELECT count(*) FROM jobs", [], |_| Ok(()))
            .unwrap();

        migrate(&mut conn, &config.path, 4).unwrap();
        for conn in [&conn, &other] {
            // A statement that runs (EXPLAIN does not) checks the schema version, and finds the
            // migration's bump.
            let jobs: i64 = conn
                .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
                .unwrap();
            assert_eq!(jobs, 1);
            for sql in [CLAIM, ATTEMPT_END] {
                let program = program(conn, sql);
                assert!(
                    !program.contains(&"OpenEphemeral".to_owned()),
                    "{sql}: {program:?}"
                );
            }
            let refused = |sql: &str| conn.execute_batch(sql).unwrap_err().to_string();
            let bad_state = refused("UPDATE jobs SET state = 'finished' WHERE job_id = 'j1'");
            assert!(bad_state.contains("CHECK constraint failed"), "{bad_state}");
            let bad_outcome = refused("UPDATE job_attempts SET outcome = 'ok' WHERE id = 1");
            assert!(
                bad_outcome.contains("CHECK constraint failed"),
                "{bad_outcome}"
            );
            conn.execute_batch(&format!("{ATTEMPT_END}; UPDATE jobs SET state = 'done'"))
                .unwrap();
        }
        let (jobs, check): (i64, String) = conn
            .query_row(
                "SELECT (SELECT count(*) FROM jobs), (SELECT quick_check FROM pragma_quick_check)",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!((jobs, check.as_str()), (1, "ok"));
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
        let error = format!("{:#}", open_existing_connection(&config).unwrap_err());
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
        let error = format!("{:#}", open_existing_connection(&config).unwrap_err());
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

    fn damaged_ledger(config: &SqliteConfig) -> Vec<u8> {
        SqliteLedger::open(config).unwrap().stop();
        integrity::damage_for_test(&config.path)
    }

    /// The start no longer reads the whole ledger before serving: the check runs after, finds
    /// the damage, and from then on nothing is acknowledged; the next start checks before
    /// serving and refuses it, until the ledger is whole again.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_damaged_ledger_is_caught_after_the_start_and_refused_at_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path());
        let whole = damaged_ledger(&config);

        let ledger = tokio::task::spawn_blocking({
            let config = config.clone();
            move || SqliteLedger::open(&config).unwrap()
        })
        .await
        .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(60), ledger.failed())
            .await
            .expect("the check in the background finds the damage");
        assert!(ledger.is_damaged());
        let reason = ledger.readiness().unwrap_err();
        assert!(reason.contains("damage"), "{reason}");
        let refused = ledger.probe().await.unwrap_err().to_string();
        assert!(refused.contains("is damaged"), "{refused}");
        ledger.stop();
        let mark = std::fs::read_to_string(integrity::damage_mark(&config.path)).unwrap();
        assert!(mark.contains(".recover"), "{mark}");

        let error = SqliteLedger::open(&config).err().unwrap();
        assert!(error
            .downcast_ref::<crate::ledger::error::LedgerDamaged>()
            .is_some());
        let error = format!("{error:#}");
        assert!(error.contains("is damaged"), "{error}");
        assert!(error.contains(".recover"), "{error}");
        let unchecked = SqliteConfig {
            check_at_start: CheckAtStart::Off,
            ..config.clone()
        };
        SqliteLedger::open(&unchecked).unwrap().stop();

        // Restored: checked before serving once more, it passes, and the mark is gone.
        std::fs::write(&config.path, whole).unwrap();
        SqliteLedger::open(&config).unwrap().stop();
        assert!(!integrity::damage_mark(&config.path).exists());
    }

    #[test]
    fn check_before_serving_refuses_a_damaged_ledger_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = SqliteConfig {
            check_before_serving: true,
            ..test_config(dir.path())
        };
        damaged_ledger(&config);
        let error = format!("{:#}", SqliteLedger::open(&config).err().unwrap());
        assert!(error.contains("is damaged"), "{error}");
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
        let error = open_existing_connection(&test_config(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no ledger at"), "{error}");
    }
}
