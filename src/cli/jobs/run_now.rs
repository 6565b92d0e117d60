//! `jobs run-now`: a retrying job due now instead of at the end of its backoff.

use sume_receiver::actions::{JobAction, Refused};
use sume_receiver::config::Config;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::Ledger;
use sume_receiver::route_name::RouteName;

use super::{actions, refused, who_runs_it};
use crate::cli::actor::actor;

#[derive(Debug, clap::Args)]
pub struct RunNow {
    /// The job's id, as Sume sends it (`job_id` in the delivery).
    job_id: JobId,
    /// Only the job's work on this route (its routes' names: `jobs show`); without it, every
    /// route's.
    #[arg(long, value_parser = RouteName::parse)]
    route: Option<RouteName>,
}

impl RunNow {
    pub(super) async fn run(self, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
        let job_id = self.job_id;
        if let Err(refusal) = actions(ledger)
            .on_job(
                JobAction::RunNow,
                &job_id,
                self.route.as_ref(),
                &actor(None),
            )
            .await
        {
            let finished = matches!(&refusal, Refused::NotApplicable { state, .. } if state == "done" || state == "dead");
            let error = refused(&job_id, refusal);
            if finished {
                anyhow::bail!("{error} (`jobs retry` runs a done or dead one again)");
            }
            return Err(error);
        }
        println!(
            "job {job_id} is due now{}",
            who_runs_it(config, ledger).await
        );
        Ok(())
    }
}
