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
        let holds = ledger.holds().await.context("cannot read the holds")?;
        let work = ledger
            .metrics_snapshot()
            .await
            .context("cannot count the work by route")?
            .work;
        if self.json {
            let mut value = readable_json(&stats)?;
            value["hold"] = holds
                .first()
                .map_or(Ok(serde_json::Value::Null), readable_json)?;
            value["holds"] = readable_json(&holds)?;
            value["routes"] = work
                .iter()
                .map(|(route, waiting, running)| {
                    serde_json::json!({ "route": route, "waiting": waiting, "running": running })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&value)?);
        } else {
            print!("{}", stats_table(&stats, now));
            if work.len() > 1 || work.first().is_some_and(|(route, ..)| route != "default") {
                println!("by route:");
                for (route, waiting, running) in &work {
                    println!("  {route:<20} waiting {waiting:>8}  running {running:>6}");
                }
            }
            if holds.is_empty() {
                print!("{}", render::hold_lines(None, now));
            }
            for hold in &holds {
                print!("{}", render::hold_lines(Some(hold), now));
            }
        }
        Ok(())
    }
}
