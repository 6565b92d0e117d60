//! `jobs retry --state ...` and `--group`: what matches, counted first, then retried a batch at a time.

use anyhow::Context;
use sume_receiver::config::Config;
use sume_receiver::ledger::{self, Ledger};

use super::{actor, shell_word, who_runs_it};

/// How many jobs a bulk retry changes per transaction: claims keep committing in between.
const RETRY_BATCH: usize = 500;

/// `jobs retry --state ...`: the exact count, and with `yes` the retry, a batch at a time.
pub(super) async fn retry_matching(
    ledger: &Ledger,
    filter: &ledger::RetryFilter,
    yes: bool,
    config: &Config,
) -> anyhow::Result<()> {
    let count = ledger
        .count_retry_matching(filter)
        .await
        .context("cannot count the jobs to retry")?;
    let purged = if count.body_purged > 0 {
        format!(
            " ({} more match, but retention purged their bodies: they cannot run again)",
            count.body_purged
        )
    } else {
        String::new()
    };
    if !yes {
        println!(
            "{} {} job(s) match{purged}; add --yes to retry them",
            count.retryable, filter.state
        );
        return Ok(());
    }
    let reason = retry_reason(filter);
    let by = actor();
    let mut retried = 0;
    loop {
        let batch = ledger
            .retry_matching(filter, &by, &reason, ledger::now_ms(), RETRY_BATCH)
            .await
            .with_context(|| format!("stopped after retrying {retried} job(s)"))?;
        if batch == 0 {
            break;
        }
        retried += batch;
    }
    println!(
        "{retried} job(s) are queued to run again{purged}{}",
        who_runs_it(config, ledger).await
    );
    Ok(())
}

/// The filter of a bulk retry as its actions record it.
fn retry_reason(filter: &ledger::RetryFilter) -> String {
    let mut reason = format!("bulk retry: --state {}", filter.state);
    if let Some(since) = filter.finished_since {
        reason.push_str(&format!(
            " --since {}",
            humantime::format_duration(std::time::Duration::from_millis(
                u64::try_from(filter.finished_before - since).unwrap_or(0)
            ))
        ));
    }
    if let Some(text) = &filter.error_contains {
        reason.push_str(&format!(" --error-contains {}", shell_word(text)));
    }
    reason
}

/// `jobs retry --state dead --group SIGNATURE`: counts the group, and with `yes` retries it.
pub(super) async fn retry_group(ledger: &Ledger, signature: &str, yes: bool) -> anyhow::Result<()> {
    if !yes {
        let jobs = ledger.dead_group_jobs(signature).await?;
        println!(
            "{} dead jobs in the group {signature:?}; add --yes to retry them",
            jobs.len()
        );
        return Ok(());
    }
    // In batches, as the console does: each a short run of transactions, with progress.
    let (mut retried, mut refused) = (0, 0);
    loop {
        let batch = ledger
            .retry_dead_group(
                signature,
                &actor(),
                ledger::now_ms(),
                ledger::GROUP_RETRY_BATCH,
            )
            .await?;
        retried += batch.retried;
        refused += batch.refused;
        if batch.left > 0 {
            println!("{retried} retried, {} left...", batch.left);
        }
        // A batch that retried nothing met only jobs that cannot be: the rest would be the same.
        if batch.left == 0 || batch.retried == 0 {
            break;
        }
    }
    let (jobs, are) = if retried == 1 {
        ("job", "is")
    } else {
        ("jobs", "are")
    };
    println!("{retried} {jobs} of the group {signature:?} {are} queued to run again");
    if refused > 0 {
        println!("{refused} could not be: retention purged their body, or they left the group");
    }
    Ok(())
}
