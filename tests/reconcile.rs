//! End to end against the Sume simulator: retries, refused webhooks recovered by polling,
//! Redeliver before and after retention, the admin listener, Sume API failures.

mod common;

use std::path::Path;
use std::time::Duration;

use common::sume::{MockSume, StatusAnswer, API_KEY};
use common::*;
use hyper::Method;

const ADMIN_TOKEN: &str = "admin-test-token";

/// Handler that records `job_id source` per run, fast Sume API settings, an admin listener.
fn receiver_config(dir: &Path, sume_base_url: &str, admin_port: u16, extra: &str) -> String {
    std::fs::write(dir.join("api_key"), API_KEY).unwrap();
    std::fs::write(dir.join("admin_token"), ADMIN_TOKEN).unwrap();
    let runs = dir.join("runs.log");
    let script = format!(
        "echo \"$SUME_JOB_ID $SUME_DELIVERY_SOURCE\" >> {}",
        runs.display()
    );
    format!(
        "[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\n\n\
         [sume_api]\nbase_url = \"{sume_base_url}\"\napi_key_file = \"api_key\"\n\
         reconcile_after = \"100ms\"\npoll_backoff = \"100ms\"\nmax_poll_backoff = \"400ms\"\n\
         max_requests_per_second = 50\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\n{extra}"
    )
}

