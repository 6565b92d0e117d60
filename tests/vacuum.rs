//! Retention: bodies purged after ttl, job_ids forgotten after dedupe_ttl, unfinished work kept,
//! space given back, all through indexes.

mod common;

use std::time::Duration;

use common::*;
use sume_receiver::config::{Config, RetentionConfig};
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, Ledger, MinuteRollup, NewClaim, Source};
use sume_receiver::vacuum::{Vacuum, VacuumReport};
use tokio_util::sync::CancellationToken;

const DAY_MS: i64 = 86_400_000;

fn retention(ttl_days: u64, dedupe_days: u64) -> RetentionConfig {
    RetentionConfig {
        ttl: Duration::from_secs(ttl_days * 86_400),
        dedupe_ttl: Duration::from_secs(dedupe_days * 86_400),
        interval: Duration::from_secs(3600),
    }
}

/// Jobs named `{prefix}-{i}` in `state`, finished `age_days` ago if finished.
fn add_jobs(
    config: &Config,
    prefix: &str,
    count: usize,
    state: &'static str,
    age_days: i64,
    body_bytes: usize,
) {
    let pad = "p".repeat(body_bytes);
    let finished_at =
        matches!(state, "done" | "dead").then(|| ledger::now_ms() - age_days * DAY_MS);
    insert_jobs(
        config,
        (0..count).map(|i| {
            let job_id = format!("{prefix}-{i}");
            let body = format!(r#"{{"job_id":"{job_id}","pad":"{pad}"}}"#);
            (job_id, state, body, finished_at)
        }),
    );
}

fn count(config: &Config, sql: &str) -> i64 {
    ledger_rows(config, sql, &[])[0][0].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn vacuum_gives_the_space_back_to_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    add_jobs(&config, "keep", 200, "done", 1, 2000);
    add_jobs(&config, "churn", 3000, "done", 400, 2000);
    let size = || {
        count(
            &config,
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
        )
    };
    let before = size();
    Vacuum::new(ledger.clone(), retention(30, 365), CancellationToken::new())
        .vacuum_once()
        .await
        .unwrap();
    let after = size();
    assert!(before > 6_000_000, "{before}");
    assert!(
        after < before / 5,
        "the ledger shrank from {before} to {after} bytes"
    );
    ledger.close().await;
}

on_both_ledgers! {
#[tokio::test(flavor = "multi_thread")]
async fn the_vacuum_command_reports_what_it_removed() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config_text(dir.path(), "")).unwrap();
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_sume-receiver"))
            .args(["--config", config_path.to_str().unwrap(), "vacuum"])
            .output()
            .unwrap()
    };
    let missing = run();
    assert!(!missing.status.success());
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(
        error.contains("no ledger at") || error.contains("start the service once"),
        "{error}"
    );

    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    let ledger = Ledger::open(&config.database).await.unwrap();
    add_jobs(&config, "gone", 3, "done", 400, 10);
    ledger.close().await;
    let output = run();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("purged 3 bodies, forgot 3 jobs"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn vacuum_once_purges_then_forgets_and_never_touches_unfinished_work() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    add_jobs(&config, "fresh", 10, "done", 1, 10);
    add_jobs(&config, "old-done", 1200, "done", 40, 10); // more than one batch
    add_jobs(&config, "old-dead", 5, "dead", 40, 10);
    add_jobs(&config, "ancient", 700, "done", 400, 10);
    for (prefix, state) in [
        ("claimed", "claimed"),
        ("running", "running"),
        ("retrying", "retrying"),
    ] {
        add_jobs(&config, prefix, 3, state, 0, 10);
    }
    // Unfinished rows with an old received_at: age alone never removes unfinished work.
    ledger_execute(
        &config,
        "UPDATE jobs SET received_at = 0 WHERE finished_at IS NULL",
        &[],
    );
    ledger_execute(
        &config,
        &format!(
            "INSERT INTO expected_jobs (job_id, state, expected_at, next_poll_at, resolved_at)
             VALUES ('exp-old', 'arrived', 0, 0, {old}), ('exp-new', 'arrived', 0, 0, {new}),
                    ('exp-waiting', 'waiting', 0, 0, NULL)",
            old = ledger::now_ms() - 400 * DAY_MS,
            new = ledger::now_ms(),
        ),
        &[],
    );

    let vacuum = Vacuum::new(ledger.clone(), retention(30, 365), CancellationToken::new());
    let report = vacuum.vacuum_once().await.unwrap();
    // Bodies go first (old and ancient alike), then the ancient tombstones.
    assert_eq!(
        report,
        VacuumReport {
            bodies_purged: 1905,
            jobs_forgotten: 700,
            expectations_forgotten: 1,
            minutes_forgotten: 0,
        }
    );

    assert_eq!(
        count(
            &config,
            "SELECT count(*) FROM jobs WHERE job_id LIKE 'ancient-%'"
        ),
        0
    );
    assert_eq!(
        count(
            &config,
            "SELECT count(*) FROM jobs WHERE job_id LIKE 'old-%' AND body IS NULL"
        ),
        1205,
        "tombstones"
    );
    assert_eq!(
        count(
            &config,
            "SELECT count(*) FROM jobs WHERE job_id LIKE 'fresh-%' AND body IS NOT NULL"
        ),
        10
    );
    assert_eq!(
        count(
            &config,
            "SELECT count(*) FROM jobs WHERE finished_at IS NULL AND body IS NOT NULL"
        ),
        9
    );
    assert_eq!(count(&config, "SELECT count(*) FROM expected_jobs"), 2);

    // A tombstone still makes a Redeliver a duplicate.
    let again = NewClaim {
        job_id: JobId::parse("old-done-7").unwrap(),
        event_type: None,
        body: "{}".into(),
        source: Source::Webhook,
        trace_context: None,
        routing: sume_receiver::ledger::Routing::default_route(),
    };
    assert_eq!(
        ledger.claim(again).await.unwrap(),
        ledger::ClaimOutcome::Duplicate
    );

    assert_eq!(
        vacuum.vacuum_once().await.unwrap(),
        VacuumReport::default(),
        "nothing left to do"
    );
    ledger.close().await;
}

