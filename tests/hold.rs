//! The hold: a downstream outage costs no job; a bad job is not an outage; probes, Retry-After,
//! the rate limit, pause and resume during a hold, and two receivers sharing one.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use sume_receiver::ledger::{self, Ledger, StopKind};

const UP: u8 = 0;
/// Answers 500 to everything: an outage the hold must infer from different jobs failing.
const DOWN: u8 = 1;
/// Answers 503 with `Retry-After: 2`.
const BUSY: u8 = 2;

/// A handler's downstream: up, down or busy as the test says; `poison-*` jobs always get a 500
/// and `content-*` jobs a 422. Counts each job's successes and when each request came.
#[derive(Default)]
struct Downstream {
    mode: AtomicU8,
    requests: AtomicUsize,
    arrivals: Mutex<Vec<Instant>>,
    done: Mutex<HashMap<String, u32>>,
}

impl Downstream {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn answer(&self, job_id: &str) -> (u16, Option<&'static str>) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.arrivals.lock().unwrap().push(Instant::now());
        if job_id.starts_with("poison") {
            return (500, None);
        }
        if job_id.starts_with("content") {
            return (422, None);
        }
        match self.mode.load(Ordering::SeqCst) {
            DOWN => (500, None),
            BUSY => (503, Some("2")),
            _ => {
                *self
                    .done
                    .lock()
                    .unwrap()
                    .entry(job_id.to_owned())
                    .or_default() += 1;
                (204, None)
            }
        }
    }
}

async fn start_downstream(mode: u8) -> (String, Arc<Downstream>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let downstream = Arc::new(Downstream::default());
    downstream.set(mode);
    let shared = downstream.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let downstream = shared.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let job_id = request
                        .headers()
                        .get("x-sume-job-id")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    let (status, retry_after) = downstream.answer(&job_id);
                    let mut response = Response::new(Full::new(Bytes::from_static(b"down")));
                    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                    if let Some(after) = retry_after {
                        response
                            .headers_mut()
                            .insert("retry-after", after.parse().unwrap());
                    }
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}/jobs"), downstream)
}

/// `[handler]` for `url` with compressed timings: a job left alone dies within ~1 s of its
/// first failure (300 ms doubling to 600 ms, 3 attempts).
fn handler(url: &str, extra: &str) -> String {
    format!(
        "[handler]\nurl = \"{url}\"\ntimeout = \"2s\"\nconcurrency = 8\nmax_attempts = 3\n\
         backoff = \"300ms\"\nmax_backoff = \"600ms\"\nprobe_interval = \"100ms\"\n\
         max_probe_interval = \"400ms\"\nramp = \"100ms\"\n{extra}\n\
         [sweeper]\ninterval = \"1h\"\n"
    )
}

fn count(server: &TestServer, sql: &str) -> i64 {
    server.value(sql, &[]).as_i64().unwrap()
}

fn held(server: &TestServer) -> bool {
    count(server, "SELECT count(*) FROM route_holds") == 1
}

async fn deliver_all(server: &TestServer, job_ids: impl Iterator<Item = String>) {
    for job_id in job_ids {
        assert_eq!(server.deliver(&job_body(&job_id)).await.status, 200);
    }
}

/// A metric's value in a scrape, summed over its routes (0 when absent).
fn metric(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            // Unlabelled, or any route's series: their sum.
            let value = rest
                .strip_prefix(' ')
                .or_else(|| Some(rest.split_once("} ")?.1))?;
            Some(value.trim().parse::<f64>().unwrap())
        })
        .sum()
}

/// Waits until `server`'s `/readyz` says its dispatch is `wanted` (`paused`, `held`): as its
/// worker last read the ledger. Neither a pause nor a hold makes it unready.
async fn dispatch_becomes(server: &TestServer, wanted: &str) {
    let mut dispatch = serde_json::Value::Null;
    for _ in 0..30 {
        let readyz = server
            .request(Method::GET, "/readyz", &[], "")
            .await
            .unwrap();
        assert_eq!(readyz.status, 200, "{wanted} leaves the receiver ready");
        dispatch = json(&readyz)["dispatch"].clone();
        if dispatch == wanted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dispatch, wanted, "a receiver's dispatch after 3 s");
}

