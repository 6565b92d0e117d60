//! `check-config`: what `serve` would refuse in the configuration, and what it would warn of.

use std::time::Duration;

use anyhow::{bail, Context};
use sume_receiver::check::{check, Unreadable};
use sume_receiver::config::Config;
use sume_receiver::ledger::Ledger;
use sume_receiver::logging::Escaped;

/// How long the check waits for the ledger: it runs before each start and reload (the unit's
/// ExecStartPre= and ExecReload=), which a ledger out of reach must not hold up.
const LEDGER_WAIT: Duration = Duration::from_secs(3);

/// Prints the findings; `Err` if `serve` would refuse the configuration, or with `strict` if a
/// secret is weak or exposed. `strict` runs as the service's user: an unreadable credential is
/// an error, as for `serve`; a weak or exposed secret is an error of `--strict` alone (`serve`
/// warns of it, and the unit runs `--strict` before each start).
pub(super) async fn check_config(config: &Config, strict: bool) -> anyhow::Result<()> {
    let unreadable = if strict {
        Unreadable::Error
    } else {
        Unreadable::Warning
    };
    let mut findings = check(config, unreadable);
    match work_of_routes_not_in(config).await {
        Ok(not_here) => findings
            .warnings
            .extend(not_here.into_iter().map(|(route, waiting)| {
                format!(
                    "the ledger keeps {waiting} job(s)' work for route {}, which this config \
                     does not have: it waits, unrun, until a route of that name comes back",
                    Escaped(&route)
                )
            })),
        Err(why) => findings.notes.push(format!(
            "the ledger was not read for work of routes not in this config: {why}"
        )),
    }
    // Weak or exposed secrets: what `--strict` (the unit's check before a start) refuses.
    let weak = std::mem::take(&mut findings.weak_secrets);
    if !strict {
        findings.warnings.extend(weak.iter().cloned());
    }
    for note in &findings.notes {
        println!("{note}");
    }
    for warning in &findings.warnings {
        println!("warning: {warning}");
    }
    let strict_errors = if strict { weak.as_slice() } else { &[] };
    for error in findings.errors.iter().chain(strict_errors) {
        println!("error: {error}");
    }
    findings
        .refuse_errors()
        .context("`serve` would refuse it")?;
    if !strict_errors.is_empty() {
        bail!(
            "--strict refuses {} weak or exposed secret(s): `serve` alone would start and warn \
             of each (the unit runs this check before each start and reload)",
            strict_errors.len()
        );
    }
    println!(
        "configuration is valid ({} warning(s))",
        findings.warnings.len()
    );
    Ok(())
}

/// The work the ledger keeps for routes this config does not have (route, waiting). Nothing to
/// read without routes, or before the service made the ledger.
async fn work_of_routes_not_in(config: &Config) -> Result<Vec<(String, u64)>, String> {
    let not_made = config
        .database
        .sqlite_path()
        .is_some_and(|path| !path.exists());
    if config.routes.list().is_empty() || not_made {
        return Ok(Vec::new());
    }
    let read = async {
        let ledger = Ledger::open_existing(&config.database)
            .await
            .map_err(|error| format!("{error:#}"))?;
        let snapshot = ledger.metrics_snapshot().await;
        ledger.close().await;
        snapshot.map_err(|error| error.to_string())
    };
    let snapshot = tokio::time::timeout(LEDGER_WAIT, read)
        .await
        .map_err(|_| format!("no answer within {}s", LEDGER_WAIT.as_secs()))??;
    Ok(config.routes.work_not_here(&snapshot.work))
}
