//! Running the work: handlers, retries, dead letter, timeouts, the sweeper.

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sume_receiver::config::{HandlerConfig, HandlerKind, LedgerConfig};
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, NewClaim, Source};
use sume_receiver::sweeper::{SweepReport, Sweeper};
use sume_receiver::worker::{Queue, Worker};

/// A `[handler]` section running `script` with sh, with fast retries for tests.
fn command_handler(script: &str, extra: &str) -> String {
    format!(
        "[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nbackoff = \"50ms\"\nmax_backoff = \"200ms\"\n{extra}\n"
    )
}

async fn wait_for_state(server: &TestServer, job_id: &str, state: &str) {
    let reached = eventually(Duration::from_secs(20), || {
        server.state_of(job_id).as_deref() == Some(state)
    })
    .await;
    assert!(
        reached,
        "{job_id} never reached {state}; it is {:?}",
        server.state_of(job_id)
    );
}

fn attempts_and_error(server: &TestServer, job_id: &str) -> (i64, Option<String>) {
    let row = &server.rows(
        "SELECT attempts, last_error FROM jobs WHERE job_id = ?1",
        &[job_id],
    )[0];
    (row[0].as_i64().unwrap(), row[1].as_str().map(str::to_owned))
}

/// A local HTTP handler: fails the first request, then accepts; records what it received.
async fn start_http_handler() -> (String, Arc<Mutex<Vec<(String, String, String)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let recorded = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = recorded.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let header = |name: &str| {
                            request
                                .headers()
                                .get(name)
                                .map(|v| v.to_str().unwrap().to_owned())
                                .unwrap_or_default()
                        };
                        let entry = (
                            header("x-sume-job-id"),
                            header("x-sume-attempt"),
                            header("content-type"),
                        );
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        assert!(body.starts_with(b"{\"job_id\""));
                        let mut seen = seen.lock().unwrap();
                        seen.push(entry);
                        let status = if seen.len() == 1 { 500 } else { 204 };
                        let mut response =
                            Response::new(Full::new(Bytes::from_static(b"try later")));
                        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}/jobs"), seen)
}

/// Claimed jobs in a stopped ledger, as a backlog left by a previous run (or by claims made
/// while the in-memory queue was full).
async fn claimed_backlog(dir: &std::path::Path, job_ids: impl Iterator<Item = String>) {
    let (config, ledger) = open_ledger(dir).await;
    ledger.close().await;
    insert_jobs(
        &config,
        job_ids.map(|job_id| {
            let body = job_body(&job_id);
            (job_id, "claimed", body, None)
        }),
    );
}

/// Regression: a job the ledger would not let start (changes failing, reads fine) was taken again
/// at once, as fast as the ledger answered: a loop against a broken ledger, a warning each time.
/// Now the slot waits a second before the job is tried again.
#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_that_refuses_starts_is_not_hammered() {
    let server = TestServer::start(&command_handler(
        "exit 1",
        "max_attempts = 3\nconcurrency = 1\n[database]\nbusy_timeout = \"10ms\"",
    ))
    .await;
    server.deliver(&job_body("job-stuck")).await;
    wait_for_state(&server, "job-stuck", "retrying").await;
    let failed_commits = || async {
        let scrape = server
            .request(hyper::Method::GET, "/metrics", &[], "")
            .await
            .unwrap();
        let text = String::from_utf8(scrape.body.to_vec()).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix("sume_ledger_commits_total{result=\"failed\"} "))
            .map_or(0.0, |value| value.parse::<f64>().unwrap())
    };
    let before = failed_commits().await;
    let blocker = server.db();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    blocker.execute_batch("COMMIT").unwrap();
    let failed = failed_commits().await - before;
    assert!(
        (1.0..=4.0).contains(&failed),
        "{failed} failed starts in 2 s with the ledger locked (one a second expected)"
    );
    wait_for_state(&server, "job-stuck", "dead").await;
}

