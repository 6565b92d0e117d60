//! The sume-receiver binary: parse the command line, load the config, start logging, run.

use std::process::ExitCode;

mod cli;

use anyhow::Context;
use clap::Parser;
use cli::{Cli, Command};
use sume_receiver::config::Config;
use sume_receiver::ledger::fatal_exit_status;
use sume_receiver::logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            fatal_exit_status(&error).map_or(ExitCode::FAILURE, ExitCode::from)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // Before the process's first thread, which every later one takes its ambient set from:
    // no handler inherits the unit's capability, and a handler's spawn needs no step between
    // fork and exec (handler.rs).
    sume_receiver::clear_ambient_capabilities().context("cannot clear the ambient capabilities")?;
    if let Command::Generate(what) = cli.command {
        return cli::generate(what);
    }
    let mut config = Config::load(&cli.config)?;
    let serving = matches!(cli.command, Command::Serve { .. });
    logging::init(if serving { "info" } else { "warn" }, config.log.format);
    // The process's one runtime: the service's, or a command's.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let done = runtime.block_on(async move {
        match cli.command {
            Command::Serve { listen } => {
                if let Some(listen) = listen {
                    config.server.listen = listen;
                }
                serve(config).await
            }
            command => cli::execute(command, &config).await,
        }
    });
    // A command's time limits (check-config's wait for the ledger, the flush of its spans) end
    // its wait, not a blocking read or name lookup under it, which dropping the runtime would
    // wait for: the process exits with what it has.
    if !serving {
        runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    }
    done
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Installed before anything else: a SIGTERM during startup must still shut down cleanly.
    let shutdown = shutdown_signal()?;
    let listener = sume_receiver::server::bind(config.server.listen).with_context(|| {
        format!(
            "cannot listen on {} (server.listen or --listen)",
            config.server.listen
        )
    })?;
    sume_receiver::run(config, listener, shutdown).await
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
