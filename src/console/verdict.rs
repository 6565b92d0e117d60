//! The overview's answer to "is anything wrong?": a pure function of the facts read for it,
//! each reason naming its fact and the page that shows the evidence.

use serde::Serialize;

/// Dead jobs counted for the last hour, at most: the count reads that many of the dead index.
pub const DEAD_COUNTED: usize = 1000;
/// The window of the rates (backlog, refusals, skew): the newest minutes of the rollup.
pub const RECENT_MINUTES: usize = 10;
/// Jobs more than finished in [`RECENT_MINUTES`] before the backlog counts as growing.
const BACKLOG_GROWTH: u64 = 10;
/// Refusals in [`RECENT_MINUTES`] before they can count as a spike.
const REFUSAL_SPIKE: u64 = 10;
/// Free space below this (or below [`DISK_LOW_PERCENT`] of the file system) is low.
const DISK_LOW_BYTES: u64 = 1 << 30;
const DISK_LOW_PERCENT: u64 = 5;
/// Skew at this share of the tolerance (percent) is near it.
const SKEW_NEAR_PERCENT: u64 = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Attention,
    Failing,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Attention => "attention",
            Level::Failing => "failing",
        }
    }
}

/// What the verdict is computed from; read by [`super::health`], or written by a test.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Jobs that went dead in the last hour by failing (an operator's cancel is not counted),
    /// at most [`DEAD_COUNTED`].
    pub dead_last_hour: u64,
    /// Why the ledger cannot write, when it cannot.
    pub ledger_cannot_write: Option<String>,
    /// Why the work side (attempts, retries, leases) cannot write, when it cannot.
    pub work_cannot_write: Option<String>,
    /// Why a delivery sent now would not be claimed, when it would not.
    pub not_ready: Option<String>,
    /// How long the oldest due job has waited to start, in seconds.
    pub oldest_due_secs: Option<u64>,
    /// The due wait past which the receiver is failing.
    pub due_limit_secs: u64,
    /// Who paused dispatch, while it is paused.
    pub paused_by: Option<String>,
    /// Why dispatch is held, while an outage hold holds it.
    pub held: Option<String>,
    /// Jobs waiting to run (claimed and retrying).
    pub waiting: u64,
    /// In the last [`RECENT_MINUTES`]: jobs claimed, jobs finished (done or dead).
    pub arrived_recently: u64,
    pub finished_recently: u64,
    /// In the last [`RECENT_MINUTES`]: deliveries refused (401, 400, 413) and accepted.
    pub refused_recently: u64,
    pub accepted_recently: u64,
    /// The largest clock skew of a verified delivery in the last [`RECENT_MINUTES`], and the
    /// signature tolerance, in seconds.
    pub max_skew_secs: u64,
    pub tolerance_secs: u64,
    /// Free and total bytes of the file system under the ledger, where it is a file.
    pub disk: Option<(u64, u64)>,
    /// Work waiting on routes this receiver does not run (taken out of the config): by route,
    /// how many jobs.
    pub unrun_work: Vec<(String, u64)>,
}

/// One fact that holds, the level it calls for, and where its evidence is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub level: Level,
    pub text: String,
    pub href: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub level: Level,
    pub reasons: Vec<Reason>,
}

impl Verdict {
    /// The JSON twin's shape: `{"level": ..., "reasons": ["...", ...], "evidence": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "level": self.level,
            "reasons": self.reasons.iter().map(|r| r.text.as_str()).collect::<Vec<_>>(),
            "evidence": self.reasons,
        })
    }
}

/// "1 job", "2 jobs".
pub(super) fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

