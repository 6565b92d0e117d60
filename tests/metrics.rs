//! /metrics after a known mix of deliveries, handler runs, a poll and a retention run: exact
//! counts. (Its own test binary: the metrics are per process. That the metrics table matches
//! what is served: tests/docs.rs.)

mod common;

use std::time::Duration;

use common::sume::{MockSume, StatusAnswer, API_KEY};
use common::*;
use hyper::Method;

/// The value of one sample line (`name{labels} value`) of the exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_exactly_what_happened() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook_url = format!("http://{}{WEBHOOK_PATH}", listener.local_addr().unwrap());
    let sume = MockSume::start(&webhook_url, &[SECRET], Duration::from_millis(20)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api_key"), API_KEY).unwrap();
    std::fs::write(dir.path().join("admin_token"), "t0ken").unwrap();
    let admin_port = free_port();
    let config = format!(
        "[handler]\ncommand = [\"sh\", \"-c\", \"[ \\\"$SUME_JOB_ID\\\" != job-fail ]\"]\nmax_attempts = 1\n\n\
         [sume_api]\nbase_url = \"{}\"\napi_key_file = \"api_key\"\nreconcile_after = \"100ms\"\n\
         poll_backoff = \"100ms\"\nmax_poll_backoff = \"400ms\"\nmax_requests_per_second = 50\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\n\
         [retention]\nttl = \"1s\"\ndedupe_ttl = \"1h\"\ninterval = \"200ms\"\n",
        sume.base_url()
    );
    let server = TestServer::start_with(dir, &config, listener).await;

    assert_eq!(server.deliver(&job_body("job-ok")).await.status, 200);
    assert_eq!(server.deliver(&job_body("job-ok")).await.status, 200);
    assert_eq!(server.deliver(&job_body("job-fail")).await.status, 200);
    let forged = server
        .deliver_signed(&job_body("job-forged"), unix_now(), &["whsec_wrong"])
        .await;
    assert_eq!(forged.status, 401);
    assert_eq!(server.deliver("not json").await.status, 400);
    // A job whose webhook never comes: registered, then found terminal by one poll.
    sume.set_answers(
        "job-polled",
        vec![StatusAnswer::status("job-polled", "completed")],
    );
    let url = format!("http://127.0.0.1:{admin_port}/v1/expected/job-polled");
    let registered = send_to(Method::PUT, &url, &[("authorization", "Bearer t0ken")]).await;
    assert_eq!(registered.status, 200);

    // Everything ran, and retention dropped the three finished jobs' bodies (ttl 1 s).
    let settled = eventually(Duration::from_secs(15), || {
        let purged: i64 = server
            .db()
            .query_row(
                "SELECT count(*) FROM jobs WHERE body IS NULL AND state IN ('done', 'dead')",
                [],
                |row| row.get(0),
            )
            .unwrap();
        purged == 3
    })
    .await;
    assert!(settled, "the jobs never finished and were purged");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let text = server.metrics().await;
    // Regression: the registry adds the final period itself; every help text ended in "..".
    for help in text.lines().filter(|line| line.starts_with("# HELP")) {
        assert!(help.ends_with('.') && !help.ends_with(".."), "{help}");
    }
    for (series, expected) in [
        (r#"sume_deliveries_total{outcome="claimed"}"#, 2.0),
        (r#"sume_deliveries_total{outcome="duplicate"}"#, 1.0),
        (r#"sume_deliveries_total{outcome="unauthorized"}"#, 1.0),
        (r#"sume_deliveries_total{outcome="bad_request"}"#, 1.0),
        (r#"sume_attempts_total{result="done",route="default"}"#, 2.0),
        (
            r#"sume_attempts_total{result="failed",route="default"}"#,
            1.0,
        ),
        ("sume_jobs_dead_total", 1.0),
        (r#"sume_jobs{state="done"}"#, 2.0),
        (r#"sume_jobs{state="dead"}"#, 1.0),
        (r#"sume_jobs{state="claimed"}"#, 0.0),
        (r#"sume_jobs{state="running"}"#, 0.0),
        (r#"sume_reconcile_polls_total{result="answered"}"#, 1.0),
        ("sume_reconcile_recovered_total", 1.0),
        ("sume_reconcile_given_up_total", 0.0),
        (r#"sume_expected_jobs{state="recovered"}"#, 1.0),
        ("sume_retention_bodies_purged_total", 3.0),
        ("sume_retention_jobs_forgotten_total", 0.0),
        // Claims that reached the ledger: job-ok, job-fail, one by the poll; job-ok's
        // duplicate was answered from memory.
        ("sume_claim_commit_seconds_count", 3.0),
        ("sume_duplicates_from_memory_total", 1.0),
        (
            r#"sume_attempt_duration_seconds_count{result="done",route="default"}"#,
            2.0,
        ),
        ("sume_oldest_unfinished_job_age_seconds", 0.0),
        ("sume_ledger_writer_queue_depth", 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(expected), "{series}\n{text}");
    }
    // Every acknowledged change went through the WAL syncer; a sync may cover several commits.
    let syncs = sample(&text, "sume_ledger_wal_sync_seconds_count").unwrap();
    let commits = sample(&text, r#"sume_ledger_commits_total{result="committed"}"#).unwrap();
    assert!(
        syncs >= 1.0 && syncs <= commits,
        "{syncs} syncs, {commits} commits"
    );
    assert!(sample(&text, r#"sume_ledger_file_bytes{file="db"}"#).unwrap() > 0.0);
    assert!(sample(&text, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(sample(&text, "process_open_fds").unwrap() > 3.0);
    assert!(
        text.contains("sume_receiver_build_info{version=\""),
        "{text}"
    );
}

/// Regression: the attempt was counted after its end was written, so a reader who saw the job
/// `done` could scrape before the count (tests/alerts.rs failed so, one run in twenty). Here the
/// `sqlite3` shell holds the write lock when the handler ends: the attempt is counted while its
/// job is still `running`, before its end can be written. The real binary: its count is its own.
#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_is_counted_before_its_end_is_written() {
    use common::service::{signed_delivery, write_config, Service};
    use common::sqlite_shell::SqliteShell;
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let port = free_port();
    let handler = format!(
        "[handler]\ncommand = [\"sh\", \"-c\", \"while [ ! -e '{}' ]; do sleep 0.02; done\"]\n",
        go.display()
    );
    let config = write_config(dir.path(), port, "", &handler);
    let service = Service::start(&config, port).await;
    let delivery = signed_delivery(port, SECRET, &job_body("counted"));
    let client = sume_receiver::http_client::new_client();
    let answer = sume_receiver::http_client::send(&client, delivery, Duration::from_secs(5), 4096)
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    let db = dir.path().join("ledger.sqlite3");
    let state = || {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT state FROM jobs WHERE job_id = 'counted'",
                [],
                |row| row.get::<_, String>(0),
            )
            .unwrap()
    };
    assert!(eventually(Duration::from_secs(10), || state() == "running").await);

    let shell = SqliteShell::holding_the_write_lock(&db);
    std::fs::write(&go, "").unwrap();
    let metrics_url = format!("http://127.0.0.1:{port}/metrics");
    let done = r#"sume_attempts_total{result="done",route="default"}"#;
    let mut counted = None;
    for _ in 0..500 {
        let scrape = send_to(Method::GET, &metrics_url, &[]).await;
        let text = String::from_utf8_lossy(&scrape.body).into_owned();
        if sample(&text, done) == Some(1.0) {
            counted = Some(text);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(counted.is_some(), "the attempt was not counted within 10 s");
    assert_eq!(state(), "running", "its end was written under the lock");
    shell.let_go();
    assert!(eventually(Duration::from_secs(10), || state() == "done").await);
    service.stop_cleanly().await;
}