/// The console's minutes are kept a day: older ones go, in batches, and the last hour stays.
#[tokio::test(flavor = "multi_thread")]
async fn vacuum_once_forgets_the_console_minutes_of_yesterday() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    let now = ledger::now_ms() / 60_000;
    let minutes = (now - 2 * 1440 - 600..now - 1440 - 10).chain(now - 60..=now);
    for minute in minutes {
        let kept = MinuteRollup {
            minute,
            counts: [1, 0, 0, 0, 0, 0, 0, 0, 0],
            ..MinuteRollup::default()
        };
        ledger.store_rollup(&kept).await.unwrap();
    }
    let vacuum = Vacuum::new(ledger.clone(), retention(30, 365), CancellationToken::new());
    let report = vacuum.vacuum_once().await.unwrap();
    assert_eq!(report.minutes_forgotten, 2 * 1440 + 600 - 1440 - 10);
    let left = count(&config, "SELECT count(*) FROM minute_rollups");
    assert_eq!(left, 61);
    let oldest = count(&config, "SELECT min(minute) FROM minute_rollups");
    assert_eq!(oldest, now - 60);
    ledger.close().await;
}

/// Regression: a retention run working through a big backlog held up SIGTERM until it was done.
#[tokio::test(flavor = "multi_thread")]
async fn vacuum_stops_between_batches_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    add_jobs(&config, "backlog", 2000, "done", 400, 10);
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    let report = Vacuum::new(ledger.clone(), retention(30, 365), shutdown)
        .vacuum_once()
        .await
        .unwrap();
    assert_eq!(
        report.bodies_purged, 500,
        "one batch, then it noticed the shutdown"
    );
    ledger.close().await;
}
}
