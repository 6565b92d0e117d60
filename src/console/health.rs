//! Reads the verdict's facts: the ledger's (kept [`super::SNAPSHOT_FRESH`]), the rollup's last
//! minutes, the disk, and the health facts other parts of the receiver own ([`HealthSource`]).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::verdict::{Facts, DEAD_COUNTED, RECENT_MINUTES};
use crate::ledger::{now_ms, Dispatch, Ledger, State, StorageError};
use crate::metrics::Snapshot;
use crate::rollup::LastHour;
use crate::route_name::RouteName;
use crate::worker::Queues;

/// The health facts the console does not read from the ledger's rows: whether each side can
/// write, and whether an outage hold holds dispatch.
pub trait HealthSource: Send + Sync {
    /// Why the ledger cannot write, if it cannot.
    fn ledger_cannot_write(&self) -> Option<String>;
    /// Why the work side (attempts, retries, leases) cannot write, if it cannot.
    fn work_cannot_write(&self) -> Option<String>;
    /// Why dispatch is held, while an outage hold holds it (a pause by hand is read from the
    /// ledger's dispatch row).
    fn dispatch_held(&self) -> Option<String>;
    /// The routes whose work this receiver runs; `None` with no handler at all (the work waits
    /// for an external consumer, as it should).
    fn routes_run(&self) -> Option<Vec<String>> {
        None
    }
}

/// The receiver's own answers: its ledger's writer, the ledger's work side (PostgreSQL tracks
/// it apart: a failover can leave it behind), and the worker's hold.
pub struct ReceiverHealth {
    pub ledger: Arc<Ledger>,
    pub queue: Queues,
}

impl HealthSource for ReceiverHealth {
    fn ledger_cannot_write(&self) -> Option<String> {
        self.ledger.write_failure().map(str::to_owned)
    }

    fn work_cannot_write(&self) -> Option<String> {
        let state = self.ledger.work_side()?.state();
        (!state.can_write).then(|| {
            format!(
                "its ledger writes have failed since {} (a failover: see the log)",
                humantime::format_rfc3339_seconds(state.since)
            )
        })
    }

    fn dispatch_held(&self) -> Option<String> {
        let holds = self.queue.holds();
        let lines: Vec<String> = holds
            .iter()
            .map(|hold| {
                // The default route alone reads as before routes.
                let route = if hold.route == RouteName::DEFAULT {
                    String::new()
                } else {
                    format!("route {} ", hold.route)
                };
                format!(
                    "{route}since {} ({}); the next probe at {}",
                    utc(hold.since),
                    hold.reason,
                    utc(hold.next_probe_at)
                )
            })
            .collect();
        (!lines.is_empty()).then(|| lines.join("; "))
    }

    fn routes_run(&self) -> Option<Vec<String>> {
        let names: Vec<String> = self.queue.names().iter().map(ToString::to_string).collect();
        (!names.is_empty()).then_some(names)
    }
}

fn utc(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// What the overview reads from the ledger, kept for a few seconds together.
#[derive(Debug, Clone)]
pub struct LedgerFacts {
    pub snapshot: Snapshot,
    pub dead_last_hour: u64,
    /// When the oldest due job became due (Unix ms), if one is.
    pub oldest_due_at: Option<i64>,
}

/// Failed, not cancelled: an operator's cancel is a decision, not something wrong.
fn failed(error: Option<&str>) -> bool {
    !error.is_some_and(|error| error.starts_with("cancelled by "))
}

/// Reads the ledger's facts: its snapshot, the head of the dead index for the last hour (at
/// most [`DEAD_COUNTED`] rows), the head of the due index.
pub async fn read_ledger(ledger: &Ledger) -> Result<LedgerFacts, StorageError> {
    let now = now_ms();
    let snapshot = ledger.metrics_snapshot().await?;
    let dead = ledger
        .list_jobs(Some(State::Dead), None, Some(now - 3_600_000), DEAD_COUNTED)
        .await?;
    let dead_last_hour = dead
        .jobs
        .iter()
        .filter(|job| failed(job.last_error.as_deref()))
        .count() as u64;
    let oldest_due_at = ledger.next_due_at().await?.filter(|at| *at <= now);
    Ok(LedgerFacts {
        snapshot,
        dead_last_hour,
        oldest_due_at,
    })
}

/// The sum of the newest [`RECENT_MINUTES`] of the series `labels`.
fn recent(hour: &LastHour, labels: &[&str]) -> u64 {
    hour.series
        .iter()
        .filter(|(label, _)| labels.contains(label))
        .map(|(_, counts)| counts.iter().rev().take(RECENT_MINUTES).sum::<u64>())
        .sum()
}

/// What the verdict is computed from.
pub struct Sources<'a> {
    pub ledger: Option<&'a LedgerFacts>,
    pub health: &'a dyn HealthSource,
    pub readiness: Result<(), &'static str>,
    pub dispatch: Option<&'a Dispatch>,
    pub hour: &'a LastHour,
    pub tolerance: Duration,
    pub disk: Option<(u64, u64)>,
    /// A due job waiting longer than this to start makes the receiver `failing`
    /// (`[admin] due_job_limit`).
    pub due_limit: Duration,
}

