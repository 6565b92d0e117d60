//! A PostgreSQL ledger's start: the first connection, the durability checks, the migrations.

use std::time::Duration;

use anyhow::{bail, Context};
use tokio_postgres::Client;

use super::connection::Tls;
use super::role::error_text;

/// Schema migrations, applied in order; the `sume_schema` table records how many have run.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_jobs.sql"),
    include_str!("../../../migrations/postgres/0002_expected_jobs.sql"),
    include_str!("../../../migrations/postgres/0003_leased_by.sql"),
    include_str!("../../../migrations/postgres/0004_history.sql"),
    include_str!("../../../migrations/postgres/0005_job_counts.sql"),
    include_str!("../../../migrations/postgres/0006_hold.sql"),
    include_str!("../../../migrations/postgres/0007_dispatch_stops.sql"),
    include_str!("../../../migrations/postgres/0008_minute_rollups.sql"),
    include_str!("../../../migrations/postgres/0009_routes.sql"),
    include_str!("../../../migrations/postgres/0010_trace_context.sql"),
];
/// The advisory lock that serialises migrations between receivers starting at once.
const MIGRATION_LOCK: i64 = 0x5355_4d45_0001;
/// How long a start waits for PostgreSQL to accept connections (a machine booting with its
/// database, a failover in progress) before it gives up; the unit's TimeoutStartSec is longer,
/// and systemd would otherwise give up after a few quick restarts.
const START_PATIENCE: Duration = Duration::from_secs(60);
/// How often a start tries again meanwhile.
const START_RETRY: Duration = Duration::from_millis(500);

/// The first connection of a start: tried again while PostgreSQL is not there yet (refused,
/// unreachable, starting up, shutting down) for up to [`START_PATIENCE`]; any other failure
/// (authentication, TLS, no such database) ends the start at once.
pub(super) async fn connect_at_start(
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
pub(super) async fn check_durability(
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
pub(super) async fn migrate(
    client: &mut tokio_postgres::Client,
    location: &str,
) -> anyhow::Result<()> {
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
