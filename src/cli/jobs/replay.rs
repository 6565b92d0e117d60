//! `jobs replay`: a job's stored body through another handler, once, recorded in its history.

use std::time::Duration;

use anyhow::{bail, Context};
use sume_receiver::config::{Config, HandlerKind};
use sume_receiver::handler::{AttemptError, Handler};
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, Ledger};
use sume_receiver::logging::Escaped;
use sume_receiver::route_name::RouteName;

use crate::cli::actor::actor;

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("through").required(true).args(["url", "command"]))]
pub struct Replay {
    /// The job's id, as Sume sends it (`job_id` in the delivery).
    job_id: JobId,
    /// An HTTP handler: POST the body to this http:// or https:// URL (https trusts the
    /// system's CAs and the configured `handler.ca_file`).
    #[arg(long)]
    url: Option<String>,
    /// A command handler, after `--`: the program and its arguments (the body on stdin).
    #[arg(last = true, value_name = "PROGRAM")]
    command: Vec<String>,
    /// Give up on the handler after this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

impl Replay {
    pub(super) async fn run(self, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
        let job_id = self.job_id;
        let kind = match self.url {
            Some(url) => HandlerKind::url(url),
            None => HandlerKind::command(self.command),
        }
        .map_err(anyhow::Error::msg)?;
        let attempt = stored_attempt(ledger, &job_id).await?;
        // The configured handler's CA, for a replay to the same https downstream.
        let ca_file = config.handler.as_ref().and_then(|h| h.ca_file.as_deref());
        let handler = Handler::new(kind.clone(), ca_file)?;
        let started = std::time::Instant::now();
        let result = handler
            .run(
                &attempt,
                self.timeout,
                &tokio_util::sync::CancellationToken::new(),
                sume_receiver::traces::Within::nothing(),
            )
            .await;
        let reason = format!(
            "through {}: {}",
            kind.describe(),
            outcome(&result, started.elapsed())
        );
        ledger
            .record_action(
                &job_id,
                ledger::ActionTaken {
                    action: "replay",
                    actor: &actor(Some(&reason)),
                },
                ledger::now_ms(),
            )
            .await
            .context("the replay ran, but its record could not be written")?;
        println!("job {job_id} replayed {}", Escaped(&reason));
        if result.is_err() {
            bail!("the replay failed (recorded in the job's history)");
        }
        Ok(())
    }
}

/// The job's stored body as an attempt numbered 0 (a replay, not one of its attempts).
async fn stored_attempt(ledger: &Ledger, job_id: &JobId) -> anyhow::Result<ledger::Attempt> {
    let job = ledger
        .show_job(job_id)
        .await?
        .with_context(|| format!("no job {job_id:?} in the ledger"))?;
    let body = job.body.with_context(|| {
        format!("job {job_id:?} has no stored body any more (retention purged it)")
    })?;
    Ok(ledger::Attempt {
        job_id: job_id.clone(),
        route: RouteName::default_route(),
        number: 0,
        event_type: job.summary.event_type,
        source: ledger::Source::parse(&job.summary.source),
        body,
        rows: None,
    })
}

/// How the replay ended and after how long, for its record.
fn outcome(result: &Result<(), AttemptError>, took: Duration) -> String {
    let took = humantime::format_duration(Duration::from_millis(
        u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
    ));
    match result {
        Ok(()) => format!("done after {took}"),
        Err(AttemptError::Failed(failure, _)) => format!("failed after {took}: {}", failure.error),
        Err(AttemptError::Interrupted) => format!("interrupted after {took}"),
    }
}
