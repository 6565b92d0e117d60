//! The command line: `serve`, `check-config`, `vacuum`, `loadgen`, and `jobs ...` on the ledger.
//! The binary's side of the house: the library serves, this parses and prints.

mod actor;
mod generate;
mod render;
mod retry;
mod send;

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use actor::actor;
pub use generate::generate;
use render::{expectations_table, job_details, jobs_table, readable_json, stats_table};
use retry::{retry_group, retry_matching};
use sume_receiver::config::{self, Config, LedgerConfig};
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, Ledger, State};
use sume_receiver::logging::Escaped;
use sume_receiver::vacuum::Vacuum;

/// `--version`: the crate version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("SUME_RECEIVER_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "sume-receiver",
    version = VERSION,
    about = "Receives Sume job webhooks and runs each job's work exactly once."
)]
pub struct Cli {
    /// Configuration file (TOML).
    #[arg(long, short, global = true, default_value = config::DEFAULT_PATH)]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service: receive webhooks, claim them, run their handlers.
    Serve {
        /// Listen on this address instead of the config's `server.listen` (a second receiver
        /// on the same machine, a port taken).
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
    },
    /// Validate the configuration file and exit.
    CheckConfig {
        /// Run as the service's user (the unit's ExecStartPre= and ExecReload=): a credential
        /// file it cannot read is an error, as it is for `serve`.
        #[arg(long)]
        strict: bool,
    },
    /// Inspect and retry jobs in the ledger (works while the service runs).
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Apply retention now (purge old bodies, forget old job_ids); safe while the service runs.
    Vacuum,
    /// Write a consistent copy of the ledger to a new file while the service runs, then check
    /// the copy (PRAGMA integrity_check).
    Backup {
        /// The file to create (it must not exist).
        path: PathBuf,
    },
    /// Sign a test delivery with the newest secret and send it to the receiver; prints the
    /// status, the answer and the latency.
    SendTest(send::SendTestArgs),
    /// Print the two signature headers for a body, and a ready curl line.
    Sign(send::SignArgs),
    /// Benchmark a running receiver: send signed deliveries, report, check its ledger.
    #[cfg(feature = "bench")]
    Loadgen(sume_receiver::loadgen::LoadgenArgs),
    /// Benchmark: a bare hyper server (read the body, answer fixed JSON; no signature, no
    /// ledger) on the configured listener, the HTTP floor the receiver is measured against.
    #[cfg(feature = "bench")]
    HttpFloor,
    /// Print the man page or shell completions (for packagers); needs no config.
    #[command(subcommand)]
    Generate(Generate),
}