/// The outage, on `receivers` receivers sharing one ledger: 200 jobs arrive while the
/// downstream is down, which lasts 3 s (past every job's backoffs: alone, a job would be dead
/// within 2.4 s of its first failure); then it comes back. Every job is done, each run
/// successfully exactly once; none is dead; none paid more than the one failed attempt (per
/// receiver) that revealed the outage.
async fn outage_costs_no_job(receivers: usize) {
    let (url, downstream) = start_downstream(DOWN).await;
    let dir = tempfile::tempdir().unwrap();
    let shared = (receivers > 1).then(|| postgres_url_of(dir.path()));
    // Retries no sooner than 0.8 s: the `hold_after` failures that reveal the outage come
    // before any job's retry even on a slow machine. At 300 ms a CI run on PostgreSQL saw a
    // job fail twice before the hold opened, which is the streak working as documented
    // (docs/bad-day.md), not the cost this test bounds.
    let config = handler(&url, "").replace(
        "backoff = \"300ms\"\nmax_backoff = \"600ms\"",
        "backoff = \"1s\"\nmax_backoff = \"1s\"",
    );
    assert!(config.contains("max_backoff = \"1s\""), "{config}");
    let first = TestServer::start_in(dir, &config).await;
    let mut others = Vec::new();
    for database in shared.iter().cycle().take(receivers - 1) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("postgres-url"), database).unwrap();
        others.push(TestServer::start_in(dir, &config).await);
    }
    // Paused while they arrive, so that they meet the outage together: the hold opens after
    // the first `hold_after` failures whatever the pace of the deliveries (jobs trickling in
    // one by one, slower than the backoff, may fail twice before it does). A receiver reads a
    // pause made elsewhere within a second, and runs the first jobs until it has: a run saw
    // them fail and open a hold during the pause, which the resume ended, so that the outage
    // was revealed again after it.
    dispatch(&first, "pause").await;
    for server in std::iter::once(&first).chain(&others) {
        dispatch_becomes(server, "paused").await;
    }
    deliver_all(&first, (0..200).map(|i| format!("outage-{i:03}"))).await;
    dispatch(&first, "resume").await;
    assert!(
        eventually(Duration::from_secs(10), || held(&first)).await,
        "no hold opened"
    );
    for server in std::iter::once(&first).chain(&others) {
        dispatch_becomes(server, "held").await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        count(&first, "SELECT count(*) FROM jobs WHERE state = 'dead'"),
        0
    );
    let during = downstream.requests();

    downstream.set(UP);
    let drained = eventually(Duration::from_secs(30), || {
        count(&first, "SELECT count(*) FROM jobs WHERE state = 'done'") == 200
    })
    .await;
    assert!(
        drained,
        "the backlog did not drain after the downstream came back"
    );
    assert!(!held(&first));
    assert_eq!(
        count(&first, "SELECT count(*) FROM jobs WHERE state = 'dead'"),
        0
    );
    // The pause they arrived in and the hold they waited through stay in their timelines.
    let ledger = Ledger::open_existing(&first.config.database).await.unwrap();
    for job_id in ["outage-000", "outage-199"] {
        let job = ledger
            .show_job(&sume_receiver::job_id::JobId::parse(job_id).unwrap())
            .await
            .unwrap()
            .unwrap();
        let stops = ledger.stops_delaying(&job, ledger::now_ms()).await.unwrap();
        // On failure: the job's timeline and every stop, not only those found delaying it.
        let every_stop = ledger.dispatch_stops(0, i64::MAX, 100).await.unwrap();
        let why = format!(
            "{job_id}: delayed by {stops:?}\nreceived {}, attempts {:#?}\nactions {:#?}\nevery stop {every_stop:#?}",
            job.summary.received_at, job.history, job.actions
        );
        assert_eq!(stops[0].kind, StopKind::Pause, "{why}");
        let hold = stops.iter().rfind(|stop| stop.kind == StopKind::Hold);
        assert!(hold.is_some_and(|hold| hold.ended_at.is_some()), "{why}");
        assert!(
            stops.iter().all(|stop| stop.ended_at.is_some()),
            "{stops:?}"
        );
    }
    ledger.close().await;
    // The probes that failed were given back: each says why in its history, and the attempt
    // after it names the hold, not a restart (nothing restarted).
    assert!(
        count(
            &first,
            "SELECT count(*) FROM job_attempts WHERE outcome = 'released'"
        ) >= 1
    );
    assert_eq!(
        count(
            &first,
            "SELECT count(*) FROM job_attempts WHERE outcome = 'released'
               AND (error IS NULL OR error NOT LIKE '%during a handler hold%')"
        ),
        0
    );
    assert_eq!(
        count(
            &first,
            "SELECT count(*) FROM job_attempts WHERE cause = 'restart'"
        ),
        0
    );
    let done = downstream.done.lock().unwrap().clone();
    assert_eq!(done.len(), 200);
    assert!(done.values().all(|&runs| runs == 1), "{done:?}");
    // Done after at most one failure (the one that revealed the outage, if any) on each
    // receiver: another one may run a job before it has read the hold.
    let most = count(&first, "SELECT max(attempts) FROM jobs");
    assert!(most <= 1 + receivers as i64, "a job took {most} attempts");
    // (Tests share one process's metrics: lower bounds only.)
    let scrape = first.metrics().await;
    assert!(
        metric(&scrape, "sume_handler_holds_opened_total") >= 1.0,
        "{scrape}"
    );
    assert!(
        metric(&scrape, "sume_handler_held_seconds_total") >= 2.0,
        "{scrape}"
    );
    // 200 jobs failing alone, 3 attempts each, would have made 600 requests.
    assert!(
        during < 100,
        "{during} requests reached the downstream during the outage"
    );
    for other in others {
        other.stop().await.0.unwrap();
    }
    first.stop().await.0.unwrap();
}

