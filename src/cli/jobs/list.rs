//! `jobs list`: a page of jobs, newest first, as a table or one JSON array.

use anyhow::Context;
use sume_receiver::ledger::{self, Ledger, State};
use sume_receiver::route_name::RouteName;

use super::render::{jobs_table, readable_json};
use super::shell_word;

#[derive(Debug, clap::Args)]
pub struct List {
    /// Only jobs in this state: claimed, running, retrying, done or dead.
    #[arg(long)]
    state: Option<State>,
    /// Only jobs of this event type (not indexed: a page reads at most 10,000 jobs of
    /// its list, and may end short with the cursor to go on from).
    #[arg(long, value_name = "TYPE")]
    event_type: Option<String>,
    /// Only jobs with work on this route (not indexed either: as --event-type).
    #[arg(long, value_name = "ROUTE", value_parser = RouteName::parse)]
    route: Option<RouteName>,
    /// Only jobs whose time in the list (received; due; finished) is within this long
    /// ago ("1h", "2d").
    #[arg(long, value_parser = humantime::parse_duration)]
    since: Option<std::time::Duration>,
    /// At most this many jobs; a full page ends with the cursor of the next one.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// The page after this cursor (`<ms>:<job_id>`, as the previous page printed it).
    #[arg(long, value_name = "CURSOR")]
    after: Option<ledger::Cursor>,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

impl List {
    pub(super) async fn run(self, ledger: &Ledger) -> anyhow::Result<()> {
        let filter = ledger::JobFilter {
            state: self.state,
            event_type: self.event_type,
            route: self.route,
            since: self
                .since
                .map(|since| ledger::now_ms() - ledger::duration_ms(since)),
            before: None,
        };
        let page = ledger
            .find_jobs(&filter, self.after.as_ref(), self.limit)
            .await
            .context("cannot list jobs")?;
        if self.json {
            let jobs: Vec<serde_json::Value> = page
                .jobs
                .iter()
                .map(readable_json)
                .collect::<Result<_, _>>()?;
            println!("{}", serde_json::to_string_pretty(&jobs)?);
        } else {
            print!("{}", jobs_table(&page.jobs));
        }
        if let Some(next) = page.next {
            // On stderr: the JSON on stdout stays one array.
            eprintln!("next page: --after {}", shell_word(&next.to_string()));
        }
        Ok(())
    }
}
