//! `jobs pause` and `jobs resume`: dispatch stopped or started again on every receiver, for
//! every route or for one.

use sume_receiver::config::Config;
use sume_receiver::ledger::{Actor, Ledger};
use sume_receiver::route_name::RouteName;

use super::actions;
use crate::cli::actor::actor;

#[derive(Debug, clap::Args)]
pub struct Pause {
    /// Why, for the timelines of the jobs the pause delays.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Only this route's work: every other route runs on.
    #[arg(long, value_parser = RouteName::parse)]
    route: Option<RouteName>,
}

impl Pause {
    pub(super) async fn run(self, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
        let actor = actor(self.reason.as_deref());
        set_dispatch(config, ledger, true, self.route.as_ref(), &actor).await
    }
}

#[derive(Debug, clap::Args)]
pub struct Resume {
    /// Only this route's work (and its hold, if it has one); without it every route's, every
    /// route's own pause and every hold.
    #[arg(long, value_parser = RouteName::parse)]
    route: Option<RouteName>,
}

impl Resume {
    pub(super) async fn run(self, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
        set_dispatch(config, ledger, false, self.route.as_ref(), &actor(None)).await
    }
}

/// Pauses or resumes (every route, or one), and says what that means for the receivers.
async fn set_dispatch(
    config: &Config,
    ledger: &Ledger,
    paused: bool,
    route: Option<&RouteName>,
    actor: &Actor,
) -> anyhow::Result<()> {
    let changed = match route {
        Some(route) => {
            actions(ledger)
                .set_route_dispatch(route, paused, actor)
                .await?
        }
        None => actions(ledger).set_dispatch(paused, actor).await?,
    };
    let receivers = if config.database.sqlite_path().is_some() {
        "the service"
    } else {
        "every receiver"
    };
    let what = route.map_or_else(String::new, |route| format!(" route {route}"));
    let within = humantime::format_duration(sume_receiver::worker::IDLE_LOOK);
    match (paused, changed) {
        (true, true) => println!("paused{what}: {receivers} runs no new attempt of it from within {within}; running ones finish; deliveries are still claimed"),
        (false, true) => println!("resumed{what} (a handler hold, if any, ended too): {receivers} runs its due jobs again within {within}"),
        (true, false) => println!("already paused{what}"),
        (false, false) => println!("not paused{what}"),
    }
    Ok(())
}
