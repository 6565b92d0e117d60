//! `check-config`: what `serve` would refuse in the configuration, and what it would warn of.

use anyhow::Context;
use sume_receiver::check::{check, Unreadable};
use sume_receiver::config::Config;

/// Prints the findings; `Err` if `serve` would refuse the configuration. `strict` runs as the
/// service does: an unreadable credential and a weak admin token are errors.
pub(super) fn check_config(config: &Config, strict: bool) -> anyhow::Result<()> {
    let unreadable = if strict {
        Unreadable::Error
    } else {
        Unreadable::Warning
    };
    let mut findings = check(config, unreadable);
    // Weak admin tokens: what `--strict` (the unit's check before a start) refuses.
    let weak = std::mem::take(&mut findings.weak_tokens);
    if strict {
        findings.errors.extend(weak);
    } else {
        findings.warnings.extend(weak);
    }
    for note in &findings.notes {
        println!("{note}");
    }
    for warning in &findings.warnings {
        println!("warning: {warning}");
    }
    for error in &findings.errors {
        println!("error: {error}");
    }
    findings
        .refuse_errors()
        .context("`serve` would refuse it")?;
    println!(
        "configuration is valid ({} warning(s))",
        findings.warnings.len()
    );
    Ok(())
}
