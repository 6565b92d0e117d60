//! The operator's tools on a running service: pausing dispatch, actions and job histories on
//! the admin listener, the ring of refused deliveries.

mod common;

use std::time::Duration;

use common::*;
use hyper::Method;

const ADMIN_TOKEN: &str = "operator-test-token";

/// A handler that logs `job_id attempt` to `runs.log` in `dir` and exits `exit_status`; one
/// attempt; an admin listener on `admin_port`.
fn operator_config(dir: &std::path::Path, admin_port: u16, exit_status: u8) -> String {
    std::fs::write(dir.join("admin_token"), ADMIN_TOKEN).unwrap();
    let runs = dir.join("runs.log");
    let script = format!(
        "echo \"$SUME_JOB_ID $SUME_ATTEMPT\" >> {}; echo 'upstream down' >&2; exit {exit_status}",
        runs.display()
    );
    format!(
        "[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nmax_attempts = 1\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n"
    )
}

fn runs(server: &TestServer) -> usize {
    std::fs::read_to_string(server.dir.path().join("runs.log"))
        .unwrap_or_default()
        .lines()
        .count()
}

async fn admin(method: Method, admin_port: u16, path: &str) -> (u16, serde_json::Value) {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://127.0.0.1:{admin_port}{path}");
    let answer = send_to(method, &url, &[("authorization", &bearer)]).await;
    (answer.status.as_u16(), json(&answer))
}

async fn wait_for_state(server: &TestServer, job_id: &str, state: &str) {
    let reached = eventually(Duration::from_secs(10), || {
        server.state_of(job_id).as_deref() == Some(state)
    })
    .await;
    assert!(
        reached,
        "{job_id} is {:?}, not {state}",
        server.state_of(job_id)
    );
}

on_both_ledgers! {
    /// Paused, the service still answers and claims deliveries, and runs nothing; `/readyz`
    /// and `/metrics` say so. Resumed, the waiting jobs run.
    #[tokio::test(flavor = "multi_thread")]
    async fn paused_dispatch_claims_and_runs_nothing_until_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let admin_port = free_port();
        let config = operator_config(dir.path(), admin_port, 0);
        let server = TestServer::start_in(dir, &config).await;
        let (status, answer) = admin(Method::POST, admin_port, "/v1/dispatch/pause").await;
        assert_eq!((status, &answer["changed"]), (200, &serde_json::json!(true)), "{answer}");
        let readyz = server.request(Method::GET, "/readyz", &[], "").await.unwrap();
        assert_eq!(json(&readyz)["dispatch"], "paused");
        for job_id in ["held-1", "held-2"] {
            assert_eq!(server.deliver(&job_body(job_id)).await.status, 200);
        }
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!(runs(&server), 0, "a job ran while dispatch was paused");
        assert_eq!(server.state_of("held-1").as_deref(), Some("claimed"));
        let (_, dispatch) = admin(Method::GET, admin_port, "/v1/dispatch").await;
        assert_eq!(dispatch["paused"], true);
        assert_eq!(dispatch["changed_by"], "admin:127.0.0.1");

        let (status, _) = admin(Method::POST, admin_port, "/v1/dispatch/resume").await;
        assert_eq!(status, 200);
        wait_for_state(&server, "held-1", "done").await;
        wait_for_state(&server, "held-2", "done").await;
        assert_eq!(runs(&server), 2);
        server.stop().await.0.unwrap();
    }

    /// A dead job's history on the admin listener shows its attempt (exit status, stderr); a
    /// retry there is recorded with the caller and runs the job again; refusals are explained.
    #[tokio::test(flavor = "multi_thread")]
    async fn admin_actions_act_on_jobs_and_are_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let admin_port = free_port();
        let config = operator_config(dir.path(), admin_port, 3);
        let server = TestServer::start_in(dir, &config).await;
        assert_eq!(server.deliver(&job_body("failing")).await.status, 200);
        wait_for_state(&server, "failing", "dead").await;

        let (status, job) = admin(Method::GET, admin_port, "/v1/jobs/failing").await;
        assert_eq!(status, 200, "{job}");
        let attempt = &job["history"][0];
        assert_eq!(attempt["cause"], "first");
        assert_eq!(attempt["outcome"], "dead");
        assert_eq!(attempt["exit_status"], 3);
        assert!(attempt["error"].as_str().unwrap().contains("upstream down"), "{job}");

        let (status, answer) = admin(Method::POST, admin_port, "/v1/jobs/failing/retry").await;
        assert_eq!(status, 200, "{answer}");
        let ran_again = eventually(Duration::from_secs(5), || runs(&server) == 2).await;
        assert!(ran_again, "the retried job did not run again");
        wait_for_state(&server, "failing", "dead").await;
        let (_, job) = admin(Method::GET, admin_port, "/v1/jobs/failing").await;
        assert_eq!(job["history"].as_array().unwrap().len(), 2, "{job}");
        assert_eq!(job["history"][1]["cause"], "manual_retry");
        assert_eq!(job["history"][1]["route"], "default");
        assert_eq!(job["actions"][0]["action"], "retry");
        assert_eq!(job["actions"][0]["actor"], "admin:127.0.0.1");

        for (path, expected) in [
            ("/v1/jobs/failing/cancel", 400),
            ("/v1/jobs/failing/cancel?reason=not%20wanted", 409),
            ("/v1/jobs/failing/run-now", 409),
            ("/v1/jobs/nobody/retry", 404),
            // One route's work: a route the job does not have, a text no route can be named.
            ("/v1/jobs/failing/retry?route=archive", 404),
            ("/v1/jobs/failing/retry?route=Not%20A%20Route", 400),
            ("/v1/jobs/failing/explode", 404),
        ] {
            let (status, answer) = admin(Method::POST, admin_port, path).await;
            assert_eq!(status, expected, "{path}: {answer}");
        }
        let url = format!("http://127.0.0.1:{admin_port}/v1/jobs/failing/retry");
        let anonymous = send_to(Method::POST, &url, &[]).await;
        assert_eq!(anonymous.status, 401);
        server.stop().await.0.unwrap();
    }

    /// A claimed job cancelled on the admin listener is dead with the reason, and never runs.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_waiting_job_cancelled_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let admin_port = free_port();
        let config = operator_config(dir.path(), admin_port, 0);
        let server = TestServer::start_in(dir, &config).await;
        admin(Method::POST, admin_port, "/v1/dispatch/pause?reason=a+migration").await;
        assert_eq!(server.deliver(&job_body("unwanted")).await.status, 200);
        // The pause it waits in, with who and why.
        let (_, job) = admin(Method::GET, admin_port, "/v1/jobs/unwanted").await;
        let pause = &job["delayed_by"][0];
        assert_eq!((&pause["started_by"], &pause["reason"]), (&"admin:127.0.0.1".into(), &"a migration".into()), "{job}");
        let path = "/v1/jobs/unwanted/cancel?reason=ordered+twice";
        let (status, answer) = admin(Method::POST, admin_port, path).await;
        assert_eq!((status, &answer["state"]), (200, &serde_json::json!("dead")), "{answer}");
        admin(Method::POST, admin_port, "/v1/dispatch/resume").await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(runs(&server), 0);
        let (_, job) = admin(Method::GET, admin_port, "/v1/jobs/unwanted").await;
        assert_eq!(job["last_error"], "cancelled by admin:127.0.0.1: ordered twice");
        assert_eq!(job["actions"][0]["reason"], "cancelled by admin:127.0.0.1: ordered twice");
        server.stop().await.0.unwrap();
    }
}

