//! `jobs stats`: counts by state, the oldest unfinished job, recent deliveries, and the hold.

use anyhow::Context;
use sume_receiver::ledger::{self, Ledger};

use super::render::{self, readable_json, stats_table};

#[derive(Debug, clap::Args)]
pub struct Stats {
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl Stats {
    pub(super) async fn run(self, ledger: &Ledger) -> anyhow::Result<()> {
        let now = ledger::now_ms();
        let stats = ledger.job_stats(now).await.context("cannot count jobs")?;
        let hold = ledger.hold().await.context("cannot read the hold")?;
        if self.json {
            let mut value = readable_json(&stats)?;
            value["hold"] = hold
                .as_ref()
                .map_or(Ok(serde_json::Value::Null), readable_json)?;
            println!("{}", serde_json::to_string_pretty(&value)?);
        } else {
            print!("{}", stats_table(&stats, now));
            print!("{}", render::hold_lines(hold.as_ref(), now));
        }
        Ok(())
    }
}
