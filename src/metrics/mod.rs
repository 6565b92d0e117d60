//! Process-wide metrics in a prometheus-client registry, served at `GET /metrics`.
//!
//! Everything recorded is registered once here, so nothing can be recorded and then forgotten
//! at render time. Values that live in the ledger or the process (jobs by state, file sizes,
//! memory) are read at scrape time and passed in as a [`Snapshot`]. A leaf module: it knows
//! labels, not the types of the modules that record into it.

mod host;
mod routes;
mod tls;
mod traces;

pub use host::FilesystemSpace;
use host::ProcessStats;
pub use routes::RouteMetrics;
pub use tls::TlsMetrics;
pub use traces::TraceMetrics;

use crate::rollup::{Series, Timing, ROLLUP};
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// One set of metrics per process: the service runs one receiver.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

type Labels = [(&'static str, &'static str); 1];

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

/// How a handler attempt ended, as far as the metrics go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    Done,
    /// Failed, to be retried.
    Failed,
    /// Failed for the last time: the job is dead.
    Dead,
}

/// What one call to Sume's status endpoint came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollCall {
    Answered,
    /// 401 or 403: Sume refused our API key (something to alert on).
    Refused,
    /// No answer (connection, timeout).
    Failed,
}

/// What the ledger and the process look like at scrape time.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Jobs by state, every state named: the ledger's kept counts.
    pub jobs: Vec<(&'static str, u64)>,
    /// Age of the oldest job still waiting or running, in seconds.
    pub oldest_unfinished_age_seconds: f64,
    /// Expected jobs by state (`waiting`, `arrived`, `recovered`, `given_up`).
    pub expected: Vec<(&'static str, u64)>,
    pub ledger_bytes: u64,
    /// `None` where there is no WAL file (PostgreSQL).
    pub wal_bytes: Option<u64>,
    /// Claims waiting for their commit (on SQLite, with every other change: one writer queue).
    pub claim_queue_depth: u64,
    /// Work by route: `(route, waiting, running)`, read from the partial indexes of waiting
    /// and running work (the backlog, not the history).
    pub work: Vec<(String, u64, u64)>,
}

/// What one scrape found: the ledger's [`Snapshot`] and what is read beside it.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// `None` when the ledger could not be read in time: its gauges keep their last values.
    pub ledger: Option<Snapshot>,
    /// How long the job due the longest has waited to start, in seconds (0 when none is due).
    pub oldest_due_wait_seconds: f64,
    /// Whether a delivery sent now would be claimed (what `/readyz` answers).
    pub ready: bool,
    /// The file system holding the ledger, where it is a local file (SQLite).
    pub filesystem: Option<FilesystemSpace>,
}

/// A family of one unlabelled gauge: it is served only once set, so a value a backend cannot
/// know (the free disk of a PostgreSQL server) is absent rather than a misleading 0.
type Optional = Family<[(&'static str, &'static str); 0], Gauge>;

impl Snapshot {
    /// Jobs waiting to run: claimed or retrying.
    pub fn waiting_jobs(&self) -> u64 {
        self.jobs
            .iter()
            .filter(|(state, _)| matches!(*state, "claimed" | "retrying"))
            .map(|(_, count)| count)
            .sum()
    }

    /// Work waiting to run on `route` (claimed or retrying).
    pub fn waiting_on(&self, route: &str) -> u64 {
        self.work
            .iter()
            .find(|(name, _, _)| name == route)
            .map_or(0, |(_, waiting, _)| *waiting)
    }
}

