//! Retention: bodies purged after ttl, job_ids forgotten after dedupe_ttl, unfinished work kept,
//! space given back, all through indexes.

mod common;

use std::time::Duration;

use common::*;
use sume_receiver::config::{Config, RetentionConfig};
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, Ledger, NewClaim, Source};
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

/// Claims `count` jobs named `{prefix}-{i}` and sets their state and age (days since finishing).
async fn add_jobs(
    ledger: &Ledger,
    prefix: &str,
    count: usize,
    state: &'static str,
    age_days: i64,
    body_bytes: usize,
) {
    let prefix = prefix.to_owned();
    let pad = "p".repeat(body_bytes);
    ledger
        .sqlite()
        .unwrap()
        .write(move |conn| {
            for i in 0..count {
                let job_id = format!("{prefix}-{i}");
                let claim = NewClaim {
                    body: format!(r#"{{"job_id":"{job_id}","pad":"{pad}"}}"#),
                    job_id: JobId::parse(&job_id).unwrap(),
                    event_type: None,
                    source: Source::Webhook,
                };
                ledger::insert_claim(conn, &claim, ledger::now_ms())?;
            }
            let finished = ledger::now_ms() - age_days * DAY_MS;
            let finished_at = if matches!(state, "done" | "dead") {
                Some(finished)
            } else {
                None
            };
            conn.execute(
                "UPDATE jobs SET state = ?1, finished_at = ?2 WHERE job_id LIKE ?3 || '-%'",
                rusqlite::params![state, finished_at, prefix],
            )?;
            Ok(())
        })
        .await
        .unwrap();
}

fn count(conn: &rusqlite::Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn vacuum_once_purges_then_forgets_and_never_touches_unfinished_work() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    add_jobs(&ledger, "fresh", 10, "done", 1, 10).await;
    add_jobs(&ledger, "old-done", 1200, "done", 40, 10).await; // more than one batch
    add_jobs(&ledger, "old-dead", 5, "dead", 40, 10).await;
    add_jobs(&ledger, "ancient", 700, "done", 400, 10).await;
    for (prefix, state) in [
        ("claimed", "claimed"),
        ("running", "running"),
        ("retrying", "retrying"),
    ] {
        add_jobs(&ledger, prefix, 3, state, 0, 10).await;
    }
    // Unfinished rows with an old received_at: age alone never removes unfinished work.
    ledger
        .sqlite()
        .unwrap()
        .write(|conn| {
            conn.execute(
                "UPDATE jobs SET received_at = 0 WHERE finished_at IS NULL",
                [],
            )
        })
        .await
        .unwrap();
    ledger
        .sqlite()
        .unwrap()
        .write(|conn| {
            conn.execute_batch(&format!(
                "INSERT INTO expected_jobs (job_id, state, expected_at, next_poll_at, resolved_at)
                 VALUES ('exp-old', 'arrived', 0, 0, {old}), ('exp-new', 'arrived', 0, 0, {new}),
                        ('exp-waiting', 'waiting', 0, 0, NULL)",
                old = ledger::now_ms() - 400 * DAY_MS,
                new = ledger::now_ms(),
            ))
        })
        .await
        .unwrap();

    let vacuum = Vacuum::new(ledger.clone(), retention(30, 365), CancellationToken::new());
    let report = vacuum.vacuum_once().await.unwrap();
    // Bodies go first (old and ancient alike), then the ancient tombstones.
    assert_eq!(
        report,
        VacuumReport {
            bodies_purged: 1905,
            jobs_forgotten: 700,
            expectations_forgotten: 1
        }
    );

    let conn = rusqlite::Connection::open(&config.database.path).unwrap();
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM jobs WHERE job_id LIKE 'ancient-%'"
        ),
        0
    );
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM jobs WHERE job_id LIKE 'old-%' AND body IS NULL"
        ),
        1205,
        "tombstones"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM jobs WHERE job_id LIKE 'fresh-%' AND body IS NOT NULL"
        ),
        10
    );
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM jobs WHERE finished_at IS NULL AND body IS NOT NULL"
        ),
        9
    );
    assert_eq!(count(&conn, "SELECT count(*) FROM expected_jobs"), 2);

    // A tombstone still makes a Redeliver a duplicate.
    let again = NewClaim {
        job_id: JobId::parse("old-done-7").unwrap(),
        event_type: None,
        body: "{}".into(),
        source: Source::Webhook,
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
    drop(conn);
    ledger.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn vacuum_gives_the_space_back_to_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    add_jobs(&ledger, "keep", 200, "done", 1, 2000).await;
    add_jobs(&ledger, "churn", 3000, "done", 400, 2000).await;
    let size = || {
        let conn = rusqlite::Connection::open(&config.database.path).unwrap();
        count(
            &conn,
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

/// Regression: a retention run working through a big backlog held up SIGTERM until it was done.
#[tokio::test(flavor = "multi_thread")]
async fn vacuum_stops_between_batches_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (_config, ledger) = open_ledger(dir.path()).await;
    add_jobs(&ledger, "backlog", 2000, "done", 400, 10).await;
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

#[test]
fn the_vacuum_command_reports_what_it_removed() {
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
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no ledger at"));

    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let ledger = Ledger::open(&config.database).await.unwrap();
        add_jobs(&ledger, "gone", 3, "done", 400, 10).await;
        ledger.close().await;
    });
    let output = run();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("purged 3 bodies, forgot 3 jobs"),
        "{stdout}"
    );
}