on_both_ledgers! {
    #[tokio::test(flavor = "multi_thread")]
    async fn an_outage_longer_than_every_backoff_costs_no_job() {
        outage_costs_no_job(1).await;
    }

    /// A job that always fails among jobs that succeed goes through its attempts to the dead
    /// letter on its own schedule; jobs failing for their content (422) never open a hold,
    /// however many in a row.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_poison_job_dies_on_its_schedule_and_no_hold_opens() {
        let (url, downstream) = start_downstream(UP).await;
        let server = Arc::new(TestServer::start(&handler(&url, "hold_after = 3\n")).await);
        let watched = server.clone();
        let ever_held = tokio::spawn(async move {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(8) {
                if held(&watched) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        });
        deliver_all(&server, std::iter::once("poison-1".to_owned())).await;
        for i in 0..20 {
            deliver_all(&server, std::iter::once(format!("healthy-{i}"))).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        deliver_all(&server, (0..6).map(|i| format!("content-{i}"))).await;
        let finished = eventually(Duration::from_secs(10), || {
            count(&server, "SELECT count(*) FROM jobs WHERE state IN ('done', 'dead')") == 27
        })
        .await;
        assert!(finished);
        assert_eq!(server.state_of("poison-1").as_deref(), Some("dead"));
        assert_eq!(
            count(&server, "SELECT attempts FROM jobs WHERE job_id = 'poison-1'"),
            3
        );
        assert_eq!(count(&server, "SELECT count(*) FROM jobs WHERE job_id LIKE 'content-%' AND state = 'dead' AND attempts = 3"), 6);
        assert_eq!(count(&server, "SELECT count(*) FROM jobs WHERE state = 'done'"), 20);
        assert_eq!(downstream.done.lock().unwrap().len(), 20);
        assert!(!ever_held.await.unwrap(), "a hold opened");
        Arc::into_inner(server).unwrap().stop().await.0.unwrap();
    }

    /// A 503 opens a hold at once, and its `Retry-After` (2 s, past the 100 ms probe interval)
    /// delays the first probe; after it, the job is done.
    #[tokio::test(flavor = "multi_thread")]
    async fn retry_after_delays_the_first_probe() {
        let (url, downstream) = start_downstream(BUSY).await;
        let config = handler(&url, "").replace("\"400ms\"", "\"5s\"");
        let server = TestServer::start(&config).await;
        deliver_all(&server, std::iter::once("busy-1".to_owned())).await;
        assert!(eventually(Duration::from_secs(5), || held(&server)).await);
        let wait = count(&server, "SELECT next_probe_at - since FROM route_holds");
        assert!((2_000..2_200).contains(&wait), "first probe {wait} ms after the hold");
        assert_eq!(count(&server, "SELECT attempts FROM jobs WHERE job_id = 'busy-1'"), 1);
        downstream.set(UP);
        let done = eventually(Duration::from_secs(10), || {
            server.state_of("busy-1").as_deref() == Some("done")
        })
        .await;
        assert!(done);
        // As the downstream saw them: the probe came no sooner than its Retry-After (and the
        // 100 ms probe interval did not make it come sooner).
        let arrivals = downstream.arrivals.lock().unwrap().clone();
        assert_eq!(arrivals.len(), 2);
        let apart = arrivals[1] - arrivals[0];
        assert!(apart >= Duration::from_millis(1_950), "probed {apart:?} after the 503");
        assert_eq!(count(&server, "SELECT attempts FROM jobs WHERE job_id = 'busy-1'"), 2);
        server.stop().await.0.unwrap();
    }

    /// `max_per_second` spaces every start: 41 jobs at 20 a second take 2 s, less 10 % at
    /// most.
    #[tokio::test(flavor = "multi_thread")]
    async fn max_per_second_spaces_the_starts() {
        let (url, downstream) = start_downstream(UP).await;
        let server = TestServer::start(&handler(&url, "max_per_second = 20.0\n")).await;
        dispatch(&server, "pause").await;
        deliver_all(&server, (0..41).map(|i| format!("paced-{i}"))).await;
        dispatch(&server, "resume").await;
        let done = eventually(Duration::from_secs(10), || downstream.requests() == 41).await;
        assert!(done);
        let arrivals = downstream.arrivals.lock().unwrap().clone();
        let span = (arrivals[40] - arrivals[0]).as_secs_f64();
        // Never more than 10 % above the limit (below it, as much as a busy machine lags: the
        // whole suite runs at once on two cores).
        assert!(span >= 1.8, "41 starts at 20/s took {span} s");
        server.stop().await.0.unwrap();
    }

    /// Paused during a hold, nothing runs, not even a probe; `jobs resume` then ends the hold
    /// at once (no probe needed), and the waiting jobs run.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_pause_during_a_hold_stops_probes_and_resume_ends_the_hold() {
        let (url, downstream) = start_downstream(DOWN).await;
        let server = TestServer::start(&handler(&url, "")).await;
        deliver_all(&server, (0..8).map(|i| format!("paused-{i}"))).await;
        assert!(eventually(Duration::from_secs(5), || held(&server)).await);
        dispatch(&server, "pause").await;
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let before = downstream.requests();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(downstream.requests(), before, "a probe ran while paused");
        assert!(held(&server), "a pause does not end the hold");
        downstream.set(UP);
        dispatch(&server, "resume").await;
        assert!(!held(&server), "resume ends the hold");
        let done = eventually(Duration::from_secs(10), || {
            count(&server, "SELECT count(*) FROM jobs WHERE state = 'done'") == 8
        })
        .await;
        assert!(done);
        server.stop().await.0.unwrap();
    }
}