#[derive(Debug, Subcommand)]
pub enum Generate {
    /// The man page, sume-receiver(1), in roff.
    Man,
    /// Completions for a shell.
    Completions { shell: clap_complete::Shell },
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs, newest first: by when they were received, or in one state by that state's
    /// time (due, lease expiry, finished).
    List {
        /// Only jobs in this state: claimed, running, retrying, done or dead.
        #[arg(long)]
        state: Option<State>,
        /// Only jobs of this event type (not indexed: a page reads at most 10,000 jobs of
        /// its list, and may end short with the cursor to go on from).
        #[arg(long, value_name = "TYPE")]
        event_type: Option<String>,
        /// Only jobs whose time in the list (received; due; finished) is within this long
        /// ago ("1h", "2d").
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
        /// At most this many jobs; a full page ends with the cursor of the next one.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The page after this cursor (`<ms>:<job_id>`, as the previous page printed it).
        #[arg(long, value_name = "CURSOR")]
        after: Option<ledger::Cursor>,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job: state, times, last error, body, and its history: every attempt and
    /// every operator action.
    Show {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a `done` or `dead` job again from its stored body; or, with --state, every one that
    /// matches the filters (an exact count first; nothing changes without --yes).
    #[command(group = clap::ArgGroup::new("which").required(true).args(["job_id", "state"]))]
    Retry {
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
    },
    /// Run a `retrying` job now instead of at the end of its backoff.
    RunNow {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
    },
    /// Make a waiting job (`claimed` or `retrying`) dead without running it; the ledger keeps
    /// it, so Sume's redeliveries of it stay duplicates.
    Cancel {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
        /// Why: recorded in the job's history and as its last error.
        #[arg(long)]
        reason: String,
    },
    /// Run a job's stored body through another handler, once, from this command; the job's
    /// state does not change, its history records the replay and how it ended (a fixed
    /// endpoint, a debugging script). `SUME_ATTEMPT` is 0 for a replay.
    #[command(group = clap::ArgGroup::new("through").required(true).args(["url", "command"]))]
    Replay {
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
        timeout: std::time::Duration,
    },
    /// Stop running jobs, on every receiver of this ledger; deliveries are still received and
    /// claimed, and wait. For a downstream outage: attempts are not burnt into the dead letter.
    Pause {
        /// Why, for the timelines of the jobs the pause delays.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Run jobs again after `jobs pause`.
    Resume,
    /// Counts by state, the oldest unfinished job, last hour's deliveries, dead in the last day.
    Stats {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Register a job the application submitted to Sume: if its webhook never arrives, the
    /// service polls Sume for it. Idempotent.
    Expect {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
    },
    /// List registered expected jobs and what polling found.
    Expected {
        /// At most this many, the most recently registered first.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Ask Sume to send the job's webhook again (POST /v1/jobs/{job_id}/webhook/redeliver).
    Redeliver {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
    },
}

/// Runs a command that is not `serve`, on the process's runtime (`main.rs`).
pub async fn execute(command: Command, config: &Config) -> anyhow::Result<()> {
    match command {
        Command::Serve { .. } | Command::Generate(_) => unreachable!("started by main"),
        Command::CheckConfig { strict } => {
            let unreadable = if strict {
                sume_receiver::check::Unreadable::Error
            } else {
                sume_receiver::check::Unreadable::Warning
            };
            let mut findings = sume_receiver::check::check(config, unreadable);
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
        Command::Jobs(jobs) => execute_jobs(jobs, config).await,
        Command::Vacuum => {
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
        Command::Backup { path } => {
            let started = std::time::Instant::now();
            let LedgerConfig::Sqlite(database) = config.database.clone() else {
                bail!(
                    "backup copies a SQLite ledger; this ledger is PostgreSQL (database.url): \
                     back it up with pg_dump or your provider's backups (the jobs and \
                     expected_jobs tables)"
                );
            };
            let target = path.clone();
            let report =
                tokio::task::spawn_blocking(move || ledger::backup(&database, &target)).await??;
            println!(
                "backed up {} jobs to {} ({:.1} MiB) in {:.1} s; integrity_check ok",
                report.jobs,
                path.display(),
                report.bytes as f64 / (1024.0 * 1024.0),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Sign(args) => send::sign(&args, config),
        Command::SendTest(args) => send::send_test(&args, config).await,
        #[cfg(feature = "bench")]
        Command::HttpFloor => {
            let listener = tokio::net::TcpListener::bind(config.server.listen).await?;
            sume_receiver::loadgen::serve_http_floor(listener, config.server.tls.as_ref()).await
        }
        #[cfg(feature = "bench")]
        Command::Loadgen(args) => {
            let json = args.json;
            let report = sume_receiver::loadgen::run(args, config.clone()).await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                report.print();
            }
            Ok(())
        }
    }
}

async fn execute_jobs(command: JobsCommand, config: &Config) -> anyhow::Result<()> {
    // `redeliver` talks to Sume and needs no ledger.
    if let JobsCommand::Redeliver { job_id } = &command {
        return redeliver(job_id, config).await;
    }
    let ledger = Ledger::open_existing(&config.database).await?;
    let done = inspect(command, config, &ledger).await;
    ledger.close().await;
    done
}

/// Runs a `jobs` command on the command line's ledger.
async fn inspect(command: JobsCommand, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
    match command {
        JobsCommand::List {
            state,
            event_type,
            since,
            limit,
            after,
            json,
        } => {
            let filter = ledger::JobFilter {
                state,
                event_type,
                since: since.map(|since| ledger::now_ms() - ledger::duration_ms(since)),
                before: None,
            };
            let page = ledger
                .find_jobs(&filter, after.as_ref(), limit)
                .await
                .context("cannot list jobs")?;
            if json {
                let jobs: Vec<serde_json::Value> = page
                    .jobs
                    .iter()
                    .map(readable_json)
                    .collect::<Result<_, _>>()?;
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                print!("{}", jobs_table(&page.jobs));
            }
            if let Some(next) = page.next {
                // On stderr: the JSON on stdout stays one array.
                eprintln!("next page: --after {}", shell_word(&next.to_string()));
            }
        }
        JobsCommand::Show { job_id, json } => {
            let job = ledger
                .show_job(&job_id)
                .await
                .context("cannot read the job")?
                .with_context(|| format!("no job {job_id:?} in the ledger"))?;
            let stops = ledger
                .stops_delaying(&job, ledger::now_ms())
                .await
                .context("cannot read the stops of dispatch")?;
            if json {
                let mut json = readable_json(&job)?;
                let stops: Vec<_> = stops.iter().map(readable_json).collect::<Result<_, _>>()?;
                json["delayed_by"] = stops.into();
                println!("{}", serde_json::to_string_pretty(&json)?);
            } else {
                print!("{}", job_details(&job, &stops));
            }
        }
        JobsCommand::Retry {
            job_id: Some(job_id),
            ..
        } => {
            ledger
                .retry_job(&job_id, &actor(), ledger::now_ms())
                .await?;
            println!(
                "job {job_id} is queued to run again{}",
                who_runs_it(config, ledger).await
            );
        }
        JobsCommand::Retry {
            job_id: None,
            state,
            since,
            error_contains,
            group,
            yes,
        } => {
            let state = state.expect("clap requires a job_id or --state");
            if let Some(signature) = group {
                if state != State::Dead {
                    bail!("--group: dead-letter groups are of dead jobs (--state dead)");
                }
                return retry_group(ledger, &signature, yes).await;
            }
            if !state.is_finished() {
                bail!("--state {state}: only done or dead jobs can be retried");
            }
            let now = ledger::now_ms();
            let filter = ledger::RetryFilter {
                state,
                finished_since: since.map(|since| now - ledger::duration_ms(since)),
                finished_before: now,
                error_contains,
            };
            retry_matching(ledger, &filter, yes, config).await?;
        }
        JobsCommand::Cancel { job_id, reason } => {
            if !ledger
                .cancel_job(&job_id, &actor(), &reason, ledger::now_ms())
                .await?
            {
                return Err(refusal(
                    ledger,
                    &job_id,
                    "only a claimed or retrying job can be cancelled",
                )
                .await);
            }
            println!("job {job_id} is dead (cancelled); `jobs retry {job_id}` would run it again");
        }
        JobsCommand::Pause { .. } | JobsCommand::Resume => {
            let reason = match &command {
                JobsCommand::Pause { reason } => reason.as_deref().filter(|r| !r.trim().is_empty()),
                _ => None,
            };
            let paused = matches!(command, JobsCommand::Pause { .. });
            let changed = ledger
                .set_dispatch(paused, &actor(), reason, ledger::now_ms())
                .await?;
            let receivers = if config.database.sqlite_path().is_some() {
                "the service"
            } else {
                "every receiver"
            };
            let within = humantime::format_duration(sume_receiver::worker::IDLE_LOOK);
            match (paused, changed) {
                (true, true) => println!("paused: {receivers} runs no new attempt from within {within}; running ones finish; deliveries are still claimed"),
                (false, true) => println!("resumed (a handler hold, if any, ended too): {receivers} runs due jobs again within {within}"),
                (true, false) => println!("already paused"),
                (false, false) => println!("not paused"),
            }
        }
        JobsCommand::Replay {
            job_id,
            url,
            command,
            timeout,
        } => {
            // The configured handler's CA, for a replay to the same https downstream.
            let ca_file = config.handler.as_ref().and_then(|h| h.ca_file.as_deref());
            replay(ledger, &job_id, (url, command), timeout, ca_file).await?
        }
        JobsCommand::RunNow { job_id } => {
            if !ledger.run_now(&job_id, &actor(), ledger::now_ms()).await? {
                return Err(refusal(ledger, &job_id, "only a retrying job can be run now (`jobs retry` runs a done or dead one again)").await);
            }
            println!(
                "job {job_id} is due now{}",
                who_runs_it(config, ledger).await
            );
        }
        JobsCommand::Stats { json } => {
            let now = ledger::now_ms();
            let stats = ledger.job_stats(now).await.context("cannot count jobs")?;
            let hold = ledger.hold().await.context("cannot read the hold")?;
            if json {
                let mut value = readable_json(&stats)?;
                value["hold"] = hold
                    .as_ref()
                    .map_or(Ok(serde_json::Value::Null), readable_json)?;
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print!("{}", stats_table(&stats, now));
                print!("{}", render::hold_lines(hold.as_ref(), now));
            }
        }
        JobsCommand::Expect { job_id } => {
            let reconcile_after = config.reconcile_after();
            let now = ledger::now_ms();
            let first_poll = now + ledger::duration_ms(reconcile_after);
            let registered = ledger.expect_job(&job_id, now, first_poll).await?;
            let when = humantime::format_duration(reconcile_after);
            match (registered, config.sume_api.is_some()) {
                (false, _) => println!("job {job_id} was already expected"),
                (true, true) => println!("job {job_id} is expected; Sume is polled for it if no webhook arrives within {when}"),
                (true, false) => println!("job {job_id} is expected; note: no [sume_api] configured, so nothing polls for it"),
            }
        }
        JobsCommand::Expected { limit, json } => {
            let rows = ledger.list_expectations(limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", expectations_table(&rows));
            }
        }
        JobsCommand::Redeliver { .. } => unreachable!("answered without a ledger above"),
    }
    Ok(())
}

/// Why an action changed nothing: the job is unknown, or in a state the action does not apply to.
async fn refusal(ledger: &Ledger, job_id: &JobId, applies_to: &str) -> anyhow::Error {
    match ledger.show_job(job_id).await {
        Ok(None) => anyhow::anyhow!("no job {job_id:?} in the ledger"),
        Ok(Some(job)) => anyhow::anyhow!("job {job_id:?} is {}; {applies_to}", job.summary.state),
        Err(error) => anyhow::Error::new(error).context("cannot read the job"),
    }
}

/// `jobs replay`: the stored body through `url` or `command`, once, recorded in the history.
async fn replay(
    ledger: &Ledger,
    job_id: &JobId,
    (url, command): (Option<String>, Vec<String>),
    timeout: std::time::Duration,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use sume_receiver::config::HandlerKind;
    use sume_receiver::handler::{AttemptError, Handler};
    let kind = match url {
        Some(url) => HandlerKind::url(url),
        None => HandlerKind::command(command),
    }
    .map_err(anyhow::Error::msg)?;
    let job = ledger
        .show_job(job_id)
        .await?
        .with_context(|| format!("no job {job_id:?} in the ledger"))?;
    let body = job.body.with_context(|| {
        format!("job {job_id:?} has no stored body any more (retention purged it)")
    })?;
    let attempt = ledger::Attempt {
        job_id: job_id.clone(),
        number: 0,
        event_type: job.summary.event_type,
        source: ledger::Source::parse(&job.summary.source),
        body,
    };
    let handler = Handler::new(kind.clone(), ca_file)?;
    let started = std::time::Instant::now();
    let result = handler
        .run(
            &attempt,
            timeout,
            &tokio_util::sync::CancellationToken::new(),
        )
        .await;
    let took = humantime::format_duration(std::time::Duration::from_millis(
        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    ));
    let outcome = match &result {
        Ok(()) => format!("done after {took}"),
        Err(AttemptError::Failed(failure, _)) => format!("failed after {took}: {}", failure.error),
        Err(AttemptError::Interrupted) => format!("interrupted after {took}"),
    };
    let reason = format!("through {}: {outcome}", kind.describe());
    ledger
        .record_action(
            job_id,
            ledger::ActionTaken {
                action: "replay",
                by: &actor(),
                reason: &reason,
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

/// Asks Sume to send a job's webhook again.
async fn redeliver(job_id: &JobId, config: &Config) -> anyhow::Result<()> {
    let api = config
        .sume_api
        .as_ref()
        .context("`jobs redeliver` needs a [sume_api] section (base_url, api_key_file)")?;
    let answer = sume_receiver::reconcile::call_sume(
        &sume_receiver::http_client::new_client(),
        api,
        &api.api_key()?,
        job_id,
        "webhook/redeliver",
        hyper::Method::POST,
    )
    .await
    .map_err(anyhow::Error::msg)
    .with_context(|| {
        format!(
            "cannot reach Sume at {}",
            sume_receiver::config::redact_url(&api.base_url)
        )
    })?;
    let text = String::from_utf8_lossy(&answer.body);
    if !answer.status.is_success() {
        bail!(
            "Sume refused the redelivery of {job_id}: {} {}",
            answer.status,
            Escaped(text.trim())
        );
    }
    println!(
        "Sume accepted the redelivery of {job_id} ({}); the webhook follows",
        answer.status
    );
    Ok(())
}
