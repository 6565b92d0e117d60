//! The command line: `serve`, `check-config`, `vacuum`, `loadgen`, and `jobs ...` on the ledger.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use crate::config::{self, Config, LedgerConfig};
use crate::job_id::JobId;
use crate::ledger::{self, JobDetail, JobSummary, Ledger, State};
use crate::logging::Escaped;
use crate::vacuum::Vacuum;

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
    Serve,
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
    SendTest(crate::send::SendTestArgs),
    /// Print the two signature headers for a body, and a ready curl line.
    Sign(crate::send::SignArgs),
    /// Benchmark a running receiver: send signed deliveries, report, check its ledger.
    #[cfg(feature = "bench")]
    Loadgen(crate::loadgen::LoadgenArgs),
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

/// sume-receiver(1): clap_mangen's sections from the command-line definitions, then every
/// command in this one page (clap_mangen would point at a page per subcommand, which nobody
/// ships) and the sections an operator looks for: files, signals, exit status, examples.
fn man_page(command: clap::Command, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    use roff::{bold, roman, Roff};
    let man = clap_mangen::Man::new(command.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    let mut page = Roff::new();
    page.control("SH", ["COMMANDS"]);
    list_commands(&mut page, "sume-receiver", &command);
    for (heading, paragraphs) in MAN_SECTIONS {
        page.control("SH", [*heading]);
        for paragraph in *paragraphs {
            match paragraph.split_once('\t') {
                Some((term, text)) => {
                    page.control("TP", []);
                    page.text([bold(term)]);
                    page.text([roman(text)]);
                }
                None => {
                    page.control("PP", []);
                    page.text([roman(*paragraph)]);
                }
            }
        }
    }
    page.to_writer(out)?;
    man.render_version_section(out)
}

/// Each command below `parent` as a tagged paragraph (its name, then its summary), each followed
/// by its own commands.
fn list_commands(page: &mut roff::Roff, path: &str, parent: &clap::Command) {
    for child in parent.get_subcommands().filter(|c| c.get_name() != "help") {
        let name = format!("{path} {}", child.get_name());
        page.control("TP", []);
        page.text([roff::bold(name.as_str())]);
        if let Some(about) = child.get_about() {
            page.text([roff::roman(about.to_string())]);
        }
        list_commands(page, &name, child);
    }
}

/// The man page's own sections: a heading, then paragraphs (`term\ttext` for a tagged one).
const MAN_SECTIONS: &[(&str, &[&str])] = &[
    (
        "FILES",
        &[
            "/etc/sume-receiver/config.toml\tThe configuration (the package's template, a conffile). Every key and its default: /usr/share/doc/sume-receiver/config.example.toml.",
            "/etc/sume-receiver/secrets\tThe signing secrets, one a line, newest first; mode 0640 root:sume-receiver.",
            "/var/lib/sume-receiver/ledger.sqlite3\tThe ledger (with its -wal, -shm and .lock files beside it), unless database.url names PostgreSQL.",
            "/usr/lib/systemd/system/sume-receiver.service\tThe systemd unit.",
        ],
    ),
    (
        "SIGNALS",
        &[
            "SIGHUP\tRe-read the signing secrets (systemctl reload); the other settings change at a restart.",
            "SIGTERM, SIGINT\tStop accepting, finish in-flight requests, let running handlers finish for server.shutdown_grace; an attempt the stop interrupts does not count.",
        ],
    ),
    (
        "EXIT STATUS",
        &[
            "0\tSuccess; serve stopped cleanly.",
            "1\tAn error: a bad configuration, a ledger that cannot be opened, a failed command.",
            "2\tThe command line could not be parsed.",
            "74\tThe disk failed under the ledger (a failed fsync or I/O error): the unit does not restart it; check the disk and reboot first.",
        ],
    ),
    (
        "EXAMPLES",
        &[
            "sume-receiver check-config\tValidate the configuration; errors exit non-zero, warnings do not.",
            "sume-receiver send-test\tSign a test delivery with the newest secret and send it to the running service.",
            "sume-receiver jobs list --state dead\tThe jobs whose attempts ran out.",
            "sume-receiver jobs retry JOB_ID\tRun a done or dead job again from its stored body.",
            "journalctl -u sume-receiver SUME_JOB_ID=JOB_ID\tEverything the service logged about one job.",
        ],
    ),
    (
        "SEE ALSO",
        &["systemctl(1), journalctl(1), sqlite3(1); /usr/share/doc/sume-receiver/README.md"],
    ),
];

/// Writes what `generate` asks for to stdout.
pub fn generate(what: Generate) -> anyhow::Result<()> {
    use clap::CommandFactory;
    use std::io::Write;
    let mut command = Cli::command();
    let mut out = std::io::stdout().lock();
    match what {
        Generate::Man => man_page(command, &mut out)?,
        Generate::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "sume-receiver", &mut script);
            let mut script = String::from_utf8(script)?;
            if shell == clap_complete::Shell::Bash {
                // clap_complete 4.6 names the cases of a hyphenated binary's subcommands
                // `sume__subcmd__receiver__...` but moves to `sume__receiver__...`: no case
                // matched, so nothing completed below the first word.
                script = script.replace("sume__subcmd__receiver__", "sume__receiver__");
            }
            out.write_all(script.as_bytes())?;
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List the most recently received jobs.
    List {
        /// Only jobs in this state: claimed, running, retrying, done or dead.
        #[arg(long)]
        state: Option<State>,
        /// At most this many jobs, the most recently received first.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job: state, attempts, times, last error and body.
    Show {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a `done` or `dead` job again from its stored body.
    Retry {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
    },
    /// Run a `retrying` job now instead of at the end of its backoff.
    RunNow {
        /// The job's id, as Sume sends it (`job_id` in the delivery).
        job_id: JobId,
    },
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

impl clap::builder::ValueParserFactory for State {
    type Parser = clap::builder::ValueParser;
    fn value_parser() -> Self::Parser {
        clap::builder::ValueParser::new(|text: &str| text.parse::<State>())
    }
}

/// Runs a command that is not `serve`, on the process's runtime (`main.rs`).
pub async fn execute(command: Command, config: &Config) -> anyhow::Result<()> {
    match command {
        Command::Serve | Command::Generate(_) => unreachable!("started by main"),
        Command::CheckConfig { strict } => {
            let unreadable = if strict {
                crate::check::Unreadable::Error
            } else {
                crate::check::Unreadable::Warning
            };
            let findings = crate::check::check(config, unreadable);
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
        Command::Sign(args) => crate::send::sign(&args, config),
        Command::SendTest(args) => crate::send::send_test(&args, config).await,
        #[cfg(feature = "bench")]
        Command::Loadgen(args) => {
            let json = args.json;
            let report = crate::loadgen::run(args, config.clone()).await?;
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
        JobsCommand::List { state, limit, json } => {
            let jobs = ledger
                .list_jobs(state, limit)
                .await
                .context("cannot list jobs")?;
            if json {
                let jobs: Vec<serde_json::Value> =
                    jobs.iter().map(readable_json).collect::<Result<_, _>>()?;
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                print!("{}", jobs_table(&jobs));
            }
        }
        JobsCommand::Show { job_id, json } => {
            let job = ledger
                .show_job(job_id.as_str())
                .await
                .context("cannot read the job")?
                .with_context(|| format!("no job {job_id:?} in the ledger"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&readable_json(&job)?)?);
            } else {
                print!("{}", job_details(&job));
            }
        }
        JobsCommand::Retry { job_id } => {
            ledger.retry_job(job_id.as_str(), ledger::now_ms()).await?;
            println!("job {job_id} is queued to run again{}", who_runs_it(config));
        }
        JobsCommand::RunNow { job_id } => {
            if !ledger.run_now(job_id.as_str(), ledger::now_ms()).await? {
                let state = ledger
                    .show_job(job_id.as_str())
                    .await?
                    .map(|job| job.summary.state);
                match state {
                    None => bail!("no job {job_id:?} in the ledger"),
                    Some(state) => bail!("job {job_id:?} is {state}; only a retrying job can be run now (`jobs retry` runs a done or dead one again)"),
                }
            }
            println!("job {job_id} is due now{}", who_runs_it(config));
        }
        JobsCommand::Stats { json } => {
            let now = ledger::now_ms();
            let stats = ledger.job_stats(now).await.context("cannot count jobs")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&readable_json(&stats)?)?);
            } else {
                print!("{}", stats_table(&stats, now));
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
                let header = [
                    "JOB_ID",
                    "STATE",
                    "EXPECTED",
                    "NEXT_POLL",
                    "POLLS",
                    "LAST_STATUS",
                    "LAST_ERROR",
                ];
                let cells: Vec<Vec<String>> = rows
                    .iter()
                    .map(|row| {
                        vec![
                            row.job_id.clone(),
                            row.state.clone(),
                            format_time(Some(row.expected_at)),
                            format_time(Some(row.next_poll_at)),
                            row.polls.to_string(),
                            row.last_status.clone().unwrap_or_else(|| "-".into()),
                            short(row.last_error.as_deref(), 60),
                        ]
                    })
                    .collect();
                print!("{}", table(&header, &cells, "(no expected jobs)"));
            }
        }
        JobsCommand::Redeliver { .. } => unreachable!("answered without a ledger above"),
    }
    Ok(())
}

/// Who picks up a job made due from the command line, and when.
fn who_runs_it(config: &Config) -> String {
    let Some(path) = config.database.sqlite_path() else {
        return ": the receivers were notified, and one picks it up as soon as a worker slot is \
                free"
            .to_owned();
    };
    if crate::instance_lock::service_running(path) {
        let within = humantime::format_duration(crate::worker::IDLE_LOOK);
        format!(": the running service picks it up within {within} (or as soon as a worker slot is free)")
    } else {
        "; no service is running on this ledger, so it runs at the next start".to_owned()
    }
}

/// A row as JSON for people and scripts: every `*_at` time (Unix ms) gets a `*_at_utc` twin in
/// RFC 3339, and a stored body that is JSON is shown as JSON, not as a string holding it.
fn readable_json(row: &impl serde::Serialize) -> serde_json::Result<serde_json::Value> {
    let mut value = serde_json::to_value(row)?;
    if let Some(object) = value.as_object_mut() {
        let times: Vec<(String, serde_json::Value)> = object
            .iter()
            .filter(|(key, _)| key.ends_with("_at"))
            .map(|(key, ms)| {
                let utc = ms
                    .as_i64()
                    .map_or(serde_json::Value::Null, |ms| format_time(Some(ms)).into());
                (format!("{key}_utc"), utc)
            })
            .collect();
        object.extend(times);
        if let Some(body) = object.get_mut("body") {
            if let Some(parsed) = body
                .as_str()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            {
                *body = parsed;
            }
        }
    }
    Ok(value)
}

fn format_time(ms: Option<i64>) -> String {
    match ms.and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => {
            humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
        }
        None => "-".into(),
    }
}

/// A one-line, bounded rendering of an error for the table.
fn short(text: Option<&str>, max_chars: usize) -> String {
    let text = text.unwrap_or("-").replace(['\n', '\r'], " ");
    if text.chars().count() > max_chars {
        format!("{}...", text.chars().take(max_chars).collect::<String>())
    } else {
        text
    }
}

fn jobs_table(jobs: &[JobSummary]) -> String {
    let header = [
        "JOB_ID",
        "STATE",
        "ATTEMPTS",
        "SOURCE",
        "EVENT",
        "RECEIVED",
        "LAST_ERROR",
    ];
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| {
            vec![
                job.job_id.clone(),
                job.state.clone(),
                job.attempts.to_string(),
                job.source.clone(),
                job.event_type.clone().unwrap_or_else(|| "-".into()),
                format_time(Some(job.received_at)),
                short(job.last_error.as_deref(), 60),
            ]
        })
        .collect();
    table(&header, &rows, "(no jobs)")
}