fn duration(secs: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// The verdict: `failing` if any failing fact holds, else `attention` if any such fact holds,
/// else `ok`; the failing reasons first.
pub fn verdict(facts: &Facts) -> Verdict {
    let mut reasons = Vec::new();
    let mut add = |level, text: String, href| reasons.push(Reason { level, text, href });
    if facts.dead_last_hour > 0 {
        let more = if facts.dead_last_hour >= DEAD_COUNTED as u64 {
            " or more"
        } else {
            ""
        };
        add(
            Level::Failing,
            format!(
                "{}{more} went dead in the last hour",
                plural(facts.dead_last_hour, "job", "jobs")
            ),
            "/console/dead",
        );
    }
    if let Some(why) = &facts.ledger_cannot_write {
        add(
            Level::Failing,
            format!("The ledger cannot write: {why}"),
            "/console/config",
        );
    }
    if let Some(why) = &facts.work_cannot_write {
        add(
            Level::Failing,
            format!("The work side cannot write: {why}"),
            "/console/config",
        );
    }
    if let Some(why) = &facts.not_ready {
        add(
            Level::Failing,
            format!("Not ready: {why}"),
            "/console/receipts",
        );
    }
    if let Some(age) = facts
        .oldest_due_secs
        .filter(|age| *age >= facts.due_limit_secs)
    {
        add(
            Level::Failing,
            format!(
                "The oldest due job has waited {} to start (the limit is {})",
                duration(age),
                duration(facts.due_limit_secs)
            ),
            "/console/jobs?state=claimed",
        );
    }
    if let Some(by) = &facts.paused_by {
        add(
            Level::Attention,
            format!("Dispatch is paused by {by}: no job runs"),
            "/console/",
        );
    }
    if let Some(why) = &facts.held {
        add(
            Level::Attention,
            format!("Dispatch is held: {why}"),
            "/console/",
        );
    }
    let growth = facts
        .arrived_recently
        .saturating_sub(facts.finished_recently);
    if facts.waiting > 0 && growth >= BACKLOG_GROWTH {
        add(
            Level::Attention,
            format!(
                "The backlog grows: {} claimed and {} finished in the last {RECENT_MINUTES} minutes; {} wait",
                facts.arrived_recently,
                facts.finished_recently,
                facts.waiting
            ),
            "/console/jobs?state=claimed",
        );
    }
    let deliveries = facts.refused_recently + facts.accepted_recently;
    if facts.refused_recently >= REFUSAL_SPIKE && facts.refused_recently * 10 >= deliveries {
        add(
            Level::Attention,
            format!(
                "{} of {deliveries} deliveries refused in the last {RECENT_MINUTES} minutes (a secret rotation gone wrong?)",
                facts.refused_recently
            ),
            "/console/receipts",
        );
    }
    if facts.tolerance_secs > 0
        && facts.max_skew_secs * 100 >= facts.tolerance_secs * SKEW_NEAR_PERCENT
    {
        add(
            Level::Attention,
            format!(
                "Sume's clock is {} off, near the tolerance of {}",
                duration(facts.max_skew_secs),
                duration(facts.tolerance_secs)
            ),
            "/console/receipts",
        );
    }
    if let Some((free, total)) = facts.disk {
        if free < DISK_LOW_BYTES || free * 100 < total * DISK_LOW_PERCENT {
            add(
                Level::Attention,
                format!(
                    "The disk under the ledger runs low: {} MiB free",
                    free >> 20
                ),
                "/console/config",
            );
        }
    }
    if !facts.unrun_work.is_empty() {
        let routes: Vec<String> = facts
            .unrun_work
            .iter()
            .map(|(route, waiting)| format!("{route} ({})", plural(*waiting, "job", "jobs")))
            .collect();
        add(
            Level::Attention,
            format!(
                "Work waits for routes this receiver does not run (not in its config): {}; it runs when a route of that name comes back",
                routes.join(", ")
            ),
            "/console/config",
        );
    }
    reasons.sort_by_key(|reason| std::cmp::Reverse(reason.level));
    Verdict {
        level: reasons.first().map_or(Level::Ok, |reason| reason.level),
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A healthy receiver: plenty of disk, nothing waiting long.
    fn calm() -> Facts {
        Facts {
            due_limit_secs: 600,
            oldest_due_secs: Some(3),
            waiting: 2,
            arrived_recently: 100,
            finished_recently: 98,
            accepted_recently: 100,
            refused_recently: 1,
            max_skew_secs: 2,
            tolerance_secs: 300,
            disk: Some((50 << 30, 100 << 30)),
            ..Facts::default()
        }
    }

    /// The verdict of `calm()` changed by `change`: its level and its one reason.
    fn one(change: impl FnOnce(&mut Facts)) -> (Level, String) {
        let mut facts = calm();
        change(&mut facts);
        let verdict = verdict(&facts);
        assert_eq!(verdict.reasons.len(), 1, "{verdict:?}");
        (verdict.level, verdict.reasons[0].text.clone())
    }

    #[test]
    fn calm_facts_are_ok_with_no_reason() {
        let verdict = verdict(&calm());
        assert_eq!(verdict.level, Level::Ok);
        assert!(verdict.reasons.is_empty());
        assert_eq!(verdict.to_json()["level"], "ok");
    }

    #[test]
    fn jobs_dead_in_the_last_hour_fail() {
        let (level, text) = one(|f| f.dead_last_hour = 3);
        assert_eq!(level, Level::Failing);
        assert_eq!(text, "3 jobs went dead in the last hour");
        let (_, text) = one(|f| f.dead_last_hour = DEAD_COUNTED as u64);
        assert_eq!(text, "1000 jobs or more went dead in the last hour");
    }

    #[test]
    fn a_ledger_or_work_side_that_cannot_write_fails() {
        let (level, text) = one(|f| f.ledger_cannot_write = Some("disk full".into()));
        assert_eq!(
            (level, text.as_str()),
            (Level::Failing, "The ledger cannot write: disk full")
        );
        let (level, text) = one(|f| f.work_cannot_write = Some("no primary".into()));
        assert_eq!(
            (level, text.as_str()),
            (Level::Failing, "The work side cannot write: no primary")
        );
    }

    #[test]
    fn not_ready_fails() {
        let (level, text) = one(|f| f.not_ready = Some("the writer's queue is full".into()));
        assert_eq!(level, Level::Failing);
        assert!(text.starts_with("Not ready"), "{text}");
    }

    #[test]
    fn a_due_job_older_than_the_limit_fails_and_younger_does_not() {
        let (level, text) = one(|f| f.oldest_due_secs = Some(600));
        assert_eq!(level, Level::Failing);
        assert!(text.contains("10m"), "{text}");
        assert_eq!(
            verdict(&Facts {
                oldest_due_secs: Some(599),
                ..calm()
            })
            .level,
            Level::Ok
        );
    }

    #[test]
    fn a_pause_or_a_hold_calls_for_attention() {
        let (level, text) = one(|f| f.paused_by = Some("console:alice".into()));
        assert_eq!(level, Level::Attention);
        assert!(text.contains("console:alice"), "{text}");
        let (level, text) = one(|f| f.held = Some("the handler's upstream is down".into()));
        assert_eq!(level, Level::Attention);
        assert!(text.contains("held"), "{text}");
    }

    #[test]
    fn a_growing_backlog_calls_for_attention() {
        let (level, text) = one(|f| {
            f.arrived_recently = 200;
            f.finished_recently = 20;
            f.waiting = 180;
        });
        assert_eq!(level, Level::Attention);
        assert!(text.starts_with("The backlog grows"), "{text}");
        // Growing by fewer than a handful, or with nothing waiting, is not a backlog.
        let small = Facts {
            arrived_recently: 105,
            ..calm()
        };
        assert_eq!(verdict(&small).level, Level::Ok);
        let drained = Facts {
            arrived_recently: 200,
            finished_recently: 0,
            waiting: 0,
            ..calm()
        };
        assert_eq!(verdict(&drained).level, Level::Ok);
    }

    #[test]
    fn a_spike_of_refusals_calls_for_attention() {
        let (level, text) = one(|f| {
            f.refused_recently = 40;
            f.accepted_recently = 60;
        });
        assert_eq!(level, Level::Attention);
        assert!(text.starts_with("40 of 100 deliveries refused"), "{text}");
        // A few refusals among many deliveries are a stranger knocking, not a spike.
        let few = Facts {
            refused_recently: 12,
            accepted_recently: 10_000,
            ..calm()
        };
        assert_eq!(verdict(&few).level, Level::Ok);
    }

    #[test]
    fn skew_near_the_tolerance_calls_for_attention() {
        let (level, text) = one(|f| f.max_skew_secs = 240);
        assert_eq!(level, Level::Attention);
        assert!(text.contains("4m"), "{text}");
        assert_eq!(
            verdict(&Facts {
                max_skew_secs: 239,
                ..calm()
            })
            .level,
            Level::Ok
        );
    }

    #[test]
    fn work_for_a_route_no_longer_run_calls_for_attention() {
        let (level, text) = one(|f| f.unrun_work = vec![("archive".into(), 12)]);
        assert_eq!(level, Level::Attention);
        assert!(text.contains("archive (12 jobs)"), "{text}");
    }

    #[test]
    fn low_disk_calls_for_attention() {
        let (level, _) = one(|f| f.disk = Some((512 << 20, 100 << 30)));
        assert_eq!(level, Level::Attention);
        // 4 GiB of 100 GiB: under 5 %.
        let (level, _) = one(|f| f.disk = Some((4 << 30, 100 << 30)));
        assert_eq!(level, Level::Attention);
    }

    #[test]
    fn failing_outranks_attention_and_comes_first() {
        let facts = Facts {
            paused_by: Some("cli:bob".into()),
            dead_last_hour: 1,
            ..calm()
        };
        let verdict = verdict(&facts);
        assert_eq!(verdict.level, Level::Failing);
        assert_eq!(verdict.reasons.len(), 2);
        assert_eq!(verdict.reasons[0].text, "1 job went dead in the last hour");
        assert_eq!(
            verdict.to_json()["reasons"][1],
            "Dispatch is paused by cli:bob: no job runs"
        );
    }
}
