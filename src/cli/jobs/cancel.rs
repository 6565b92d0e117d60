//! `jobs cancel`: a waiting job made dead without running, with a reason.

use sume_receiver::actions::JobAction;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::Ledger;
use sume_receiver::route_name::RouteName;

use super::{actions, refused};
use crate::cli::actor::actor;

#[derive(Debug, clap::Args)]
pub struct Cancel {
    /// The job's id, as Sume sends it (`job_id` in the delivery).
    job_id: JobId,
    /// Why: recorded in the job's history and as its last error.
    #[arg(long)]
    reason: String,
    /// Only the job's work on this route (its routes' names: `jobs show`); without it, every
    /// route's.
    #[arg(long, value_parser = RouteName::parse)]
    route: Option<RouteName>,
}

impl Cancel {
    pub(super) async fn run(self, ledger: &Ledger) -> anyhow::Result<()> {
        let job_id = self.job_id;
        let actor = actor(Some(&self.reason));
        actions(ledger)
            .on_job(JobAction::Cancel, &job_id, self.route.as_ref(), &actor)
            .await
            .map_err(|refusal| refused(&job_id, refusal))?;
        println!("job {job_id} is dead (cancelled); `jobs retry {job_id}` would run it again");
        Ok(())
    }
}