fn stats_table(stats: &ledger::JobStats, now: i64) -> String {
    let mut rows: Vec<Vec<String>> = stats
        .by_state
        .iter()
        .map(|(state, count)| vec![state.clone(), count.to_string()])
        .collect();
    let oldest = stats
        .oldest_unfinished_received_at
        .map_or("-".into(), |at| {
            let age = Duration::from_secs(u64::try_from((now - at) / 1000).unwrap_or(0));
            format!(
                "{} ({} ago)",
                format_time(Some(at)),
                humantime::format_duration(age)
            )
        });
    rows.push(vec!["oldest unfinished".into(), oldest]);
    rows.push(vec![
        "received, last hour".into(),
        stats.received_last_hour.to_string(),
    ]);
    rows.push(vec![
        "dead, last 24 h".into(),
        stats.dead_last_day.to_string(),
    ]);
    table(&["STATE", "JOBS"], &rows, "")
}

/// Left-aligned columns, two spaces apart, sized to their widest cell. Cells are escaped: what
/// the ledger holds (ids written by older versions, handler errors) must not drive the terminal.
fn table(header: &[&str], rows: &[Vec<String>], when_empty: &str) -> String {
    let header: Vec<String> = header.iter().map(|cell| (*cell).to_owned()).collect();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| Escaped(cell).to_string()).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str(when_empty);
        out.push('\n');
    }
    out
}

