//! The command line: `serve`, `check-config`, and `jobs list|show|retry` against the ledger.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::{self, Config};
use crate::ledger::{self, JobDetail, JobSummary, State};

#[derive(Debug, Parser)]
#[command(
    name = "sume-receiver",
    version,
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
    CheckConfig,
    /// Inspect and retry jobs in the ledger (works while the service runs).
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Benchmark a running receiver: send signed deliveries, report, check its ledger.
    Loadgen(crate::loadgen::LoadgenArgs),
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List the most recently received jobs.
    List {
        #[arg(long)]
        state: Option<State>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job: state, attempts, times, last error and body.
    Show {
        job_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Run a `done` or `dead` job again from its stored body.
    Retry { job_id: String },
}

impl clap::builder::ValueParserFactory for State {
    type Parser = clap::builder::ValueParser;
    fn value_parser() -> Self::Parser {
        clap::builder::ValueParser::new(|text: &str| text.parse::<State>())
    }
}

/// Runs a command that is not `serve` (which needs the async runtime; see `main.rs`).
pub fn execute(command: Command, config: &Config) -> anyhow::Result<()> {
    match command {
        Command::Serve => unreachable!("serve is started by main"),
        Command::CheckConfig => {
            println!("configuration is valid");
            Ok(())
        }
        Command::Jobs(jobs) => execute_jobs(jobs, config),
        Command::Loadgen(args) => {
            let json = args.json;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = runtime.block_on(crate::loadgen::run(args, config.clone()))?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                report.print();
            }
            Ok(())
        }
    }
}

fn execute_jobs(command: JobsCommand, config: &Config) -> anyhow::Result<()> {
    let conn = ledger::open_existing(&config.database)?;
    match command {
        JobsCommand::List { state, limit, json } => {
            let jobs = ledger::list_jobs(&conn, state, limit).context("cannot list jobs")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                print!("{}", jobs_table(&jobs));
            }
        }
        JobsCommand::Show { job_id, json } => {
            let job = ledger::show_job(&conn, &job_id)
                .context("cannot read the job")?
                .with_context(|| format!("no job {job_id:?} in the ledger"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                print!("{}", job_details(&job));
            }
        }
        JobsCommand::Retry { job_id } => {
            ledger::retry_job(&conn, &job_id, ledger::now_ms())?;
            println!("job {job_id} is queued to run again (the running service picks it up at its next sweep)");
        }
    }
    Ok(())
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
    ]
    .map(String::from);
    let rows: Vec<[String; 7]> = jobs
        .iter()
        .map(|job| {
            [
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
    let mut widths = header.clone().map(|cell| cell.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str("(no jobs)\n");
    }
    out
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
        .map(|(name, value)| format!("{name:<17}{value}\n"))
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
