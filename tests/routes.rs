//! Routes, end to end on the real server with real HTTP downstreams on loopback: events reach
//! the downstreams their routes name (fan-out included), an event no route takes is dead and
//! says why, and one downstream's outage holds its route alone while the others keep their pace.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// A downstream on a fixed loopback port that can be stopped (connections refused) and started
/// again; counts the jobs it answered 200.
struct Downstream {
    addr: SocketAddr,
    done: Arc<Mutex<HashMap<String, u32>>>,
    serving: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Downstream {
    async fn start() -> Arc<Downstream> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let downstream = Arc::new(Downstream {
            addr: listener.local_addr().unwrap(),
            done: Arc::default(),
            serving: Mutex::default(),
        });
        downstream.serve(listener);
        downstream
    }

    fn url(&self) -> String {
        format!("http://{}/jobs", self.addr)
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let done = self.done.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let done = done.clone();
                connections.spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let job_id = request
                            .headers()
                            .get("x-sume-job-id")
                            .map(|v| v.to_str().unwrap().to_owned())
                            .unwrap_or_default();
                        *done.lock().unwrap().entry(job_id).or_default() += 1;
                        async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        *self.serving.lock().unwrap() = Some(task);
    }

    /// Refuses every connection from now on (the open ones are dropped with the task).
    fn stop(&self) {
        if let Some(task) = self.serving.lock().unwrap().take() {
            task.abort();
        }
    }

    async fn restart(&self) {
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        self.serve(listener);
    }

    fn runs(&self, job_id: &str) -> u32 {
        self.done.lock().unwrap().get(job_id).copied().unwrap_or(0)
    }

    fn jobs(&self) -> usize {
        self.done.lock().unwrap().len()
    }
}

fn body(job_id: &str, event_type: &str) -> String {
    format!(r#"{{"job_id":"{job_id}","type":"{event_type}","queue":"main"}}"#)
}

fn route(name: &str, event_types: &str, url: &str, extra: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nevent_types = {event_types}\n{extra}\n\
         [route.handler]\nurl = \"{url}\"\ntimeout = \"2s\"\nconcurrency = 4\nmax_attempts = 3\n\
         backoff = \"200ms\"\nmax_backoff = \"400ms\"\nprobe_interval = \"200ms\"\n\
         max_probe_interval = \"500ms\"\nramp = \"100ms\"\n"
    )
}

/// Each route's work of a job: (route, state, attempts), by route.
fn work_of(server: &TestServer, job_id: &str) -> Vec<(String, String, i64)> {
    server
        .rows(
            &format!(
                "SELECT route, state, attempts FROM job_routes WHERE {} ORDER BY route",
                work_of_job(&server.config, "?1")
            ),
            &[job_id],
        )
        .into_iter()
        .map(|row| {
            (
                row[0].as_str().unwrap().to_owned(),
                row[1].as_str().unwrap().to_owned(),
                row[2].as_i64().unwrap(),
            )
        })
        .collect()
}

fn done(route: &str) -> (String, String, i64) {
    (route.to_owned(), "done".to_owned(), 1)
}

/// Claim-to-done times of `job_ids`, from the ledger: when each was received and when its
/// work on every route was done.
fn claim_to_done(server: &TestServer, job_ids: &[String]) -> Vec<Duration> {
    job_ids
        .iter()
        .map(|job_id| {
            let row = &server.rows(
                "SELECT finished_at - received_at FROM jobs WHERE job_id = ?1 AND state = 'done'",
                &[job_id],
            )[0];
            Duration::from_millis(row[0].as_u64().unwrap())
        })
        .collect()
}

fn p90(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[(times.len() * 90).div_ceil(100) - 1]
}

/// Sends `count` deliveries of `event_type` at `per_second`; their job ids.
async fn deliver_at(
    server: &TestServer,
    prefix: &str,
    event_type: &str,
    count: usize,
    per_second: u64,
) -> Vec<String> {
    let mut ticks = tokio::time::interval(Duration::from_millis(1000 / per_second));
    let mut job_ids = Vec::new();
    for i in 0..count {
        ticks.tick().await;
        let job_id = format!("{prefix}-{i}");
        assert_eq!(server.deliver(&body(&job_id, event_type)).await.status, 200);
        job_ids.push(job_id);
    }
    job_ids
}

