//! The sume-receiver binary: parse the command line, load the config, start logging, run.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use sume_receiver::cli::{self, Cli, Command};
use sume_receiver::config::Config;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve);
    init_tracing(if serving { "info" } else { "warn" });
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(what) => cli::generate(what),
        Command::Serve => serve(Config::load(&cli.config)?),
        command => cli::execute(command, &Config::load(&cli.config)?),
    }
}

fn serve(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // Installed before anything else: a SIGTERM during startup must still shut down cleanly.
        let shutdown = shutdown_signal()?;
        let listener = tokio::net::TcpListener::bind(config.server.listen)
            .await
            .with_context(|| {
                format!("cannot listen on {} (server.listen)", config.server.listen)
            })?;
        sume_receiver::run(config, listener, shutdown).await
    })
}

/// Resolves on SIGTERM (systemd stop) or SIGINT (Ctrl-C). Also takes SIGHUP from its default
/// (ending the process): `run` reloads the signing secrets on it.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let _ = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

fn init_tracing(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
