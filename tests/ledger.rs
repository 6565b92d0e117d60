//! The ledger under write load: group commit and a WAL that stays bounded.

mod common;

use std::time::Duration;

use common::*;
use sume_receiver::config::Config;
use sume_receiver::ledger::{self, ClaimOutcome, Ledger, NewClaim, Source};

fn claim(job_id: String) -> NewClaim {
    NewClaim {
        body: job_body(&job_id),
        job_id,
        event_type: None,
        source: Source::Webhook,
    }
}

async fn claim_many(
    ledger: &std::sync::Arc<Ledger>,
    prefix: &str,
    count: usize,
) -> Vec<ClaimOutcome> {
    let mut claims = tokio::task::JoinSet::new();
    for i in 0..count {
        let ledger = ledger.clone();
        let job_id = format!("{prefix}-{}", (i * 7919) % count);
        claims.spawn(async move { ledger.claim(claim(job_id)).await.unwrap() });
    }
    claims.join_all().await
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_claims_share_commits_and_the_wal_is_checkpointed_off_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path());

    let outcomes = claim_many(&ledger, "burst", 4000).await;
    assert!(outcomes.iter().all(|o| *o == ClaimOutcome::Claimed));

    // The checkpointer copies frames back concurrently; the next commit then rewinds the WAL.
    // Without it the WAL would hold every frame of the burst (fewer than the writer's own
    // automatic checkpoint threshold).
    tokio::time::sleep(Duration::from_millis(300)).await;
    ledger.claim(claim("after-burst".into())).await.unwrap();
    let conn = rusqlite::Connection::open(&config.database.path).unwrap();
    let wal_frames: i64 = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
        .unwrap();
    assert!(wal_frames < 100, "the WAL still holds {wal_frames} frames");

    let rows: i64 = conn
        .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 4001);
    drop(conn);
    ledger.close();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_a_failing_item_commits_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path());
    let bad =
        ledger.write(|conn| conn.execute("INSERT INTO jobs (job_id) VALUES ('no-state')", []));
    let good = ledger.claim(claim("fine".into()));
    let (bad, good) = tokio::join!(bad, good);
    assert!(
        bad.is_err(),
        "a NOT NULL violation is reported to its caller"
    );
    assert_eq!(good.unwrap(), ClaimOutcome::Claimed);
    let conn = rusqlite::Connection::open(&config.database.path).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 1);
    drop(conn);
    ledger.close();
}

/// Regression: the pragma was stepped once, so each call gave back a single page.
#[tokio::test(flavor = "multi_thread")]
async fn release_free_pages_gives_back_up_to_the_asked_number_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path());
    claim_many(&ledger, "bulk", 2000).await;
    ledger
        .write(|conn| conn.execute("DELETE FROM jobs", []))
        .await
        .unwrap();
    let free = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row("PRAGMA freelist_count", [], |row| row.get(0))
            .unwrap()
    };
    let conn = rusqlite::Connection::open(&config.database.path).unwrap();
    let freed = free(&conn);
    assert!(freed > 60, "{freed} free pages");
    assert!(
        ledger.release_free_pages(50).await.unwrap(),
        "more than 50 were free"
    );
    assert_eq!(free(&conn), freed - 50);
    assert!(!ledger.release_free_pages(100_000).await.unwrap());
    assert_eq!(free(&conn), 0);
    drop(conn);
    ledger.close();
}

/// The sweeper's, the reconciler's and retention's statements read only the partial index of
/// the rows they look for: their cost does not grow with finished history.
#[test]
fn background_statements_read_only_their_partial_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    Ledger::open(&config.database).unwrap().close();
    let conn = rusqlite::Connection::open(&config.database.path).unwrap();
    for (sql, index) in [
        (ledger::DUE_JOBS_SQL, "jobs_due"),
        (ledger::EXPIRE_LEASES_SQL, "jobs_leased"),
        (ledger::PURGE_BODIES_SQL, "jobs_finished_with_body"),
        (ledger::DELETE_FINISHED_SQL, "jobs_finished"),
        (ledger::DUE_EXPECTATIONS_SQL, "expected_jobs_due"),
        (ledger::DELETE_RESOLVED_SQL, "expected_jobs_resolved"),
    ] {
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        // raw_query: the plan does not depend on the (unbound, NULL) parameters.
        let mut rows = statement.raw_query();
        let mut steps = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            steps.push(row.get::<_, String>(3).unwrap());
        }
        let plan = steps.join("; ");
        assert!(
            plan.contains(&format!("INDEX {index} ")) || plan.ends_with(&format!("INDEX {index}")),
            "{sql}\n=> {plan}"
        );
        assert!(
            !plan.contains("SCAN jobs") && !plan.contains("SCAN expected_jobs"),
            "{sql}\n=> {plan}"
        );
    }
}