on_both_ledgers! {
    /// Completed events go to one service, failed ones to another, both to an archive first
    /// (`continue`); an event no route takes is dead with an error naming its type.
    #[tokio::test(flavor = "multi_thread")]
    async fn events_reach_their_routes_downstreams_and_fan_out() {
        let (completed, failed, archive) =
            (Downstream::start().await, Downstream::start().await, Downstream::start().await);
        let config = [
            route("archive", r#"["job.completed", "job.failed"]"#, &archive.url(), "continue = true"),
            route("failed", r#"["job.failed"]"#, &failed.url(), ""),
            route("completed", r#"["job.*"]"#, &completed.url(), "fields = { queue = \"main\" }"),
        ]
        .concat();
        let server = TestServer::start(&config).await;
        for (job_id, event_type) in [("c1", "job.completed"), ("f1", "job.failed"), ("x1", "job.odd"), ("y1", "other")] {
            assert_eq!(server.deliver(&body(job_id, event_type)).await.status, 200);
        }
        // A duplicate writes no work and runs nothing.
        assert_eq!(server.deliver(&body("f1", "job.failed")).await.status, 200);
        assert!(
            eventually(Duration::from_secs(10), || {
                ["c1", "f1", "x1"].iter().all(|j| server.state_of(j).as_deref() == Some("done"))
            })
            .await,
            "c1 {:?}, f1 {:?}, x1 {:?}",
            server.state_of("c1"),
            server.state_of("f1"),
            server.state_of("x1")
        );
        assert_eq!(work_of(&server, "c1"), [done("archive"), done("completed")]);
        assert_eq!(work_of(&server, "f1"), [done("archive"), done("failed")]);
        // job.odd is no archive's nor failed's, and `job.*` takes it.
        assert_eq!(work_of(&server, "x1"), [done("completed")]);
        assert_eq!((archive.runs("c1"), archive.runs("f1"), archive.runs("x1")), (1, 1, 0));
        assert_eq!((completed.runs("c1"), completed.runs("x1"), completed.runs("f1")), (1, 1, 0));
        assert_eq!((failed.runs("f1"), failed.runs("c1")), (1, 0));
        // No route takes "other": dead at once, with why, and no work.
        assert_eq!(server.state_of("y1").as_deref(), Some("dead"));
        assert!(work_of(&server, "y1").is_empty());
        let error = server.value("SELECT last_error FROM jobs WHERE job_id = 'y1'", &[]);
        assert_eq!(error.as_str(), Some("no route takes event type \"other\""));
        // Tests in this binary share the process's metrics: a lower bound.
        let metrics = server.metrics().await;
        let archived: f64 = metrics
            .lines()
            .find_map(|line| line.strip_prefix(r#"sume_attempts_total{result="done",route="archive"} "#))
            .map_or(0.0, |value| value.parse().unwrap());
        assert!(archived >= 2.0, "{metrics}");
        server.stop().await.0.unwrap();
    }

    /// Route A's downstream is down for a while (SUME_TEST_OUTAGE_SECS, 6 s unless set): A's
    /// route holds and its jobs wait, while route B's jobs keep arriving and finish at the pace
    /// they had without the outage (claim-to-done p90 within 2x, or 100 ms at the least). When
    /// A comes back every job is done once on each, none dead. Not the p99: of B's 60 jobs that
    /// is the slowest one, which one stall of a loaded machine made 150 ms (3 runs of about
    /// 30); a route held up by A's would slow most of its jobs.
    #[tokio::test(flavor = "multi_thread")]
    async fn one_downstreams_outage_holds_its_route_alone() {
        let outage = std::env::var("SUME_TEST_OUTAGE_SECS")
            .ok()
            .and_then(|secs| secs.parse().ok())
            .unwrap_or(6u64);
        let (a, b) = (Downstream::start().await, Downstream::start().await);
        let config = [
            route("a", r#"["job.completed"]"#, &a.url(), ""),
            route("b", r#"["job.failed"]"#, &b.url(), ""),
        ]
        .concat();
        let server = TestServer::start(&config).await;
        let per_second = 20;
        let before = deliver_at(&server, "b-before", "job.failed", 40, per_second).await;
        assert!(eventually(Duration::from_secs(10), || b.jobs() == before.len()).await);

        a.stop();
        let count = usize::try_from(outage * per_second / 2).unwrap();
        let (during_a, during_b) = tokio::join!(
            deliver_at(&server, "a-during", "job.completed", count, per_second / 2),
            deliver_at(&server, "b-during", "job.failed", count, per_second / 2),
        );
        assert!(
            eventually(Duration::from_secs(10), || b.jobs() == before.len() + count).await,
            "B's jobs finish while A is down"
        );
        let held = server.value("SELECT count(*) FROM route_holds WHERE route = 'a'", &[]);
        assert_eq!(held.as_i64(), Some(1), "A's route is held");
        assert_eq!(server.value("SELECT count(*) FROM route_holds WHERE route = 'b'", &[]).as_i64(), Some(0));
        let readyz = json(&server.request(hyper::Method::GET, "/readyz", &[], "").await.unwrap());
        assert_eq!(readyz["routes"]["a"]["dispatch"], "held", "{readyz}");
        assert_eq!(readyz["routes"]["b"]["dispatch"], "running", "{readyz}");
        assert_eq!(readyz["dispatch"], "running", "{readyz}");

        a.restart().await;
        assert!(
            eventually(Duration::from_secs(20), || a.jobs() == count).await,
            "A's jobs run once it is back: {} of {count}",
            a.jobs()
        );
        assert!(
            eventually(Duration::from_secs(5), || {
                server.value("SELECT count(*) FROM jobs WHERE state <> 'done'", &[]).as_i64() == Some(0)
            })
            .await
        );
        for job_id in &during_a {
            assert_eq!(a.runs(job_id), 1, "{job_id}");
        }
        for job_id in before.iter().chain(&during_b) {
            assert_eq!(b.runs(job_id), 1, "{job_id}");
        }
        let (base, during) = (p90(claim_to_done(&server, &before)), p90(claim_to_done(&server, &during_b)));
        eprintln!("B's claim-to-done p90: {base:?} without the outage, {during:?} during A's {outage} s outage");
        assert!(
            during <= 2 * base.max(Duration::from_millis(50)),
            "B's p90 went from {base:?} to {during:?} during A's outage"
        );
        server.stop().await.0.unwrap();
    }
}

/// The real binary killed with SIGKILL while a fan-out job's second route runs (its first is
/// done) and started again: the interrupted route runs again and finishes, the finished one
/// does not run again; each route's work is done once.
#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_job_killed_between_its_routes_finishes_each_route_once() {
    use common::service::{signed_delivery, write_config, Service};
    if Backend::current() != Backend::Sqlite {
        return skip(
            "a_fan_out_job_killed_between_its_routes_finishes_each_route_once",
            "reads the SQLite file",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let (quick, started, slow, restarted, pid) = (
        at("quick.log"),
        at("slow.started"),
        at("slow.log"),
        at("restarted"),
        at("slow.pid"),
    );
    // Before the kill the slow route's handler waits; after it, it finishes at once.
    let slow_script = format!(
        "if [ -e {restarted} ]; then echo done >> {slow}; \
         else echo $$ > {pid}; echo started >> {started}; sleep 60; echo done >> {slow}; fi"
    );
    let extra = format!(
        "[[route]]\nname = \"quick\"\nevent_types = [\"*\"]\ncontinue = true\n\
         [route.handler]\ncommand = [\"sh\", \"-c\", \"echo $SUME_JOB_ID >> {quick}\"]\n\
         [[route]]\nname = \"slow\"\nevent_types = [\"*\"]\n\
         [route.handler]\ncommand = [\"sh\", \"-c\", \"{slow_script}\"]\ntimeout = \"2m\"\n"
    );
    let port = free_port();
    let config = write_config(dir.path(), port, "", &extra);
    let service = Service::start(&config, port).await;
    let client = sume_receiver::http_client::new_client();
    let request = signed_delivery(port, SECRET, &job_body("fan-out-1"));
    let answer = sume_receiver::http_client::send(&client, request, Duration::from_secs(10), 4096)
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    let lines = |path: &str| std::fs::read_to_string(path).map_or(0, |text| text.lines().count());
    assert!(
        eventually(Duration::from_secs(10), || lines(&quick) == 1
            && lines(&started) == 1)
        .await,
        "quick ran {} times, slow started {} times",
        lines(&quick),
        lines(&started)
    );
    service.kill_9();
    // The killed receiver's handler would finish later on its own: it goes with it.
    let orphan: i32 = std::fs::read_to_string(&pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: a signal to a process group this test's handler made has no memory-safety
    // preconditions.
    unsafe { libc::kill(-orphan, libc::SIGKILL) };
    std::fs::write(&restarted, "").unwrap();

    let service = Service::start(&config, port).await;
    let ledger = dir.path().join("ledger.sqlite3");
    let work = || -> Vec<(String, String)> {
        let db = rusqlite::Connection::open(&ledger).unwrap();
        let mut statement = db
            .prepare(
                "SELECT route, state FROM job_routes_readable WHERE job_id = 'fan-out-1' \
                 ORDER BY route",
            )
            .unwrap();
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let done = [
        ("quick".to_owned(), "done".to_owned()),
        ("slow".to_owned(), "done".to_owned()),
    ];
    assert!(
        eventually(Duration::from_secs(10), || work() == done).await,
        "{:?}",
        work()
    );
    assert_eq!(
        (lines(&quick), lines(&slow)),
        (1, 1),
        "each route's work done once"
    );
    service.stop_cleanly().await;
}

/// `systemctl reload` (SIGHUP) changes the routes without a restart: a route whose URL changed
/// sends its next jobs to the new downstream, a new route takes its events, a route taken out
/// keeps its waiting work in the ledger unrun until it comes back, and a broken file changes
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_changes_the_routes_and_keeps_a_removed_routes_work() {
    use common::service::{cli, signed_delivery, write_config, Service};
    if Backend::current() != Backend::Sqlite {
        return skip(
            "a_reload_changes_the_routes_and_keeps_a_removed_routes_work",
            "reads the SQLite file",
        );
    }
    let (first, failed, second, canceled) = (
        Downstream::start().await,
        Downstream::start().await,
        Downstream::start().await,
        Downstream::start().await,
    );
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let completed_to = |url: &str| route("completed", r#"["job.completed"]"#, url, "");
    let failed_route = route("failed", r#"["job.failed"]"#, &failed.url(), "");
    let config = write_config(
        dir.path(),
        port,
        "",
        &[completed_to(&first.url()), failed_route.clone()].concat(),
    );
    let service = Service::start(&config, port).await;
    let client = sume_receiver::http_client::new_client();
    let deliver = |job_id: &str, event_type: &str| {
        let request = signed_delivery(port, SECRET, &body(job_id, event_type));
        let client = client.clone();
        async move {
            let answer =
                sume_receiver::http_client::send(&client, request, Duration::from_secs(10), 4096)
                    .await
                    .unwrap();
            assert_eq!(answer.status, 200);
        }
    };
    let log = dir.path().join("service.log");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let reload = |count: usize| {
        // SAFETY: a signal to our own child has no memory-safety preconditions.
        unsafe { libc::kill(service.child.id() as i32, libc::SIGHUP) };
        let log_text = &log_text;
        async move {
            let said = eventually(Duration::from_secs(10), || {
                log_text().matches("SIGHUP: ").count() >= count
            })
            .await;
            assert!(said, "{}", log_text());
        }
    };
    let ledger = dir.path().join("ledger.sqlite3");
    let work = |job_id: &str| -> Vec<(String, String)> {
        let db = rusqlite::Connection::open(&ledger).unwrap();
        let mut statement = db
            .prepare(
                "SELECT route, state FROM job_routes_readable WHERE job_id = ?1 ORDER BY route",
            )
            .unwrap();
        statement
            .query_map([job_id], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let on = |route: &str, state: &str| vec![(route.to_owned(), state.to_owned())];

    deliver("c1", "job.completed").await;
    deliver("f1", "job.failed").await;
    assert!(
        eventually(Duration::from_secs(10), || first.runs("c1") == 1
            && failed.runs("f1") == 1)
        .await
    );
    // f2's work waits on its paused route when the route is taken out.
    let paused = cli(&config, &["jobs", "pause", "--route", "failed"]);
    assert!(paused.status.success(), "{paused:?}");
    // Another process's pause is seen within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    deliver("f2", "job.failed").await;
    assert_eq!(work("f2"), on("failed", "claimed"));

    // completed's URL changed, failed taken out, canceled new; unmatched events are dead.
    let canceled_route = route("canceled", r#"["job.canceled"]"#, &canceled.url(), "");
    let reloaded = [completed_to(&second.url()), canceled_route.clone()].concat();
    let reloaded = format!("{reloaded}[routing]\nunmatched = \"dead\"\n");
    write_config(dir.path(), port, "", &reloaded);
    reload(1).await;
    let said = log_text();
    assert!(
        said.contains("started=canceled")
            && said.contains("replaced=completed")
            && said.contains("stopped=failed"),
        "{said}"
    );
    let resumed = cli(&config, &["jobs", "resume", "--route", "failed"]);
    assert!(resumed.status.success(), "{resumed:?}");
    deliver("c2", "job.completed").await;
    deliver("k1", "job.canceled").await;
    assert!(
        eventually(Duration::from_secs(10), || second.runs("c2") == 1
            && canceled.runs("k1") == 1)
        .await,
        "c2 {:?}, k1 {:?}",
        work("c2"),
        work("k1")
    );
    assert_eq!(
        first.runs("c2"),
        0,
        "the old URL got a job after the reload"
    );
    // The removed route's work is kept, not run, not dead; the log and /readyz say so.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(work("f2"), on("failed", "claimed"));
    assert_eq!(failed.runs("f2"), 0);
    assert!(
        log_text().contains("work waits for a route not in the config"),
        "{}",
        log_text()
    );
    let readyz = hyper::Request::get(format!("http://127.0.0.1:{port}/readyz"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let readyz = sume_receiver::http_client::send(&client, readyz, Duration::from_secs(10), 65536)
        .await
        .unwrap();
    let readyz: serde_json::Value = serde_json::from_slice(&readyz.body).unwrap();
    assert_eq!(readyz["not_in_config"]["failed"]["waiting"], 1, "{readyz}");
    assert_eq!(readyz["routes"].as_object().unwrap().len(), 2, "{readyz}");
    // `check-config` reads it in the ledger, a warning that fails nothing.
    let check = cli(&config, &["check-config"]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && said.contains("keeps 1 job(s)' work for route failed,"),
        "{said}"
    );

    // A broken file: the routes in force stay.
    std::fs::write(&config, "[[route]]\nname = \"completed\"\n").unwrap();
    reload(2).await;
    assert!(
        log_text().contains("SIGHUP: reload failed"),
        "{}",
        log_text()
    );
    deliver("c3", "job.completed").await;
    assert!(eventually(Duration::from_secs(10), || second.runs("c3") == 1).await);

    // The route comes back: its kept work runs, once.
    let back = [completed_to(&second.url()), canceled_route, failed_route].concat();
    write_config(dir.path(), port, "", &back);
    reload(3).await;
    assert!(
        eventually(Duration::from_secs(10), || work("f2")
            == on("failed", "done"))
        .await,
        "{:?}",
        work("f2")
    );
    assert_eq!((failed.runs("f2"), first.jobs(), failed.jobs()), (1, 1, 2));
    service.stop_cleanly().await;
}