/// The real binary killed with SIGKILL during a hold and started again: the hold is still
/// there, so the backlog makes no burst of attempts against the downstream; once it is back,
/// every job is done.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_during_a_hold_keeps_it() {
    use common::service::{signed_delivery, write_config, Service};
    if Backend::current() != Backend::Sqlite {
        return skip("a_kill_9_during_a_hold_keeps_it", "reads the SQLite file");
    }
    let (url, downstream) = start_downstream(DOWN).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Probes a second apart: a burst after the restart would be plain to see.
    let extra = handler(&url, "")
        .replace("\"100ms\"\nmax_probe", "\"1s\"\nmax_probe")
        .replace("\"400ms\"", "\"2s\"");
    let config = write_config(dir.path(), port, "", &extra);
    let service = Service::start(&config, port).await;
    let client = sume_receiver::http_client::new_client();
    for i in 0..30 {
        let body = job_body(&format!("killed-{i}"));
        let request = signed_delivery(port, SECRET, &body);
        let answer =
            sume_receiver::http_client::send(&client, request, Duration::from_secs(10), 4096)
                .await
                .unwrap();
        assert_eq!(answer.status, 200);
    }
    let ledger = dir.path().join("ledger.sqlite3");
    let holds = || {
        let db = rusqlite::Connection::open(&ledger).unwrap();
        db.query_row("SELECT count(*) FROM route_holds", [], |row| {
            row.get::<_, i64>(0)
        })
        .unwrap()
    };
    assert!(eventually(Duration::from_secs(5), || holds() == 1).await);
    service.kill_9();
    let before = downstream.requests();
    let service = Service::start(&config, port).await;
    assert_eq!(holds(), 1, "the hold did not survive the kill");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let burst = downstream.requests() - before;
    assert!(
        burst <= 2,
        "{burst} attempts right after the restart; a hold allows probes only"
    );
    downstream.set(UP);
    let done = eventually(Duration::from_secs(15), || {
        downstream.done.lock().unwrap().len() == 30
    })
    .await;
    assert!(
        done,
        "the backlog did not drain after the downstream came back"
    );
    assert_eq!(holds(), 0);
    service.stop_cleanly().await;
}