fn runs(server: &TestServer) -> Vec<String> {
    std::fs::read_to_string(server.dir.path().join("runs.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A receiver wired to a fresh simulator; the simulator delivers to the receiver.
async fn start_pair(extra: &str, retry_delay: Duration) -> (TestServer, MockSume, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook_url = format!("http://{}{WEBHOOK_PATH}", listener.local_addr().unwrap());
    let sume = MockSume::start(&webhook_url, &[SECRET], retry_delay).await;
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = receiver_config(dir.path(), &sume.base_url(), admin_port, extra);
    let server = TestServer::start_with(dir, &config, listener).await;
    (server, sume, admin_port)
}

async fn expect_via_admin(
    server: &TestServer,
    admin_port: u16,
    job_id: &str,
    token: &str,
) -> (u16, serde_json::Value) {
    admin_put(server, admin_port, job_id, &format!("Bearer {token}")).await
}

/// PUT /v1/expected/{path_segment} with this Authorization header.
async fn admin_put(
    server: &TestServer,
    admin_port: u16,
    path_segment: &str,
    authorization: &str,
) -> (u16, serde_json::Value) {
    let url = format!("http://127.0.0.1:{admin_port}/v1/expected/{path_segment}");
    let answer = send_to(Method::PUT, &url, &[("authorization", authorization)]).await;
    let _ = server;
    (
        answer.status.as_u16(),
        serde_json::from_slice(&answer.body).unwrap_or_default(),
    )
}

fn expectation_state(server: &TestServer, job_id: &str) -> Option<String> {
    server
        .value(
            "SELECT state FROM expected_jobs WHERE job_id = ?1",
            &[job_id],
        )
        .as_str()
        .map(str::to_owned)
}

async fn wait_done(server: &TestServer, job_id: &str) {
    let done = eventually(Duration::from_secs(10), || {
        server.state_of(job_id).as_deref() == Some("done")
    })
    .await;
    assert!(done, "{job_id} is {:?}", server.state_of(job_id));
}

/// `sume-receiver jobs redeliver` with the server's config, pointed at the simulator.
fn redeliver_cli(server: &TestServer, sume: &MockSume, job_id: &str) -> std::process::Output {
    let config = server.dir.path().join("cli.toml");
    std::fs::write(
        &config,
        format!(
            "[signature]\nsecrets = [\"{SECRET}\"]\n[database]\npath = \"ledger.sqlite3\"\n\
             [sume_api]\nbase_url = \"{}\"\napi_key_file = \"api_key\"\n",
            sume.base_url()
        ),
    )
    .unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_sume-receiver"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "jobs",
            "redeliver",
            job_id,
        ])
        .output()
        .unwrap()
}

on_both_ledgers! {
#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_down_for_the_first_attempts_still_gets_the_job_once() {
    // Reserve the port, but start the receiver only after Sume's first attempts failed.
    let port = free_port();
    let webhook_url = format!("http://127.0.0.1:{port}{WEBHOOK_PATH}");
    let sume = MockSume::start(&webhook_url, &[SECRET], Duration::from_millis(150)).await;
    let body = job_body("job-late");
    let delivery = tokio::spawn({
        let sume = sume.clone();
        let body = body.clone();
        async move { sume.deliver(&body).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = receiver_config(dir.path(), &sume.base_url(), free_port(), "");
    let server = TestServer::start_with(dir, &config, listener).await;

    let run = delivery.await.unwrap();
    assert!(
        run.attempts > 1,
        "the first attempts found the receiver down: {run:?}"
    );
    assert_eq!(run.statuses.last(), Some(&200));
    assert!(
        run.statuses[..run.statuses.len() - 1]
            .iter()
            .all(|s| *s == 0),
        "{run:?}"
    );
    assert_eq!(run.accepted_body.unwrap()["duplicate"], false);
    wait_done(&server, "job-late").await;
    assert_eq!(runs(&server), ["job-late webhook"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_webhooks_are_recovered_by_polling_and_run_once() {
    let (server, sume, admin_port) = start_pair("", Duration::from_millis(20)).await;
    let job_id = "job-refused";
    let (status, answer) = expect_via_admin(&server, admin_port, job_id, ADMIN_TOKEN).await;
    assert_eq!((status, answer["registered"].as_bool()), (200, Some(true)));
    let (status, answer) = expect_via_admin(&server, admin_port, job_id, ADMIN_TOKEN).await;
    assert_eq!(
        (status, answer["registered"].as_bool()),
        (200, Some(false)),
        "registering is idempotent"
    );

    // Sume signs with a secret the receiver does not know (a botched rotation): all 10 refused.
    sume.set_secrets(&["whsec_rotated_but_not_configured"]);
    let run = sume.deliver(&job_body(job_id)).await;
    assert_eq!(run.statuses, vec![401; 10]);

    // Sume's status endpoint first says running, then completed.
    sume.set_answers(
        job_id,
        vec![
            StatusAnswer::status(job_id, "running"),
            StatusAnswer::status(job_id, "completed"),
        ],
    );
    wait_done(&server, job_id).await;
    assert_eq!(runs(&server), [format!("{job_id} poll")]);
    assert_eq!(
        expectation_state(&server, job_id).as_deref(),
        Some("recovered")
    );
    assert!(sume.status_calls(job_id).len() >= 2);
    let row = &server.rows("SELECT source, body FROM jobs WHERE job_id = ?1", &[job_id])[0];
    let (source, body) = (row[0].as_str().unwrap(), row[1].as_str().unwrap());
    assert_eq!(source, "poll");
    assert!(
        body.contains("\"status\":\"completed\""),
        "the status answer is the stored body: {body}"
    );

    // A webhook that arrives after all (secret fixed) is a duplicate and runs nothing.
    sume.set_secrets(&[SECRET]);
    let run = sume.deliver(&job_body(job_id)).await;
    assert_eq!(run.accepted_body.unwrap()["duplicate"], true);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(runs(&server).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_that_arrived_first_makes_the_poll_unnecessary() {
    let (server, sume, admin_port) = start_pair("", Duration::from_millis(20)).await;
    expect_via_admin(&server, admin_port, "job-on-time", ADMIN_TOKEN).await;
    // Rotation: Sume signs with the new and the old secret; the receiver knows the old one.
    sume.set_secrets(&["whsec_new_one", SECRET]);
    assert_eq!(sume.deliver(&job_body("job-on-time")).await.statuses, [200]);
    let resolved = eventually(Duration::from_secs(5), || {
        expectation_state(&server, "job-on-time").as_deref() == Some("arrived")
    })
    .await;
    assert!(resolved);
    assert!(
        sume.status_calls("job-on-time").is_empty(),
        "no poll was needed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_listener_wants_its_token() {
    let (server, _sume, admin_port) = start_pair("", Duration::from_millis(20)).await;
    let (status, _) = expect_via_admin(&server, admin_port, "job-x", "wrong-token").await;
    assert_eq!(status, 401);
    assert_eq!(expectation_state(&server, "job-x"), None);
}

/// Regression: `..`, `%00` and the like were registered, to be put in Sume URLs later.
#[tokio::test(flavor = "multi_thread")]
async fn the_admin_listener_takes_only_valid_job_ids() {
    let (server, _sume, admin_port) = start_pair("", Duration::from_millis(20)).await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    for (segment, reason) in [
        ("..", "`.` or `..`"),
        (".", "`.` or `..`"),
        ("%2E%2E", "`.` or `..`"),
        ("a%00b", "control character"),
        ("a%0Aforged", "control character"),
        ("%FF", "not UTF-8"),
    ] {
        let (status, answer) = admin_put(&server, admin_port, segment, &bearer).await;
        assert_eq!(status, 400, "{segment}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(reason),
            "{segment}: {answer}"
        );
    }
    let (status, _) = admin_put(&server, admin_port, "a/b", &bearer).await;
    assert_eq!(status, 404, "a raw '/' is another path, not an id");
    let count = server.value("SELECT count(*) FROM expected_jobs", &[]);
    assert_eq!(count, 0);

    // An encoded '/' is part of a valid id; the scheme is case-insensitive (RFC 9110).
    let (status, answer) = admin_put(
        &server,
        admin_port,
        "a%2Fb",
        &format!("bearer {ADMIN_TOKEN}"),
    )
    .await;
    assert_eq!((status, answer["job_id"].as_str()), (200, Some("a/b")));
    assert_eq!(
        expectation_state(&server, "a/b").as_deref(),
        Some("waiting")
    );
    let (status, _) = admin_put(&server, admin_port, "c", &format!("BEARER {ADMIN_TOKEN}")).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeliver_after_the_body_was_purged_is_still_a_duplicate() {
    let retention = "[retention]\nttl = \"1ms\"\ndedupe_ttl = \"1h\"\ninterval = \"50ms\"\n";
    let (server, sume, _) = start_pair(retention, Duration::from_millis(20)).await;
    let body = job_body("job-purged");
    sume.set_event("job-purged", &body);
    assert_eq!(sume.deliver(&body).await.statuses, [200]);
    wait_done(&server, "job-purged").await;
    let purged = eventually(Duration::from_secs(5), || {
        let purged = server.value("SELECT body IS NULL FROM jobs WHERE job_id = 'job-purged'", &[]);
        purged == true || purged == 1
    })
    .await;
    assert!(purged, "retention purged the body, keeping a tombstone");

    let output = redeliver_cli(&server, &sume, "job-purged");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(sume.redeliver_calls(), ["job-purged"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        runs(&server),
        ["job-purged webhook"],
        "the tombstone stopped a second run"
    );
    let text = server.metrics().await;
    assert!(
        text.contains("sume_deliveries_total{outcome=\"duplicate\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeliver_after_dedupe_ttl_is_a_new_job() {
    let retention = "[retention]\nttl = \"1ms\"\ndedupe_ttl = \"1ms\"\ninterval = \"50ms\"\n";
    let (server, sume, _) = start_pair(retention, Duration::from_millis(20)).await;
    let body = job_body("job-forgotten");
    sume.set_event("job-forgotten", &body);
    sume.deliver(&body).await;
    // Not the `done` state: retention may forget the row before a look sees it.
    assert!(eventually(Duration::from_secs(10), || runs(&server).len() == 1).await);
    assert!(
        eventually(Duration::from_secs(5), || server
            .state_of("job-forgotten")
            .is_none())
        .await
    );

    assert!(redeliver_cli(&server, &sume, "job-forgotten")
        .status
        .success());
    let ran_again = eventually(Duration::from_secs(5), || runs(&server).len() == 2).await;
    assert!(
        ran_again,
        "documented: past dedupe_ttl a job_id is forgotten and runs again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_api_key_pauses_polling_without_crashing() {
    let (server, sume, admin_port) = start_pair("", Duration::from_millis(20)).await;
    sume.set_accepted_key("some_other_key");
    sume.set_answers(
        "job-auth",
        vec![StatusAnswer::status("job-auth", "completed")],
    );
    expect_via_admin(&server, admin_port, "job-auth", ADMIN_TOKEN).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Backoff 100, 200, 400, 400 ms...: a handful of calls, not one per tick per job.
    let calls = sume.status_calls("job-auth").len();
    assert!((1..=8).contains(&calls), "{calls} calls");
    assert_eq!(server.get_status("/healthz").await, 200);
    // Regression: a refused key was counted as `answered`: nothing to alert on.
    let text = server.metrics().await;
    let refused = text
        .lines()
        .find_map(|line| line.strip_prefix(r#"sume_reconcile_polls_total{result="refused"} "#))
        .and_then(|value| value.parse::<f64>().ok());
    assert!(refused.is_some_and(|n| n >= 1.0), "{text}");
    // Once the key is accepted again, polling resumes and recovers the job.
    sume.set_accepted_key(API_KEY);
    wait_done(&server, "job-auth").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_from_sume_is_honoured() {
    let (server, sume, admin_port) = start_pair("", Duration::from_millis(20)).await;
    sume.set_answers(
        "job-429",
        vec![
            StatusAnswer::error(429, Some(1)),
            StatusAnswer::status("job-429", "completed"),
        ],
    );
    expect_via_admin(&server, admin_port, "job-429", ADMIN_TOKEN).await;
    wait_done(&server, "job-429").await;
    let calls = sume.status_calls("job-429");
    assert_eq!(calls.len(), 2);
    let gap = calls[1] - calls[0];
    assert!(
        gap >= Duration::from_millis(950),
        "polled again after {gap:?}, before Retry-After"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn polls_respect_the_global_rate_limit() {
    let (server, sume, admin_port) = start_pair("", Duration::from_millis(20)).await;
    // 30 jobs due at once that never finish; at most 50 calls a second in all.
    for i in 0..30 {
        let job_id = format!("job-slow-{i}");
        sume.set_answers(&job_id, vec![StatusAnswer::status(&job_id, "running")]);
        expect_via_admin(&server, admin_port, &job_id, ADMIN_TOKEN).await;
    }
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let mut calls = sume.all_status_calls();
    calls.sort();
    assert!(calls.len() >= 20, "{} calls", calls.len());
    // 50 a second: any 11 consecutive calls span at least 10 intervals of 20 ms (less jitter).
    for window in calls.windows(11) {
        let span = window[10] - window[0];
        assert!(
            span >= Duration::from_millis(180),
            "11 calls within {span:?}"
        );
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expected_job_is_given_up_after_give_up_after() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook_url = format!("http://{}{WEBHOOK_PATH}", listener.local_addr().unwrap());
    let sume = MockSume::start(&webhook_url, &[SECRET], Duration::from_millis(20)).await;
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = receiver_config(dir.path(), &sume.base_url(), admin_port, "").replace(
        "max_requests_per_second = 50",
        "max_requests_per_second = 50\ngive_up_after = \"600ms\"",
    );
    let server = TestServer::start_with(dir, &config, listener).await;
    sume.set_answers(
        "job-never",
        vec![StatusAnswer::status("job-never", "running")],
    );
    expect_via_admin(&server, admin_port, "job-never", ADMIN_TOKEN).await;
    let given_up = eventually(Duration::from_secs(5), || {
        expectation_state(&server, "job-never").as_deref() == Some("given_up")
    })
    .await;
    assert!(given_up);
    assert_eq!(server.state_of("job-never"), None);
}
}