/// Regression: an attempt whose end the ledger refused (a failover: the old primary read-only,
/// the new one not there yet) left its job `running` until the lease ran out, and the job ran
/// again. Now the end is recorded again every second until the ledger takes it.
#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_end_the_ledger_refused_is_recorded_once_it_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let script = format!("echo run >> {}; sleep 0.5", runs.display());
    let server = TestServer::start_in(
        dir,
        &command_handler(
            &script,
            "concurrency = 1\ntimeout = \"1m\"\n[database]\nbusy_timeout = \"10ms\"",
        ),
    )
    .await;
    server.deliver(&job_body("job-end-refused")).await;
    wait_for_state(&server, "job-end-refused", "running").await;
    // Locked while the handler runs and ends, and a while after.
    let blocker = server.db();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    blocker.execute_batch("COMMIT").unwrap();
    // Well before the lease (1 minute and the sweeper's slack) could run out.
    wait_for_state(&server, "job-end-refused", "done").await;
    assert_eq!(attempts_and_error(&server, "job-end-refused"), (1, None));
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n", "ran once");
}

/// A worker (two attempts a job) and its sweeper on `ledger`, neither running.
fn sweeper_of(ledger: &Arc<ledger::Ledger>) -> (Worker, Queue, Sweeper) {
    let handler = HandlerConfig {
        kind: HandlerKind::Command(vec!["true".into()]),
        ca_file: None,
        timeout: Duration::from_secs(1),
        concurrency: 1,
        max_attempts: 2,
        backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(1),
        hold: Default::default(),
    };
    let route = sume_receiver::route_name::RouteName::default_route();
    let (worker, queue) = Worker::new(
        route.clone(),
        ledger.clone(),
        handler,
        Duration::from_secs(1),
    )
    .unwrap();
    let queues = sume_receiver::worker::Queues::new(Arc::default(), vec![(route, queue.clone())]);
    let sweeper = Sweeper::new(ledger.clone(), queues, Arc::new(|_: &str| 2));
    (worker, queue, sweeper)
}

on_both_ledgers! {
#[tokio::test(flavor = "multi_thread")]
async fn handler_gets_body_and_environment_and_job_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let script = format!(
        "cat > {out}.body; echo \"$SUME_JOB_ID|$SUME_EVENT_TYPE|$SUME_ATTEMPT|$SUME_DELIVERY_SOURCE\" > {out}.env",
        out = out.display()
    );
    let server = TestServer::start_in(dir, &command_handler(&script, "")).await;
    let body = job_body("job-env");
    assert_eq!(server.deliver(&body).await.status, 200);
    wait_for_state(&server, "job-env", "done").await;
    assert_eq!(
        std::fs::read_to_string(out.with_extension("body")).unwrap(),
        body
    );
    assert_eq!(
        std::fs::read_to_string(out.with_extension("env"))
            .unwrap()
            .trim(),
        "job-env|job.completed|1|webhook"
    );
    let finished = server.value("SELECT finished_at FROM jobs WHERE job_id = 'job-env'", &[]);
    assert!(finished.is_i64(), "{finished}");
}

