//! The command line: `serve`, `check-config`, `vacuum`, `loadgen`, and `jobs ...` on the ledger.
//! The binary's side of the house: the library serves, this parses and prints; one file per
//! verb behind the dispatcher below (`jobs/` has its own).

mod actor;
mod backup;
mod check_config;
mod generate;
mod jobs;
mod send;
mod vacuum;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use backup::backup;
use check_config::check_config;
pub use generate::generate;
use jobs::JobsCommand;
use sume_receiver::config::{self, Config};
use vacuum::vacuum;

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

/// Runs a command that is not `serve`, on the process's runtime (`main.rs`).
pub async fn execute(command: Command, config: &Config) -> anyhow::Result<()> {
    match command {
        Command::Serve { .. } | Command::Generate(_) => unreachable!("started by main"),
        Command::CheckConfig { strict } => check_config(config, strict).await,
        Command::Jobs(jobs) => jobs::execute(jobs, config).await,
        Command::Vacuum => vacuum(config).await,
        Command::Backup { path } => backup(config, &path).await,
        Command::Sign(args) => send::sign(&args, config),
        Command::SendTest(args) => send::send_test(&args, config).await,
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
