//! `backup`: a consistent, checked copy of a live SQLite ledger.

use std::path::Path;

use anyhow::{bail, Context};
use rusqlite::{Connection, OpenFlags};

use super::open::{create_private_file, open_existing_connection};
use crate::config::SqliteConfig;

/// What `backup` made.
#[derive(Debug, Clone)]
pub struct BackupReport {
    pub jobs: u64,
    pub bytes: u64,
}

/// Writes a consistent copy of the ledger to `target` while the service may be running
/// (`VACUUM INTO`: one read transaction, so writers go on), private to its owner, then runs
/// `PRAGMA integrity_check` on the copy. Refuses to overwrite anything.
pub fn backup(config: &SqliteConfig, target: &Path) -> anyhow::Result<BackupReport> {
    let conn = open_existing_connection(config)?;
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
