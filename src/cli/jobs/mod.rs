//! `jobs ...`: the verbs on the ledger's jobs, one file each, behind this dispatcher; the actions
//! among them are the library's `actions.rs`, shared with the console and the admin API.

mod cancel;
mod dispatch;
mod expect;
mod list;
mod redeliver;
mod render;
mod replay;
mod retry;
mod run_now;
mod show;
mod stats;

use std::sync::OnceLock;
use std::time::Duration;

use clap::Subcommand;
use sume_receiver::actions::{Actions, Refused};
use sume_receiver::config::Config;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::Ledger;
use sume_receiver::logging::Escaped;
use sume_receiver::traces::{Exporter, Tracer};

/// How long a command waits, once done, to hand its spans to the collector: a collector that is
/// down costs the operator this much at most, and the spans.
const FLUSH_WAIT: Duration = Duration::from_secs(3);

/// The tracer of this process's one command: its actions are spans with their actor, as the
/// service's are (`[tracing]`); off without it.
static TRACER: OnceLock<Tracer> = OnceLock::new();

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs, newest first: by when they were received, or in one state by that state's
    /// time (due, lease expiry, finished).
    List(list::List),
    /// Show one job: state, times, last error, body, and its history: every attempt and
    /// every operator action.
    Show(show::Show),
    /// Run a `done` or `dead` job again from its stored body; or, with --state, every one that
    /// matches the filters (an exact count first; nothing changes without --yes).
    Retry(retry::Retry),
    /// Run a `retrying` job now instead of at the end of its backoff.
    RunNow(run_now::RunNow),
    /// Make a waiting job (`claimed` or `retrying`) dead without running it; the ledger keeps
    /// it, so Sume's redeliveries of it stay duplicates.
    Cancel(cancel::Cancel),
    /// Run a job's stored body through another handler, once, from this command; the job's
    /// state does not change, its history records the replay and how it ended (a fixed
    /// endpoint, a debugging script). `SUME_ATTEMPT` is 0 for a replay.
    Replay(replay::Replay),
    /// Stop running jobs (of every route, or of `--route`'s), on every receiver of this
    /// ledger; deliveries are still received and claimed, and wait. For a downstream outage:
    /// attempts are not burnt into the dead letter.
    Pause(dispatch::Pause),
    /// Run jobs again after `jobs pause` (of every route, or of `--route`'s).
    Resume(dispatch::Resume),
    /// Counts by state, the oldest unfinished job, last hour's deliveries, dead in the last day.
    Stats(stats::Stats),
    /// Register a job the application submitted to Sume: if its webhook never arrives, the
    /// service polls Sume for it. Idempotent.
    Expect(expect::Expect),
    /// List registered expected jobs and what polling found.
    Expected(expect::Expected),
    /// Ask Sume to send the job's webhook again (POST /v1/jobs/{job_id}/webhook/redeliver).
    Redeliver(redeliver::Redeliver),
}

impl JobsCommand {
    /// Whether it is an operator's action on the ledger's jobs or dispatch: a span of its own
    /// when `[tracing]` is on. The reads (`list`, `show`, `stats`...) start no tracer.
    fn acts(&self) -> bool {
        matches!(
            self,
            JobsCommand::Retry(_)
                | JobsCommand::RunNow(_)
                | JobsCommand::Cancel(_)
                | JobsCommand::Pause(_)
                | JobsCommand::Resume(_)
        )
    }
}

/// Runs a `jobs` command: on the ledger, opened for it and closed after.
pub(super) async fn execute(command: JobsCommand, config: &Config) -> anyhow::Result<()> {
    // `redeliver` talks to Sume and needs no ledger.
    if let JobsCommand::Redeliver(redeliver) = &command {
        return redeliver.run(config).await;
    }
    let ledger = Ledger::open_existing(&config.database).await?;
    let exporter = command.acts().then(|| start_tracing(config)).flatten();
    let done = on_ledger(command, config, &ledger).await;
    ledger.close().await;
    if let Some(mut exporter) = exporter {
        let flushed = tokio::time::timeout(FLUSH_WAIT, async {
            while exporter.export_once().await > 0 {}
        });
        if flushed.await.is_err() {
            eprintln!(
                "warning: the OTLP collector took more than {}s: this command's spans are lost",
                FLUSH_WAIT.as_secs()
            );
        }
    }
    done
}