/// Duplicates are answered at once and counted on their job within a second or so.
#[tokio::test(flavor = "multi_thread")]
async fn duplicate_deliveries_are_counted_on_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = operator_config(dir.path(), admin_port, 0);
    let server = TestServer::start_in(dir, &config).await;
    for _ in 0..3 {
        assert_eq!(server.deliver(&job_body("again")).await.status, 200);
    }
    let counted = eventually(Duration::from_secs(5), || {
        server.value(
            "SELECT count FROM job_duplicates WHERE job_id = ?1",
            &["again"],
        ) == 2
    })
    .await;
    assert!(
        counted,
        "{}",
        server.value(
            "SELECT count FROM job_duplicates WHERE job_id = ?1",
            &["again"]
        )
    );
    let (_, job) = admin(Method::GET, admin_port, "/v1/jobs/again").await;
    assert!(job["last_duplicate_at"].as_i64().unwrap() >= job["received_at"].as_i64().unwrap());
    // Counted on shutdown too.
    assert_eq!(server.deliver(&job_body("again")).await.status, 200);
    let (result, dir) = server.stop().await;
    result.unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("ledger.sqlite3")).unwrap();
    let count: i64 = conn
        .query_row(
            "SELECT count FROM job_duplicates WHERE job_id = 'again'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(count, 3);
}

/// Refused deliveries are in the admin listener's ring, newest first, with the peer and why;
/// a flood of them keeps only the newest.
#[tokio::test(flavor = "multi_thread")]
async fn refused_deliveries_are_listed_with_peer_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = operator_config(dir.path(), admin_port, 0);
    let server = TestServer::start_in(dir, &config).await;
    let forged = server
        .deliver_signed(&job_body("forged"), unix_now(), &["not-the-secret"])
        .await;
    assert_eq!(forged.status, 401);
    let stale = server
        .deliver_signed(&job_body("stale"), unix_now() - 3_600, &[SECRET])
        .await;
    assert_eq!(stale.status, 401);
    let (status, refusals) = admin(Method::GET, admin_port, "/v1/refusals").await;
    assert_eq!(status, 200);
    let refusals = refusals.as_array().unwrap();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(
        refusals[0]["reason"]
            .as_str()
            .unwrap()
            .contains("timestamp"),
        "{refusals:?}"
    );
    assert!(
        refusals[1]["reason"]
            .as_str()
            .unwrap()
            .contains("signature"),
        "{refusals:?}"
    );
    assert_eq!(refusals[1]["status"], 401);
    assert!(refusals[1]["peer"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    for _ in 0..300 {
        server.deliver_signed("{}", unix_now(), &["wrong"]).await;
    }
    let (_, refusals) = admin(Method::GET, admin_port, "/v1/refusals").await;
    assert_eq!(refusals.as_array().unwrap().len(), 256, "bounded");
    server.stop().await.0.unwrap();
}
