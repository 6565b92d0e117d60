//! Process-wide counters, served in the Prometheus text format at `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::ledger::State;

/// One set of counters per process: the service runs one receiver.
pub static METRICS: Metrics = Metrics::new();

/// Deliveries by the answer they got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    Claimed,
    Duplicate,
    Unauthorized,
    BadRequest,
    TooLarge,
    Unavailable,
}

impl DeliveryOutcome {
    const ALL: [DeliveryOutcome; 6] = [
        DeliveryOutcome::Claimed,
        DeliveryOutcome::Duplicate,
        DeliveryOutcome::Unauthorized,
        DeliveryOutcome::BadRequest,
        DeliveryOutcome::TooLarge,
        DeliveryOutcome::Unavailable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DeliveryOutcome::Claimed => "claimed",
            DeliveryOutcome::Duplicate => "duplicate",
            DeliveryOutcome::Unauthorized => "unauthorized",
            DeliveryOutcome::BadRequest => "bad_request",
            DeliveryOutcome::TooLarge => "too_large",
            DeliveryOutcome::Unavailable => "unavailable",
        }
    }
}

pub struct Metrics {
    deliveries: [AtomicU64; 6],
    commits: AtomicU64,
    failed_commits: AtomicU64,
    batched_writes: AtomicU64,
    attempts_done: AtomicU64,
    attempts_failed: AtomicU64,
    jobs_dead: AtomicU64,
    swept: AtomicU64,
    bodies_purged: AtomicU64,
    jobs_forgotten: AtomicU64,
    polls: AtomicU64,
    polls_failed: AtomicU64,
    jobs_recovered: AtomicU64,
    expectations_given_up: AtomicU64,
}

impl Metrics {
    const fn new() -> Self {
        Self {
            deliveries: [const { AtomicU64::new(0) }; 6],
            commits: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            batched_writes: AtomicU64::new(0),
            attempts_done: AtomicU64::new(0),
            attempts_failed: AtomicU64::new(0),
            jobs_dead: AtomicU64::new(0),
            swept: AtomicU64::new(0),
            bodies_purged: AtomicU64::new(0),
            jobs_forgotten: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            polls_failed: AtomicU64::new(0),
            jobs_recovered: AtomicU64::new(0),
            expectations_given_up: AtomicU64::new(0),
        }
    }

    pub fn record_delivery(&self, outcome: DeliveryOutcome) {
        self.deliveries[outcome as usize].fetch_add(1, Relaxed);
    }

    /// Deliveries since start: (claimed, duplicates, refused for any reason).
    pub fn delivery_totals(&self) -> (u64, u64, u64) {
        let count = |outcome: DeliveryOutcome| self.deliveries[outcome as usize].load(Relaxed);
        let claimed = count(DeliveryOutcome::Claimed);
        let duplicates = count(DeliveryOutcome::Duplicate);
        let all: u64 = DeliveryOutcome::ALL.into_iter().map(count).sum();
        (claimed, duplicates, all - claimed - duplicates)
    }

    pub fn record_commit(&self, batch_size: usize, committed: bool) {
        let counter = if committed {
            &self.commits
        } else {
            &self.failed_commits
        };
        counter.fetch_add(1, Relaxed);
        self.batched_writes.fetch_add(batch_size as u64, Relaxed);
    }

    pub fn record_attempt_end(&self, state: State) {
        match state {
            State::Done => self.attempts_done.fetch_add(1, Relaxed),
            State::Dead => {
                self.attempts_failed.fetch_add(1, Relaxed);
                self.jobs_dead.fetch_add(1, Relaxed)
            }
            _ => self.attempts_failed.fetch_add(1, Relaxed),
        };
    }

    pub fn record_swept(&self, count: usize) {
        self.swept.fetch_add(count as u64, Relaxed);
    }

    pub fn record_vacuum(&self, report: &crate::vacuum::VacuumReport) {
        self.bodies_purged
            .fetch_add(report.bodies_purged as u64, Relaxed);
        self.jobs_forgotten
            .fetch_add(report.jobs_forgotten as u64, Relaxed);
    }

    /// One call to Sume's status endpoint, and whether it got an answer.
    pub fn record_poll(&self, answered: bool) {
        self.polls.fetch_add(1, Relaxed);
        if !answered {
            self.polls_failed.fetch_add(1, Relaxed);
        }
    }

    pub fn record_recovered(&self) {
        self.jobs_recovered.fetch_add(1, Relaxed);
    }

    pub fn record_given_up(&self) {
        self.expectations_given_up.fetch_add(1, Relaxed);
    }

    /// The Prometheus text exposition, with the current unfinished-job counts from the ledger.
    pub fn render(&self, unfinished: &[(State, u64)]) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let deliveries: Vec<(String, u64)> = DeliveryOutcome::ALL
            .iter()
            .map(|o| {
                (
                    format!("{{outcome=\"{}\"}}", o.label()),
                    self.deliveries[*o as usize].load(Relaxed),
                )
            })
            .collect();
        let deliveries: Vec<(&str, u64)> =
            deliveries.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        counter(
            "sume_deliveries_total",
            "Webhook deliveries by the answer they got.",
            &deliveries,
        );
        counter(
            "sume_ledger_commits_total",
            "Ledger transactions committed.",
            &[("", self.commits.load(Relaxed))],
        );
        counter(
            "sume_ledger_commit_failures_total",
            "Ledger transactions that failed.",
            &[("", self.failed_commits.load(Relaxed))],
        );
        counter(
            "sume_ledger_writes_total",
            "Changes written through group commits (writes / commits = mean batch).",
            &[("", self.batched_writes.load(Relaxed))],
        );
        counter(
            "sume_attempts_total",
            "Handler attempts by result.",
            &[
                ("{result=\"done\"}", self.attempts_done.load(Relaxed)),
                ("{result=\"failed\"}", self.attempts_failed.load(Relaxed)),
            ],
        );
        counter(
            "sume_jobs_dead_total",
            "Jobs that used all their attempts.",
            &[("", self.jobs_dead.load(Relaxed))],
        );
        counter(
            "sume_jobs_swept_total",
            "Jobs the sweeper queued again.",
            &[("", self.swept.load(Relaxed))],
        );
        let _ = writeln!(
            out,
            "# HELP sume_jobs Unfinished jobs in the ledger by state.\n# TYPE sume_jobs gauge"
        );
        for (state, count) in unfinished {
            let _ = writeln!(out, "sume_jobs{{state=\"{state}\"}} {count}");
        }
        out
    }
}