pub struct Metrics {
    registry: Registry,
    deliveries: Family<Labels, Counter>,
    commits: Family<Labels, Counter>,
    batch_size: Histogram,
    wal_sync: Histogram,
    claim_commit: Histogram,
    duplicates_from_memory: Counter,
    writer_queue_depth: Gauge,
    jobs_dead: Counter,
    swept: Counter,
    dispatch_paused: Gauge,
    /// No label: a child appears only for a ledger that reports its work side (PostgreSQL).
    work_side_writable: Family<[(&'static str, &'static str); 0], Gauge>,
    ready: Gauge,
    ledger_reachable: Gauge,
    oldest_due_wait: Gauge<f64, std::sync::atomic::AtomicU64>,
    filesystem_free: Optional,
    filesystem_size: Optional,
    clock_skew: Gauge,
    signature_tolerance: Gauge,
    jobs: Family<Labels, Gauge>,
    oldest_unfinished: Gauge<f64, std::sync::atomic::AtomicU64>,
    ledger_files: Family<Labels, Gauge>,
    polls: Family<Labels, Counter>,
    recovered: Counter,
    given_up: Counter,
    connections_shed: Counter,
    csp_reports: Counter,
    expected: Family<Labels, Gauge>,
    bodies_purged: Counter,
    jobs_forgotten: Counter,
    expectations_forgotten: Counter,
    process_memory: Gauge,
    process_fds: Gauge,
    process_cpu: Counter<f64, std::sync::atomic::AtomicU64>,
    pub tls: TlsMetrics,
    pub routes: RouteMetrics,
    pub traces: TraceMetrics,
    /// Scrapes set the snapshot gauges, then encode: one at a time.
    scrape: Mutex<()>,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let seconds: fn() -> Histogram = || Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let metrics = Metrics {
            deliveries: Family::default(),
            commits: Family::default(),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            wal_sync: Histogram::new(exponential_buckets(0.0001, 2.0, 14)),
            claim_commit: seconds(),
            duplicates_from_memory: Counter::default(),
            writer_queue_depth: Gauge::default(),
            jobs_dead: Counter::default(),
            swept: Counter::default(),
            dispatch_paused: Gauge::default(),
            work_side_writable: Family::default(),
            ready: Gauge::default(),
            ledger_reachable: Gauge::default(),
            oldest_due_wait: Gauge::default(),
            filesystem_free: Family::default(),
            filesystem_size: Family::default(),
            clock_skew: Gauge::default(),
            signature_tolerance: Gauge::default(),
            jobs: Family::default(),
            oldest_unfinished: Gauge::default(),
            ledger_files: Family::default(),
            polls: Family::default(),
            recovered: Counter::default(),
            given_up: Counter::default(),
            connections_shed: Counter::default(),
            csp_reports: Counter::default(),
            expected: Family::default(),
            bodies_purged: Counter::default(),
            jobs_forgotten: Counter::default(),
            expectations_forgotten: Counter::default(),
            process_memory: Gauge::default(),
            process_fds: Gauge::default(),
            process_cpu: Counter::default(),
            tls: TlsMetrics::default(),
            routes: RouteMetrics::default(),
            traces: TraceMetrics::default(),
            scrape: Mutex::new(()),
            registry: Registry::default(),
        };
        let m = &metrics;
        m.tls.register(&mut registry);
        m.routes.register(&mut registry);
        m.traces.register(&mut registry);
        registry.register(
            "sume_deliveries",
            "Webhook deliveries by the answer they got (outcome)",
            m.deliveries.clone(),
        );
        registry.register(
            "sume_ledger_commits",
            "Ledger transactions by result (committed, failed)",
            m.commits.clone(),
        );
        registry.register(
            "sume_ledger_batch_size",
            "Changes per group-commit transaction",
            m.batch_size.clone(),
        );
        registry.register_with_unit(
            "sume_ledger_wal_sync",
            "How long each fsync of the SQLite ledger's WAL took (synchronous = full)",
            Unit::Seconds,
            m.wal_sync.clone(),
        );
        registry.register_with_unit(
            "sume_claim_commit",
            "Time from a delivery's claim being queued to its answer: committed and on disk, or failed",
            Unit::Seconds,
            m.claim_commit.clone(),
        );
        registry.register(
            "sume_duplicates_from_memory",
            "Duplicate deliveries answered from the job_ids acknowledged in the last 10 minutes, without the ledger",
            m.duplicates_from_memory.clone(),
        );
        registry.register(
            "sume_ledger_writer_queue_depth",
            "Changes waiting for the ledger writer",
            m.writer_queue_depth.clone(),
        );
        registry.register(
            "sume_jobs_dead",
            "Jobs that used all their attempts",
            m.jobs_dead.clone(),
        );
        registry.register(
            "sume_jobs_swept",
            "Attempts whose lease the sweeper took back",
            m.swept.clone(),
        );
        registry.register(
            "sume_dispatch_paused",
            "1 while an operator has paused dispatch (`jobs pause`): deliveries are claimed, no job runs",
            m.dispatch_paused.clone(),
        );
        registry.register(
            "sume_work_side_writable",
            "1 while the work side's last ledger write (start, finish, sweep, retention, reconcile) went through, 0 while they fail (PostgreSQL ledger)",
            m.work_side_writable.clone(),
        );
        registry.register(
            "sume_ready",
            "1 while a delivery sent now would be claimed (what /readyz answers), proved at each scrape with no delivery needed",
            m.ready.clone(),
        );
        registry.register(
            "sume_ledger_reachable",
            "1 when this scrape read the ledger (reads only: a read-only PostgreSQL primary is reachable), 0 when it could not within 5s (PostgreSQL unreachable, SQLite unreadable): the ledger's gauges then keep their last values",
            m.ledger_reachable.clone(),
        );
        registry.register_with_unit(
            "sume_oldest_due_job_wait",
            "How long the job due the longest (claimed, or retrying past its backoff) has waited since it became due (0 when none is due): through a pause too; through a hold it follows the probe rotation (a failed probe makes its job due later), not the hold",
            Unit::Seconds,
            m.oldest_due_wait.clone(),
        );
        registry.register_with_unit(
            "sume_ledger_filesystem_free",
            "Space the service may still use on the file system holding the SQLite ledger",
            Unit::Bytes,
            m.filesystem_free.clone(),
        );
        registry.register_with_unit(
            "sume_ledger_filesystem_size",
            "Size of the file system holding the SQLite ledger",
            Unit::Bytes,
            m.filesystem_size.clone(),
        );
        registry.register_with_unit(
            "sume_delivery_clock_skew",
            "Our clock minus the signed timestamp of the last verified delivery (positive: Sume's clock is behind)",
            Unit::Seconds,
            m.clock_skew.clone(),
        );
        registry.register_with_unit(
            "sume_signature_tolerance",
            "The configured signature.tolerance: a delivery whose timestamp is further from our clock is refused",
            Unit::Seconds,
            m.signature_tolerance.clone(),
        );
        registry.register(
            "sume_jobs",
            "Jobs in the ledger by state (every receiver's, on a shared ledger)",
            m.jobs.clone(),
        );
        registry.register_with_unit(
            "sume_oldest_unfinished_job_age",
            "Age of the oldest job still claimed, running or retrying (0 when none)",
            Unit::Seconds,
            m.oldest_unfinished.clone(),
        );
        registry.register_with_unit(
            "sume_ledger_file",
            "Size of the ledger's files (file: db, wal)",
            Unit::Bytes,
            m.ledger_files.clone(),
        );
        registry.register(
            "sume_reconcile_polls",
            "Calls to Sume's status endpoint by result (answered; refused: 401 or 403, our API key; failed: no answer)",
            m.polls.clone(),
        );
        registry.register(
            "sume_reconcile_recovered",
            "Jobs claimed by polling: their webhook never arrived",
            m.recovered.clone(),
        );
        registry.register(
            "sume_connections_shed",
            "Connections closed at the connection limit while they waited for a request head, to let a new one in",
            m.connections_shed.clone(),
        );
        registry.register(
            "sume_console_csp_reports",
            "Content-Security-Policy violation reports posted to the console (kept or not)",
            m.csp_reports.clone(),
        );
        registry.register(
            "sume_reconcile_given_up",
            "Expected jobs given up on: no webhook and no terminal status within give_up_after",
            m.given_up.clone(),
        );
        registry.register(
            "sume_expected_jobs",
            "Expected jobs by state (waiting, arrived, recovered, given_up)",
            m.expected.clone(),
        );
        registry.register(
            "sume_retention_bodies_purged",
            "Bodies of finished jobs dropped by retention",
            m.bodies_purged.clone(),
        );
        registry.register(
            "sume_retention_jobs_forgotten",
            "Finished jobs deleted by retention (after dedupe_ttl)",
            m.jobs_forgotten.clone(),
        );
        registry.register(
            "sume_retention_expectations_forgotten",
            "Resolved expected jobs deleted by retention",
            m.expectations_forgotten.clone(),
        );
        registry.register(
            "sume_receiver_build",
            "The running build",
            Info::new([
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", env!("SUME_RECEIVER_COMMIT")),
            ]),
        );
        registry.register_with_unit(
            "process_resident_memory",
            "Resident memory of this process",
            Unit::Bytes,
            m.process_memory.clone(),
        );
        registry.register(
            "process_open_fds",
            "Open file descriptors of this process",
            m.process_fds.clone(),
        );
        registry.register_with_unit(
            "process_cpu",
            "CPU time used by this process (user and system)",
            Unit::Seconds,
            m.process_cpu.clone(),
        );
        // Every label value exists from the start: a rate over a series that appears only at
        // its first event misses that event.
        for outcome in DeliveryOutcome::ALL {
            drop(m.deliveries.get_or_create(&[("outcome", outcome.label())]));
        }
        for (family, results) in [
            (&m.commits, &["committed", "failed"][..]),
            (&m.polls, &["answered", "refused", "failed"]),
        ] {
            for result in results {
                drop(family.get_or_create(&[("result", result)]));
            }
        }
        Metrics {
            registry,
            ..metrics
        }
    }

    pub fn record_delivery(&self, outcome: DeliveryOutcome) {
        self.deliveries
            .get_or_create(&[("outcome", outcome.label())])
            .inc();
        ROLLUP.record(match outcome {
            DeliveryOutcome::Claimed => Series::Claimed,
            DeliveryOutcome::Duplicate => Series::Duplicate,
            DeliveryOutcome::Unavailable => Series::Unavailable,
            _ => Series::Refused,
        });
    }

    /// Deliveries since start: (claimed, duplicates, refused for any reason).
    pub fn delivery_totals(&self) -> (u64, u64, u64) {
        let mut totals = (0, 0, 0);
        for outcome in DeliveryOutcome::ALL {
            let count = self
                .deliveries
                .get_or_create(&[("outcome", outcome.label())])
                .get();
            match outcome {
                DeliveryOutcome::Claimed => totals.0 += count,
                DeliveryOutcome::Duplicate => totals.1 += count,
                _ => totals.2 += count,
            }
        }
        totals
    }

    /// Since start: leases the sweeper took back, jobs polls recovered, expectations given up.
    pub fn maintenance_totals(&self) -> (u64, u64, u64) {
        (self.swept.get(), self.recovered.get(), self.given_up.get())
    }

    pub fn record_commit(&self, batch_size: usize, committed: bool) {
        let result = if committed { "committed" } else { "failed" };
        self.commits.get_or_create(&[("result", result)]).inc();
        self.batch_size.observe(batch_size as f64);
    }

    pub fn record_wal_sync(&self, seconds: f64) {
        self.wal_sync.observe(seconds);
    }

    /// How long an answered claim waited for its answer (`sume_claim_commit`). Recorded by the
    /// caller around its own await: an async wrapper would hold the claim's future twice (once
    /// as its argument, once being awaited), and every delivery would copy both.
    pub fn record_claim_wait(&self, waited: std::time::Duration) {
        self.claim_commit.observe(waited.as_secs_f64());
        ROLLUP.record_timing(Timing::Ack, waited);
    }

    pub fn record_duplicate_from_memory(&self) {
        self.duplicates_from_memory.inc();
    }

    pub fn record_attempt_end(&self, route: &str, result: AttemptResult, seconds: Option<f64>) {
        ROLLUP.record(match result {
            AttemptResult::Done => Series::Done,
            AttemptResult::Failed => Series::Failed,
            AttemptResult::Dead => Series::Dead,
        });
        self.routes.record_attempt_end(route, result, seconds);
        if let Some(seconds) = seconds {
            let took = std::time::Duration::try_from_secs_f64(seconds).unwrap_or_default();
            ROLLUP.record_timing(Timing::Run, took);
        }
        if result == AttemptResult::Dead {
            self.jobs_dead.inc();
        }
    }

    /// Whether the worker found dispatch paused when it last looked.
    pub fn set_dispatch_paused(&self, paused: bool) {
        self.dispatch_paused.set(i64::from(paused));
    }

    pub fn set_work_side_writable(&self, writable: bool) {
        self.work_side_writable
            .get_or_create(&[])
            .set(i64::from(writable));
    }

    /// A verified delivery's clock skew ([`crate::signature`]'s `skew_secs`).
    pub fn record_clock_skew(&self, skew_secs: i64) {
        self.clock_skew.set(skew_secs);
    }

    pub fn set_signature_tolerance(&self, tolerance: std::time::Duration) {
        self.signature_tolerance.set(gauge(tolerance.as_secs()));
    }

    pub fn record_swept(&self, count: usize) {
        self.swept.inc_by(count as u64);
    }

    pub fn record_retention(&self, bodies: usize, jobs: usize, expectations: usize) {
        self.bodies_purged.inc_by(bodies as u64);
        self.jobs_forgotten.inc_by(jobs as u64);
        self.expectations_forgotten.inc_by(expectations as u64);
    }

    /// One call to Sume's status endpoint, by what came of it.
    pub fn record_poll(&self, call: PollCall) {
        let result = match call {
            PollCall::Answered => "answered",
            PollCall::Refused => "refused",
            PollCall::Failed => "failed",
        };
        self.polls.get_or_create(&[("result", result)]).inc();
    }

    pub fn record_recovered(&self) {
        self.recovered.inc();
    }

    pub fn record_given_up(&self) {
        self.given_up.inc();
    }

    pub fn record_connection_shed(&self) {
        self.connections_shed.inc();
    }

    pub fn record_csp_report(&self) {
        self.csp_reports.inc();
    }

    /// The Prometheus text exposition, with the scrape-time values of `scrape`.
    pub fn render(&self, scrape: &Scrape) -> String {
        let _one_scrape_at_a_time = self.scrape.lock().expect("not poisoned");
        self.ready.set(i64::from(scrape.ready));
        self.ledger_reachable
            .set(i64::from(scrape.ledger.is_some()));
        self.oldest_due_wait.set(scrape.oldest_due_wait_seconds);
        if let Some(space) = scrape.filesystem {
            self.filesystem_free
                .get_or_create(&[])
                .set(gauge(space.free));
            self.filesystem_size
                .get_or_create(&[])
                .set(gauge(space.size));
        }
        if let Some(snapshot) = &scrape.ledger {
            self.set_snapshot(snapshot);
        }
        let process = ProcessStats::read();
        self.process_memory.set(gauge(process.resident_bytes));
        self.process_fds.set(gauge(process.open_fds));
        // A counter only goes up: add what was used since the last scrape.
        let used = process.cpu_seconds - self.process_cpu.get();
        if used > 0.0 {
            self.process_cpu.inc_by(used);
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    fn set_snapshot(&self, snapshot: &Snapshot) {
        for (state, count) in &snapshot.jobs {
            self.jobs
                .get_or_create(&[("state", state)])
                .set(gauge(*count));
        }
        for (state, count) in &snapshot.expected {
            self.expected
                .get_or_create(&[("state", state)])
                .set(gauge(*count));
        }
        self.oldest_unfinished
            .set(snapshot.oldest_unfinished_age_seconds);
        self.routes.set_work(&snapshot.work);
        self.ledger_files
            .get_or_create(&[("file", "db")])
            .set(gauge(snapshot.ledger_bytes));
        if let Some(wal_bytes) = snapshot.wal_bytes {
            self.ledger_files
                .get_or_create(&[("file", "wal")])
                .set(gauge(wal_bytes));
        }
        self.writer_queue_depth
            .set(gauge(snapshot.claim_queue_depth));
    }
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_that_cannot_read_the_ledger_says_so_and_keeps_its_last_values() {
        let metrics = Metrics::new();
        let read = Scrape {
            ledger: Some(Snapshot {
                jobs: vec![("dead", 3)],
                ..Snapshot::default()
            }),
            ready: true,
            ..Scrape::default()
        };
        let text = metrics.render(&read);
        assert!(text.contains("\nsume_ledger_reachable 1\n"), "{text}");
        assert!(text.contains("\nsume_ready 1\n"), "{text}");
        // No file system known (PostgreSQL): no value, rather than a disk that looks full.
        assert!(
            !text.contains("\nsume_ledger_filesystem_free_bytes "),
            "{text}"
        );

        let text = metrics.render(&Scrape::default());
        assert!(text.contains("\nsume_ledger_reachable 0\n"), "{text}");
        assert!(text.contains("\nsume_ready 0\n"), "{text}");
        assert!(text.contains("\nsume_jobs{state=\"dead\"} 3\n"), "{text}");
    }
}
