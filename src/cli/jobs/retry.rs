//! `jobs retry`: one job by its id; or, with `--state` or `--group`, every job that matches,
//! counted first, then retried a batch at a time.

use anyhow::{bail, Context};
use sume_receiver::actions::JobAction;
use sume_receiver::config::Config;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, Ledger, State};
use sume_receiver::route_name::RouteName;

use super::{actions, refused, shell_word, who_runs_it};
use crate::cli::actor::actor;

/// How many jobs a bulk retry changes per transaction: claims keep committing in between.
const RETRY_BATCH: usize = 500;

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["job_id", "state"]))]
pub struct Retry {
    /// The job's id, as Sume sends it (`job_id` in the delivery).
    job_id: Option<JobId>,
    /// Every job in this state (dead or done) that matches the other filters.
    #[arg(long, conflicts_with = "job_id")]
    state: Option<State>,
    /// Only jobs that finished within this long ago ("1h", "2d").
    #[arg(long, requires = "state", value_parser = humantime::parse_duration)]
    since: Option<std::time::Duration>,
    /// Only jobs whose last error contains this text (case-sensitive).
    #[arg(long, requires = "state", value_name = "TEXT")]
    error_contains: Option<String>,
    /// Only the dead jobs of this dead-letter group: its signature, as the console's Dead
    /// letters page and `/console/api/dead` show it.
    #[arg(long, requires = "state", conflicts_with_all = ["since", "error_contains"], value_name = "SIGNATURE")]
    group: Option<String>,
    /// Retry them (without it, only count them).
    #[arg(long, requires = "state")]
    yes: bool,
    /// With a job id: only the job's work on this route (done or dead), not its other routes'.
    #[arg(long, requires = "job_id", value_parser = RouteName::parse)]
    route: Option<RouteName>,
}

impl Retry {
    pub(super) async fn run(self, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
        if let Some(job_id) = self.job_id {
            actions(ledger)
                .on_job(JobAction::Retry, &job_id, self.route.as_ref(), &actor(None))
                .await
                .map_err(|refusal| refused(&job_id, refusal))?;
            println!(
                "job {job_id} is queued to run again{}",
                who_runs_it(config, ledger).await
            );
            return Ok(());
        }
        let state = self.state.expect("clap requires a job_id or --state");
        if let Some(signature) = self.group {
            if state != State::Dead {
                bail!("--group: dead-letter groups are of dead jobs (--state dead)");
            }
            return retry_group(ledger, &signature, self.yes).await;
        }
        if !state.is_finished() {
            bail!("--state {state}: only done or dead jobs can be retried");
        }
        let now = ledger::now_ms();
        let filter = ledger::RetryFilter {
            state,
            finished_since: self.since.map(|since| now - ledger::duration_ms(since)),
            finished_before: now,
            error_contains: self.error_contains,
        };
        retry_matching(ledger, &filter, self.yes, config).await
    }
}

/// `jobs retry --state ...`: the exact count, and with `yes` the retry, a batch at a time.
async fn retry_matching(
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
    let by = actor(Some(&reason));
    let mut retried = 0;
    loop {
        let batch = ledger
            .retry_matching(filter, &by, ledger::now_ms(), RETRY_BATCH)
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
async fn retry_group(ledger: &Ledger, signature: &str, yes: bool) -> anyhow::Result<()> {
    if !yes {
        let jobs = ledger.dead_group_jobs(signature).await?;
        println!(
            "{} dead jobs in the group {signature:?}; add --yes to retry them",
            jobs.len()
        );
        return Ok(());
    }
    // In batches, as the console does: each a short run of transactions, with progress.
    let by = actor(None);
    let (mut retried, mut refused) = (0, 0);
    loop {
        let batch = actions(ledger).retry_dead_group(signature, &by).await?;
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