/// `jobs retry` runs in a process of its own, which the worker learns of only from the ledger:
/// an idle worker picks the job up (where the ledger sees other processes' writes, it sleeps
/// until it does instead of looking every second).
#[tokio::test(flavor = "multi_thread")]
async fn a_jobs_retry_from_the_command_line_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let script = format!("echo \"$SUME_JOB_ID\" >> {}", out.display());
    let server = TestServer::start_in(dir, &command_handler(&script, "")).await;
    server.deliver(&job_body("job-again")).await;
    wait_for_state(&server, "job-again", "done").await;

    let cli = ledger::Ledger::open_existing(&server.config.database)
        .await
        .unwrap();
    cli.retry_job(&JobId::parse("job-again").unwrap(), None, &ledger::Actor::new("cli:test"), ledger::now_ms())
        .await
        .unwrap();
    cli.close().await;
    let ran_twice = eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(&out).is_ok_and(|runs| runs.lines().count() == 2)
    })
    .await;
    assert!(ran_twice, "the retried job did not run again");
    wait_for_state(&server, "job-again", "done").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn handler_failing_twice_then_succeeding_is_done_after_three_attempts() {
    let script =
        "if [ \"$SUME_ATTEMPT\" -lt 3 ]; then echo \"flaky $SUME_ATTEMPT\" >&2; exit 1; fi";
    let server = TestServer::start(&command_handler(script, "")).await;
    server.deliver(&job_body("job-flaky")).await;
    wait_for_state(&server, "job-flaky", "done").await;
    let (attempts, error) = attempts_and_error(&server, "job-flaky");
    assert_eq!(attempts, 3);
    assert!(
        error.unwrap().contains("flaky 2"),
        "the last failure is kept"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn handler_always_failing_is_dead_after_max_attempts() {
    let script = "echo 'boom: cannot reach the warehouse' >&2; exit 3";
    let server = TestServer::start(&command_handler(script, "max_attempts = 3")).await;
    server.deliver(&job_body("job-doomed")).await;
    wait_for_state(&server, "job-doomed", "dead").await;
    let (attempts, error) = attempts_and_error(&server, "job-doomed");
    assert_eq!(attempts, 3);
    let error = error.unwrap();
    assert!(
        error.contains("exited with status 3") && error.contains("boom: cannot reach"),
        "{error}"
    );
    // It stays dead: no fourth attempt.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(attempts_and_error(&server, "job-doomed").0, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_handler_is_killed_with_its_process_group_at_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("grandchild.pid");
    // The grandchild would outlive a kill of `sh` alone.
    let script = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
    let handler = command_handler(&script, "timeout = \"300ms\"\nmax_attempts = 1");
    let server = TestServer::start_in(dir, &handler).await;
    server.deliver(&job_body("job-hang")).await;
    wait_for_state(&server, "job-hang", "dead").await;
    let (attempts, error) = attempts_and_error(&server, "job-hang");
    assert_eq!(attempts, 1);
    assert!(error.unwrap().contains("timed out after 300ms"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = eventually(Duration::from_secs(5), || {
        // SAFETY: signal 0 only checks whether the process exists.
        let exists = unsafe { libc::kill(pid, 0) == 0 };
        !exists
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
    })
    .await;
    assert!(gone, "the handler's grandchild {pid} survived the timeout");
}

#[tokio::test(flavor = "multi_thread")]
async fn http_handler_retries_a_5xx_then_is_done() {
    let (url, seen) = start_http_handler().await;
    let handler = format!("[handler]\nurl = \"{url}\"\nbackoff = \"50ms\"\n");
    let server = TestServer::start(&handler).await;
    server.deliver(&job_body("job-http")).await;
    wait_for_state(&server, "job-http", "done").await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("job-http".into(), "1".into(), "application/json".into()),
            ("job-http".into(), "2".into(), "application/json".into())
        ]
    );
    let (attempts, error) = attempts_and_error(&server, "job-http");
    assert_eq!(attempts, 2);
    assert!(error.unwrap().contains("500"));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_handler_jobs_stay_claimed() {
    let server = TestServer::start("").await;
    server.deliver(&job_body("job-external")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.state_of("job-external").as_deref(), Some("claimed"));
}

/// The sweeper on its own: a ledger, a worker queue, and rows put there by hand.
#[tokio::test(flavor = "multi_thread")]
async fn sweep_once_takes_back_expired_leases() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    let (_worker, queue, sweeper) = sweeper_of(&ledger);
    for job_id in [
        "lost-claim",
        "expired-lease",
        "last-lease",
        "live-lease",
        "future-retry",
    ] {
        let claim = NewClaim {
            job_id: JobId::parse(job_id).unwrap(),
            event_type: None,
            body: job_body(job_id).into(),
            source: Source::Webhook,
            trace_context: None,
            routing: sume_receiver::ledger::Routing::default_route(),
        };
        ledger.claim(claim).await.unwrap();
    }
    let now = ledger::now_ms();
    let (expired, live) = (now - 1000, now + 60_000);
    for (job_id, state, attempts, column, at) in [
        ("expired-lease", "running", 1, "lease_expires_at", expired),
        ("last-lease", "running", 2, "lease_expires_at", expired),
        ("live-lease", "running", 1, "lease_expires_at", live),
        ("future-retry", "retrying", 1, "next_attempt_at", live),
    ] {
        ledger_execute(
            &config,
            &format!(
                "UPDATE job_routes SET state = '{state}', attempts = {attempts}, {column} = {at} \
                 WHERE {}",
                work_of_job(&config, "?1")
            ),
            &[job_id],
        );
    }

    let report = sweeper.sweep_once().await.unwrap();
    assert_eq!(report, SweepReport { leases_expired: 2 });
    assert!(
        !queue.holds("lost-claim") && !queue.holds("expired-lease"),
        "due jobs are the worker's to take from the ledger"
    );
    let state = |job_id: &str| {
        ledger_rows(&config, "SELECT state FROM jobs WHERE job_id = ?1", &[job_id])[0][0]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(state("expired-lease"), "retrying");
    assert_eq!(
        state("last-lease"),
        "dead",
        "its lease expired on its last attempt"
    );
    assert_eq!(state("live-lease"), "running");

    // Nothing left to take back.
    assert_eq!(
        sweeper.sweep_once().await.unwrap(),
        SweepReport { leases_expired: 0 }
    );

    // At start, on a ledger of its own, every running row is taken back at once, live lease
    // or not. On a shared ledger a live lease may be another receiver's: it stays.
    let recovered = sweeper.recover().await.unwrap();
    if Backend::current() == Backend::Sqlite {
        assert_eq!(recovered.leases_expired, 1);
        assert_eq!(state("live-lease"), "retrying");
    } else {
        assert_eq!(recovered.leases_expired, 0);
        assert_eq!(state("live-lease"), "running");
        // The same lease under this receiver's own name: its attempt was cut short by the
        // stop, so the restart takes it back at once.
        let LedgerConfig::Postgres(postgres) = &config.database else {
            panic!("a test of the PostgreSQL ledger");
        };
        ledger_execute(
            &config,
            "UPDATE job_routes SET leased_by = ?1 WHERE job_id = 'live-lease'",
            &[&postgres.receiver],
        );
        assert_eq!(sweeper.recover().await.unwrap().leases_expired, 1);
        assert_eq!(state("live-lease"), "retrying");
    }
    ledger.close().await;
}

/// The sweeper's loop takes no lock on an idle ledger of its own: with nothing queued or running
/// here, no lease can expire (a row left `running` by hand is not this process's, and the next
/// start's recovery takes it back). Once something runs here, it sweeps; on a shared ledger
/// (PostgreSQL) it always does: a lease may be another receiver's.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_skips_an_idle_ledger_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    let (_worker, queue, sweeper) = sweeper_of(&ledger);
    let job_id = JobId::parse("left-running").unwrap();
    let claim = NewClaim {
        job_id: job_id.clone(),
        event_type: None,
        body: job_body("left-running").into(),
        source: Source::Webhook,
        trace_context: None,
        routing: sume_receiver::ledger::Routing::default_route(),
    };
    ledger.claim(claim).await.unwrap();
    ledger_execute(
        &config,
        &format!(
            "UPDATE job_routes SET state = 'running', attempts = 1, lease_expires_at = {} WHERE {}",
            ledger::now_ms() - 1000,
            work_of_job(&config, "?1")
        ),
        &["left-running"],
    );
    let shared = Backend::current() == Backend::Postgres;
    let idle = sweeper.sweep_if_needed().await.unwrap();
    if shared {
        assert_eq!(idle, Some(SweepReport { leases_expired: 1 }));
    } else {
        assert_eq!(idle, None, "an idle ledger of its own was swept");
        // Something queued here: the sweep runs, and takes the expired lease back.
        assert!(queue.enqueue(&JobId::parse("queued-here").unwrap()));
        assert_eq!(
            sweeper.sweep_if_needed().await.unwrap(),
            Some(SweepReport { leases_expired: 1 })
        );
    }

    // A start whose outcome the ledger could not confirm (a failover) may have left its row
    // `running` under this receiver's name, its lease live for minutes, with no attempt here:
    // the next step takes it back at once.
    let claim = NewClaim {
        job_id: JobId::parse("started-unseen").unwrap(),
        event_type: None,
        body: job_body("started-unseen").into(),
        source: Source::Webhook,
        trace_context: None,
        routing: sume_receiver::ledger::Routing::default_route(),
    };
    ledger.claim(claim).await.unwrap();
    let running = format!(
        "UPDATE job_routes SET state = 'running', attempts = 1, lease_expires_at = {} WHERE {}",
        ledger::now_ms() + 600_000,
        work_of_job(&config, "?1")
    );
    ledger_execute(&config, &running, &["started-unseen"]);
    if let LedgerConfig::Postgres(postgres) = &config.database {
        ledger_execute(
            &config,
            "UPDATE job_routes SET leased_by = ?1 WHERE job_id = 'started-unseen'",
            &[&postgres.receiver],
        );
    }
    assert_eq!(
        sweeper.sweep_if_needed().await.unwrap().map(|r| r.leases_expired).unwrap_or(0),
        0,
        "a live lease is taken back only once an attempt was left behind"
    );
    queue.lease_left_behind();
    assert_eq!(
        sweeper.sweep_if_needed().await.unwrap(),
        Some(SweepReport { leases_expired: 1 })
    );
    let state = ledger_rows(
        &config,
        "SELECT state FROM jobs WHERE job_id = ?1",
        &["started-unseen"],
    );
    assert_eq!(state[0][0].as_str(), Some("retrying"));
    ledger.close().await;
}

/// Regression: a handler that handed its stdin to a background child and exited 0 was recorded
/// as timed out for bodies over 64 KiB (the pipe's size): the write of stdin decided the attempt.
#[tokio::test(flavor = "multi_thread")]
async fn a_handler_that_leaves_its_stdin_to_a_background_child_is_done() {
    let script = "sleep 4 <&0 & exit 0";
    let server = TestServer::start(&command_handler(
        script,
        "timeout = \"2s\"\nmax_attempts = 1",
    ))
    .await;
    let pad = "x".repeat(200 * 1024);
    let body = format!(r#"{{"job_id":"job-bg","pad":"{pad}"}}"#);
    assert_eq!(server.deliver(&body).await.status, 200);
    wait_for_state(&server, "job-bg", "done").await;
    assert_eq!(attempts_and_error(&server, "job-bg"), (1, None));
}

/// Regression: leases were judged by the wall clock alone, so a clock jumping forward (or a
/// lease set in the past, as here) made the sweeper take back a job this process was still
/// running, and the job ran twice. In-process, the handler timeout (monotonic) decides.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_job_is_not_taken_back_by_a_wall_clock_jump() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let script = format!("echo run >> {}; sleep 1", runs.display());
    let handler = command_handler(
        &script,
        "timeout = \"10s\"\n\n[sweeper]\ninterval = \"100ms\"",
    );
    let server = TestServer::start_in(dir, &handler).await;
    server.deliver(&job_body("job-clock")).await;
    wait_for_state(&server, "job-clock", "running").await;
    server.execute(
        &format!(
            "UPDATE job_routes SET lease_expires_at = 0 WHERE {}",
            work_of_job(&server.config, "'job-clock'")
        ),
        &[],
    );
    wait_for_state(&server, "job-clock", "done").await;
    assert_eq!(attempts_and_error(&server, "job-clock"), (1, None));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let runs = std::fs::read_to_string(server.dir.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "the handler ran once");
}

/// Regression: a backlog in the ledger was fed to the worker only by the sweeper, at most 1,000
/// jobs per `sweeper.interval` (here an hour): 500 of these 1,500 would have waited an hour.
#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_in_the_ledger_drains_without_waiting_for_sweeps() {
    let dir = tempfile::tempdir().unwrap();
    claimed_backlog(dir.path(), (0..1500).map(|i| format!("backlog-{i}"))).await;
    let server = TestServer::start_in(
        dir,
        &command_handler(
            "cat > /dev/null",
            "concurrency = 8\n[sweeper]\ninterval = \"1h\"",
        ),
    )
    .await;
    let done = || -> i64 {
        server
            .value("SELECT count(*) FROM jobs WHERE state = 'done'", &[])
            .as_i64()
            .unwrap()
    };
    let drained = eventually(Duration::from_secs(60), || done() == 1500).await;
    assert!(drained, "{} of 1500 done", done());
    server.stop().await.0.unwrap();
}

/// A stored job_id that cannot run (written before ids were checked) is given up as `dead`
/// with the reason, instead of coming back as due work at every look into the ledger.
#[tokio::test(flavor = "multi_thread")]
async fn a_stored_job_id_that_cannot_run_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    claimed_backlog(
        dir.path(),
        ["bad\nid".to_owned(), "good-id".to_owned()].into_iter(),
    )
    .await;
    let server = TestServer::start_in(dir, &command_handler("cat > /dev/null", "")).await;
    wait_for_state(&server, "good-id", "done").await;
    wait_for_state(&server, "bad\nid", "dead").await;
    let (attempts, error) = attempts_and_error(&server, "bad\nid");
    assert_eq!(attempts, 0);
    assert!(
        error.as_deref().unwrap_or("").contains("cannot run"),
        "{error:?}"
    );
    server.stop().await.0.unwrap();
}
}