/// Asks Sume to send a job's webhook again.
async fn redeliver(job_id: &JobId, config: &Config) -> anyhow::Result<()> {
    let api = config
        .sume_api
        .as_ref()
        .context("`jobs redeliver` needs a [sume_api] section (base_url, api_key_file)")?;
    let answer = crate::reconcile::call_sume(
        &crate::http_client::new_client(),
        api,
        &api.api_key()?,
        job_id,
        "webhook/redeliver",
        hyper::Method::POST,
    )
    .await
    .map_err(anyhow::Error::msg)
    .with_context(|| format!("cannot reach Sume at {}", api.base_url))?;
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

fn job_details(job: &JobDetail) -> String {
    let s = &job.summary;
    let fields = [
        ("job_id", s.job_id.clone()),
        ("state", s.state.clone()),
        ("source", s.source.clone()),
        (
            "event_type",
            s.event_type.clone().unwrap_or_else(|| "-".into()),
        ),
        ("attempts", s.attempts.to_string()),
        ("received_at", format_time(Some(s.received_at))),
        ("next_attempt_at", format_time(s.next_attempt_at)),
        ("lease_expires_at", format_time(job.lease_expires_at)),
        ("finished_at", format_time(s.finished_at)),
        ("updated_at", format_time(Some(job.updated_at))),
        (
            "last_error",
            s.last_error.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "body",
            job.body
                .clone()
                .unwrap_or_else(|| "(purged by retention)".into()),
        ),
    ];
    fields
        .iter()
        .map(|(name, value)| format!("{name:<17}{}\n", Escaped(value)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_says_when_empty() {
        assert!(jobs_table(&[]).ends_with("(no jobs)\n"));
        let job = JobSummary {
            job_id: "job-1".into(),
            state: "dead".into(),
            source: "webhook".into(),
            event_type: None,
            attempts: 5,
            received_at: 0,
            next_attempt_at: None,
            finished_at: None,
            last_error: Some("exit\nstatus 1".into()),
        };
        let table = jobs_table(&[job]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0].find("STATE"), lines[1].find("dead"));
        assert!(lines[1].contains("1970-01-01T00:00:00.000Z"));
        assert!(lines[1].contains("exit status 1"));
    }
}
