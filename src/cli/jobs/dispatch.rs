//! `jobs pause` and `jobs resume`: dispatch stopped or started again on every receiver.

use sume_receiver::config::Config;
use sume_receiver::ledger::Ledger;

use super::actions;
use crate::cli::actor::actor;

#[derive(Debug, clap::Args)]
pub struct Pause {
    /// Why, for the timelines of the jobs the pause delays.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

impl Pause {
    pub(super) async fn run(self, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
        set_dispatch(config, ledger, true, self.reason.as_deref()).await
    }
}

/// `jobs resume`.
pub(super) async fn resume(config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
    set_dispatch(config, ledger, false, None).await
}

/// Pauses (with `reason`) or resumes, and says what that means for the receivers.
async fn set_dispatch(
    config: &Config,
    ledger: &Ledger,
    paused: bool,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let changed = actions(ledger).set_dispatch(paused, &actor(reason)).await?;
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
    Ok(())
}
