//! `backup`: a consistent, checked copy of a SQLite ledger while the service runs.

use std::path::Path;

use anyhow::bail;
use sume_receiver::config::{Config, LedgerConfig};
use sume_receiver::ledger;

pub(super) async fn backup(config: &Config, path: &Path) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let LedgerConfig::Sqlite(database) = config.database.clone() else {
        bail!(
            "backup copies a SQLite ledger; this ledger is PostgreSQL (database.url): \
             back it up with pg_dump or your provider's backups (the jobs and \
             expected_jobs tables)"
        );
    };
    let target = path.to_owned();
    let report = tokio::task::spawn_blocking(move || ledger::backup(&database, &target)).await??;
    println!(
        "backed up {} jobs to {} ({:.1} MiB) in {:.1} s; integrity_check ok",
        report.jobs,
        path.display(),
        report.bytes as f64 / (1024.0 * 1024.0),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