pub fn facts(sources: &Sources) -> Facts {
    let now = now_ms();
    let jobs = |state: &str| {
        sources.ledger.map_or(0, |facts| {
            facts
                .snapshot
                .jobs
                .iter()
                .find(|(name, _)| *name == state)
                .map_or(0, |(_, count)| *count)
        })
    };
    let hour = sources.hour;
    Facts {
        dead_last_hour: sources.ledger.map_or(0, |facts| facts.dead_last_hour),
        ledger_cannot_write: sources.health.ledger_cannot_write(),
        work_cannot_write: sources.health.work_cannot_write(),
        not_ready: sources.readiness.err().map(str::to_owned),
        oldest_due_secs: sources
            .ledger
            .and_then(|facts| facts.oldest_due_at)
            .map(|at| u64::try_from((now - at) / 1000).unwrap_or(0)),
        due_limit_secs: sources.due_limit.as_secs(),
        paused_by: sources
            .dispatch
            .filter(|dispatch| dispatch.paused)
            .map(|dispatch| dispatch.changed_by.clone().unwrap_or_else(|| "?".into())),
        held: sources.health.dispatch_held(),
        waiting: jobs("claimed") + jobs("retrying"),
        arrived_recently: recent(hour, &["claimed"]),
        finished_recently: recent(hour, &["done", "dead"]),
        refused_recently: recent(hour, &["refused"]),
        accepted_recently: recent(hour, &["claimed", "duplicate"]),
        max_skew_secs: hour
            .max_skew_secs
            .iter()
            .rev()
            .take(RECENT_MINUTES)
            .copied()
            .max()
            .unwrap_or(0),
        tolerance_secs: sources.tolerance.as_secs(),
        disk: sources.disk,
        unrun_work: unrun_work(sources),
    }
}

/// Work waiting on routes this receiver does not run: a route taken out of the config keeps
/// its work in the ledger, unrun, until a route of its name comes back.
fn unrun_work(sources: &Sources) -> Vec<(String, u64)> {
    let (Some(ledger), Some(run)) = (sources.ledger, sources.health.routes_run()) else {
        return Vec::new();
    };
    ledger
        .snapshot
        .work
        .iter()
        .filter(|(route, waiting, _)| *waiting > 0 && !run.contains(route))
        .map(|(route, waiting, _)| (route.clone(), *waiting))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::console::verdict::{verdict, Level};
    use crate::rollup::ROLLUP;

    /// A receiver whose every side writes, not held.
    struct Writing;

    impl HealthSource for Writing {
        fn ledger_cannot_write(&self) -> Option<String> {
            None
        }
        fn work_cannot_write(&self) -> Option<String> {
            None
        }
        fn dispatch_held(&self) -> Option<String> {
            None
        }
    }

    /// The verdict's reasons about the oldest due job, under the limit `admin` configures.
    fn due_reasons(admin: &str, waited_ms: i64) -> Vec<(Level, String)> {
        let text = format!("[signature]\nsecrets = [\"whsec_a\"]\n{admin}");
        let config = Config::parse(&text, std::path::Path::new("/base")).unwrap();
        let ledger = LedgerFacts {
            snapshot: Snapshot::default(),
            dead_last_hour: 0,
            oldest_due_at: Some(now_ms() - waited_ms),
        };
        let facts = facts(&Sources {
            ledger: Some(&ledger),
            health: &Writing,
            readiness: Ok(()),
            dispatch: None,
            hour: &ROLLUP.last_hour(),
            tolerance: Duration::from_secs(300),
            disk: None,
            due_limit: config
                .admin
                .map_or(crate::config::DEFAULT_DUE_JOB_LIMIT, |a| a.due_job_limit),
        });
        verdict(&facts)
            .reasons
            .into_iter()
            .filter(|reason| reason.text.contains("oldest due job"))
            .map(|reason| (reason.level, reason.text))
            .collect()
    }

    #[test]
    fn the_configured_due_job_limit_turns_the_verdict_failing() {
        let short = "[admin]\ndue_job_limit = \"30s\"\n";
        assert_eq!(
            due_reasons(short, 60_000),
            [(
                Level::Failing,
                "The oldest due job has waited 1m to start (the limit is 30s)".to_owned()
            )]
        );
        assert_eq!(due_reasons(short, 10_000), []);
        // The same wait under the default limit (10 minutes), with or without `[admin]`.
        assert_eq!(due_reasons("[admin]\n", 60_000), []);
        assert_eq!(due_reasons("", 60_000), []);
    }
}
