//! `jobs expect` and `jobs expected`: jobs registered for reconciliation, and what polling found.

use sume_receiver::config::Config;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::Ledger;

use super::actions;
use super::render::expectations_table;

#[derive(Debug, clap::Args)]
pub struct Expect {
    /// The job's id, as Sume sends it (`job_id` in the delivery).
    job_id: JobId,
}

impl Expect {
    pub(super) async fn run(self, config: &Config, ledger: &Ledger) -> anyhow::Result<()> {
        let job_id = self.job_id;
        let reconcile_after = config.reconcile_after();
        let registered = actions(ledger).expect(&job_id, reconcile_after).await?;
        let when = humantime::format_duration(reconcile_after);
        match (registered, config.sume_api.is_some()) {
            (false, _) => println!("job {job_id} was already expected"),
            (true, true) => println!("job {job_id} is expected; Sume is polled for it if no webhook arrives within {when}"),
            (true, false) => println!("job {job_id} is expected; note: no [sume_api] configured, so nothing polls for it"),
        }
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct Expected {
    /// At most this many, the most recently registered first.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

impl Expected {
    pub(super) async fn run(self, ledger: &Ledger) -> anyhow::Result<()> {
        let rows = ledger.list_expectations(self.limit).await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            print!("{}", expectations_table(&rows));
        }
        Ok(())
    }
}
