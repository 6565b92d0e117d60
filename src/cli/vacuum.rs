//! `vacuum`: retention applied now, on the ledger the service may be running on.

use sume_receiver::config::Config;
use sume_receiver::ledger::Ledger;
use sume_receiver::vacuum::Vacuum;

pub(super) async fn vacuum(config: &Config) -> anyhow::Result<()> {
    // Refuses a missing or unmigrated ledger before opening it as the service does.
    Ledger::open_existing(&config.database).await?.close().await;
    let ledger = Ledger::open(&config.database).await?;
    // Ctrl-C stops it between batches, like a shutdown of the service.
    let interrupted = tokio_util::sync::CancellationToken::new();
    let on_ctrl_c = interrupted.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    let report = Vacuum::new(ledger.clone(), config.retention.clone(), interrupted)
        .vacuum_once()
        .await;
    ledger.close().await;
    let report = report?;
    println!(
        "purged {} bodies, forgot {} jobs and {} expectations",
        report.bodies_purged, report.jobs_forgotten, report.expectations_forgotten
    );
    Ok(())
}
