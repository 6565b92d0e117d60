//! `check-config`: what `serve` would refuse in the configuration, and what it would warn of.

use anyhow::{bail, Context};
use sume_receiver::check::{check, Unreadable};
use sume_receiver::config::Config;

/// Prints the findings; `Err` if `serve` would refuse the configuration, or with `strict` if a
/// secret is weak or exposed. `strict` runs as the service's user: an unreadable credential is
/// an error, as for `serve`; a weak or exposed secret is an error of `--strict` alone (`serve`
/// warns of it, and the unit runs `--strict` before each start).
pub(super) fn check_config(config: &Config, strict: bool) -> anyhow::Result<()> {
    let unreadable = if strict {
        Unreadable::Error
    } else {
        Unreadable::Warning
    };
    let mut findings = check(config, unreadable);
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