/// Pauses or resumes dispatch as `jobs pause` / `jobs resume` do, through the ledger.
async fn dispatch(server: &TestServer, change: &str) {
    let ledger = sume_receiver::ledger::Ledger::open_existing(&server.config.database)
        .await
        .unwrap();
    ledger
        .set_dispatch(
            change == "pause",
            &ledger::Actor::new("test"),
            sume_receiver::ledger::now_ms(),
        )
        .await
        .unwrap();
    ledger.close().await;
}

/// The same outage on PostgreSQL, with two receivers: both hold, and between them every job is
/// done once.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_on_two_receivers_costs_no_job() {
    Backend::Postgres
        .run(
            "an_outage_on_two_receivers_costs_no_job",
            outage_costs_no_job(2),
        )
        .await;
}

/// Regression (the two-receiver outage, under load: one job dead): a receiver counted the
/// failures of an outage another receiver had opened a hold for until its next read of the
/// hold, up to a second later, so a job could fail there twice and on the first receiver once,
/// and die. Now a receiver reads the hold again before it counts a failure. Here the hold is
/// opened in the ledger (as another receiver does) right after this receiver read it.
#[tokio::test(flavor = "multi_thread")]
async fn a_failure_under_a_hold_another_receiver_opened_costs_no_attempt() {
    Backend::Postgres
        .run(
            "a_failure_under_a_hold_another_receiver_opened_costs_no_attempt",
            async {
                let (url, downstream) = start_downstream(UP).await;
                // It opens no hold of its own: only the one in the ledger can spare the job.
                let server = TestServer::start(&handler(&url, "hold_after = 100\n")).await;
                // Its worker reads dispatch and the hold as it starts this job.
                deliver_all(&server, std::iter::once("warm-up".to_owned())).await;
                assert!(
                    eventually(Duration::from_secs(5), || {
                        server.state_of("warm-up").as_deref() == Some("done")
                    })
                    .await
                );
                let ledger = Ledger::open(&server.config.database).await.unwrap();
                let now = ledger::now_ms();
                let hold = ledger::Hold {
                    route: "default".to_owned(),
                    since: now,
                    reason: "opened by another receiver".to_owned(),
                    sample_error: "handler answered 500".to_owned(),
                    next_probe_at: now + 60_000,
                    probe_interval_ms: 60_000,
                };
                assert!(ledger.open_hold(&hold).await.unwrap());
                downstream.set(DOWN);
                deliver_all(&server, std::iter::once("during".to_owned())).await;
                // Run before its worker read the hold (or not run at all, if it read it first).
                eventually(Duration::from_secs(3), || downstream.requests() == 2).await;
                assert!(
                    eventually(Duration::from_secs(5), || {
                        server.state_of("during").as_deref() != Some("running")
                    })
                    .await
                );
                assert_eq!(
                    count(&server, "SELECT attempts FROM jobs WHERE job_id = 'during'"),
                    0,
                    "a failure under the ledger's hold was counted"
                );
                ledger.close().await;
                server.stop().await.0.unwrap();
            },
        )
        .await;
}
