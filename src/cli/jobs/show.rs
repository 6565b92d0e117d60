//! `jobs show`: one job, its history and the stops of dispatch that delay it.

use anyhow::Context;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, Ledger};

use super::render::{job_details, readable_json};

#[derive(Debug, clap::Args)]
pub struct Show {
    /// The job's id, as Sume sends it (`job_id` in the delivery).
    job_id: JobId,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl Show {
    pub(super) async fn run(self, ledger: &Ledger) -> anyhow::Result<()> {
        let job_id = self.job_id;
        let job = ledger
            .show_job(&job_id)
            .await
            .context("cannot read the job")?
            .with_context(|| format!("no job {job_id:?} in the ledger"))?;
        let stops = ledger
            .stops_delaying(&job, ledger::now_ms())
            .await
            .context("cannot read the stops of dispatch")?;
        if self.json {
            let mut json = readable_json(&job)?;
            let stops: Vec<_> = stops.iter().map(readable_json).collect::<Result<_, _>>()?;
            json["delayed_by"] = stops.into();
            println!("{}", serde_json::to_string_pretty(&json)?);
        } else {
            print!("{}", job_details(&job, &stops));
        }
        Ok(())
    }
}