/// With `[tracing]`, the command's tracer and the exporter to flush once it is done. A trace
/// setting that cannot be used costs the spans, never the command.
fn start_tracing(config: &Config) -> Option<Exporter> {
    let tracing = config.tracing.as_ref()?;
    let started = tracing
        .headers()
        .and_then(|headers| sume_receiver::traces::start(Some(tracing), &headers));
    match started {
        Ok((tracer, exporter)) => {
            let _ = TRACER.set(tracer);
            exporter
        }
        Err(error) => {
            eprintln!("warning: this command's spans are not exported: {error:#}");
            None
        }
    }
}

async fn on_ledger(command: JobsCommand, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
    match command {
        JobsCommand::List(list) => list.run(ledger).await,
        JobsCommand::Show(show) => show.run(ledger).await,
        JobsCommand::Retry(retry) => retry.run(config, ledger).await,
        JobsCommand::RunNow(run_now) => run_now.run(config, ledger).await,
        JobsCommand::Cancel(cancel) => cancel.run(ledger).await,
        JobsCommand::Replay(replay) => replay.run(config, ledger).await,
        JobsCommand::Pause(pause) => pause.run(config, ledger).await,
        JobsCommand::Resume(resume) => resume.run(config, ledger).await,
        JobsCommand::Stats(stats) => stats.run(ledger).await,
        JobsCommand::Expect(expect) => expect.run(config, ledger).await,
        JobsCommand::Expected(expected) => expected.run(ledger).await,
        JobsCommand::Redeliver(_) => unreachable!("answered without a ledger above"),
    }
}

/// The operators' actions as the command line takes them: no local worker to wake, the
/// service's finds the change on its next look.
fn actions(ledger: &Ledger) -> Actions<'_> {
    Actions {
        ledger,
        queue: None,
        tracer: TRACER.get().unwrap_or(Tracer::off()),
    }
}

/// Why an action changed nothing, in the command line's words: the job named by its id.
fn refused(job_id: &JobId, refusal: Refused) -> anyhow::Error {
    match refusal {
        Refused::Unknown => anyhow::anyhow!("no job {job_id:?} in the ledger"),
        Refused::NotApplicable {
            state,
            action,
            applies_to,
        } => anyhow::anyhow!("job {job_id:?} is {state}; {action} applies to {applies_to}"),
        Refused::Storage(error) => anyhow::Error::new(error).context("cannot change the job"),
        refusal => anyhow::Error::new(refusal),
    }
}

/// `text` as one shell word: as it is when it is plain, else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@%+=,".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", Escaped(text).to_string().replace('\'', r"'\''"))
    }
}

/// Who picks up a job made due from the command line, and when.
async fn who_runs_it(config: &Config, ledger: &Ledger) -> String {
    // Paused, no worker picks it up until someone resumes (not "within 1s").
    if ledger
        .dispatch()
        .await
        .is_ok_and(|dispatch| dispatch.paused)
    {
        return "; dispatch is paused, so it runs once `jobs resume` resumes it".to_owned();
    }
    let Some(path) = config.database.sqlite_path() else {
        return ": the receivers were notified, and one picks it up as soon as a worker slot is \
                free"
            .to_owned();
    };
    if sume_receiver::instance_lock::service_running(path) {
        let within = humantime::format_duration(sume_receiver::worker::IDLE_LOOK);
        format!(": the running service picks it up within {within} (or as soon as a worker slot is free)")
    } else {
        "; no service is running on this ledger, so it runs at the next start".to_owned()
    }
}
