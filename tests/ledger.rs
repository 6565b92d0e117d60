//! The ledger under write load: group commit and a WAL that stays bounded.

mod common;

use std::time::Duration;

use common::*;
use sume_receiver::config::Config;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{self, ClaimOutcome, Ledger, NewClaim, Source};

fn claim(job_id: String) -> NewClaim {
    NewClaim {
        body: job_body(&job_id).into(),
        job_id: JobId::parse(&job_id).unwrap(),
        event_type: None,
        source: Source::Webhook,
        trace_context: None,
        routing: sume_receiver::ledger::Routing::default_route(),
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
        // Through `write`, which waits for room in the writer's queue (`claim` would refuse
        // what does not fit, as a delivery is).
        claims.spawn(async move {
            let claim = claim(job_id);
            ledger
                .sqlite()
                .unwrap()
                .write_for_test(move |conn| {
                    ledger::sqlite::insert_claim(conn, &claim, ledger::now_ms())
                })
                .await
                .unwrap()
        });
    }
    claims.join_all().await
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_claims_share_commits_and_the_wal_is_checkpointed_off_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;

    let outcomes = claim_many(&ledger, "burst", 4000).await;
    assert!(outcomes.iter().all(|o| *o == ClaimOutcome::Claimed));

    // The checkpointer copies frames back concurrently; the next commit then rewinds the WAL.
    // Without it the WAL would hold every frame of the burst (fewer than the writer's own
    // automatic checkpoint threshold).
    tokio::time::sleep(Duration::from_millis(300)).await;
    ledger.claim(claim("after-burst".into())).await.unwrap();
    let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
    let wal_frames: i64 = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
        .unwrap();
    assert!(wal_frames < 100, "the WAL still holds {wal_frames} frames");

    let rows: i64 = conn
        .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 4001);
    drop(conn);
    ledger.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_a_failing_item_commits_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    let bad = ledger
        .sqlite()
        .unwrap()
        .write_for_test(|conn| conn.execute("INSERT INTO jobs (job_id) VALUES ('no-state')", []));
    let good = ledger.claim(claim("fine".into()));
    let (bad, good) = tokio::join!(bad, good);
    assert!(
        bad.is_err(),
        "a NOT NULL violation is reported to its caller"
    );
    assert_eq!(good.unwrap(), ClaimOutcome::Claimed);
    let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 1);
    drop(conn);
    ledger.close().await;
}

/// Holds the ledger's write lock from another connection until dropped: the writer thread
/// stalls in BEGIN IMMEDIATE, as it would behind a stalled disk.
fn hold_write_lock(path: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    conn
}

/// Regression: the writer queue was unbounded, so behind a stalled writer every delivery's
/// body stayed queued until its claim_timeout.
#[tokio::test(flavor = "multi_thread")]
async fn claims_past_a_full_writer_queue_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(
        &config_text(
            dir.path(),
            "[database]\nbusy_timeout = \"3s\"\nmax_batch = 1\n",
        ),
        dir.path(),
    )
    .unwrap();
    let ledger = Ledger::open(&config.database).await.unwrap();
    let lock = hold_write_lock(sqlite_path(&config));
    let mut claims = tokio::task::JoinSet::new();
    for i in 0..ledger::sqlite::QUEUE_CAPACITY + 50 {
        let ledger = ledger.clone();
        claims.spawn(async move {
            let started = std::time::Instant::now();
            let outcome = ledger.claim(claim(format!("queued-{i}"))).await;
            (outcome, started.elapsed())
        });
    }
    // The refused ones answer while the writer is still stuck; the rest wait for it.
    let mut refused = 0;
    while let Some(joined) = tokio::time::timeout(Duration::from_millis(1500), claims.join_next())
        .await
        .ok()
        .flatten()
    {
        let (outcome, elapsed) = joined.unwrap();
        assert_eq!(outcome, Err(ledger::StorageError::Overloaded));
        assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");
        refused += 1;
    }
    assert!(refused >= 48, "only {refused} claims were refused at once");
    assert!(ledger.claim_queue_depth() > ledger::sqlite::QUEUE_CAPACITY - 8);
    drop(lock);
    let committed = claims.join_all().await;
    assert!(committed
        .iter()
        .all(|(outcome, _)| *outcome == Ok(ClaimOutcome::Claimed)));
    ledger.close().await;
}

/// Regression: after SQLite rolled a batch's transaction back on its own (SQLITE_FULL), the next
/// items' SAVEPOINT/RELEASE ran in autocommit mode and committed one by one, while their callers
/// were told the batch failed.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_of_a_batch_commits_after_sqlite_rolled_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    let pages: i64 = ledger
        .sqlite()
        .unwrap()
        .write_for_test(|conn| conn.query_row("PRAGMA page_count", [], |row| row.get(0)))
        .await
        .unwrap();
    // Room for the small claims, not for the big one.
    ledger
        .sqlite()
        .unwrap()
        .write_for_test(move |conn| {
            conn.query_row(
                &format!("PRAGMA max_page_count = {}", pages + 8),
                [],
                |_| Ok(()),
            )
        })
        .await
        .unwrap();
    // Keeps the writer busy while the batch under test queues up behind it, big claim first.
    let writer = ledger.clone();
    let busy = tokio::spawn(async move {
        writer
            .sqlite()
            .unwrap()
            .write_for_test(|_| {
                std::thread::sleep(Duration::from_millis(300));
                Ok(())
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let big = NewClaim {
        body: format!(r#"{{"job_id":"big","pad":"{}"}}"#, "x".repeat(1 << 20)).into(),
        ..claim("big".into())
    };
    let mut batch = Vec::new();
    let first = ledger.clone();
    batch.push(tokio::spawn(async move { first.claim(big).await }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..5 {
        let ledger = ledger.clone();
        batch.push(tokio::spawn(async move {
            ledger.claim(claim(format!("after-{i}"))).await
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    busy.await.unwrap().unwrap();
    let mut outcomes = Vec::new();
    for claim in batch {
        outcomes.push(claim.await.unwrap());
    }
    let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
        .unwrap();
    let acknowledged = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    assert!(
        outcomes[0].is_err(),
        "the big claim does not fit: {outcomes:?}"
    );
    assert_eq!(
        rows as usize, acknowledged,
        "every row is an acknowledged claim and vice versa: {outcomes:?}"
    );
    drop(conn);
    ledger.close().await;
}

/// A panic on the writer thread (an injected fault here) must not leave a service that looks
/// alive but can never commit: `failed` resolves, and later writes fail at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_panic_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (_config, ledger) = open_ledger(dir.path()).await;
    let injected = ledger
        .sqlite()
        .unwrap()
        .write_for_test(|_| -> rusqlite::Result<()> { panic!("injected fault") })
        .await;
    assert_eq!(injected, Err(ledger::StorageError::Closed));
    tokio::time::timeout(Duration::from_secs(5), ledger.failed())
        .await
        .expect("writer_failed resolves");
    assert_eq!(
        ledger.claim(claim("after-panic".into())).await,
        Err(ledger::StorageError::Closed)
    );
    ledger.close().await;
}

/// Regression: the pragma was stepped once, so each call gave back a single page.
#[tokio::test(flavor = "multi_thread")]
async fn release_free_pages_gives_back_up_to_the_asked_number_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    claim_many(&ledger, "bulk", 2000).await;
    ledger
        .sqlite()
        .unwrap()
        .write_for_test(|conn| conn.execute("DELETE FROM jobs", []))
        .await
        .unwrap();
    let free = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row("PRAGMA freelist_count", [], |row| row.get(0))
            .unwrap()
    };
    let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
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
    ledger.close().await;
}

/// The sweeper's, the reconciler's and retention's statements read only the partial index of
/// the rows they look for: their cost does not grow with finished history.
#[tokio::test]
async fn background_statements_read_only_their_partial_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    Ledger::open(&config.database).await.unwrap().close().await;
    let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
    for (sql, index) in [
        (ledger::sqlite::DUE_JOBS_SQL, "job_routes_due"),
        (ledger::sqlite::NEXT_DUE_ON_ROUTE_SQL, "job_routes_due"),
        (ledger::sqlite::NEXT_DUE_SQL, "jobs_due"),
        (ledger::sqlite::EXPIRED_LEASES_SQL, "job_routes_leased"),
        (ledger::sqlite::PURGE_BODIES_SQL, "jobs_finished_with_body"),
        (ledger::sqlite::DELETE_FINISHED_SQL, "jobs_finished"),
        (ledger::sqlite::DUE_EXPECTATIONS_SQL, "expected_jobs_due"),
        (
            ledger::sqlite::DELETE_RESOLVED_SQL,
            "expected_jobs_resolved",
        ),
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
            !plan.contains("SCAN jobs")
                && !plan.contains("SCAN job_routes")
                && !plan.contains("SCAN expected_jobs"),
            "{sql}\n=> {plan}"
        );
    }
}

/// A job's page reads the log of dispatch stops by ranges of its index, and retention and a
/// resume find the ended and the open stops by theirs: no scan of the log, however long.
#[tokio::test]
async fn the_log_of_dispatch_stops_is_read_through_its_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    Ledger::open(&config.database).await.unwrap().close().await;
    let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
    let read = ledger::dispatch_stops_sql(ledger::Dialect::Sqlite);
    for (sql, index) in [
        (read.as_str(), "dispatch_stops_started"),
        (
            ledger::sqlite::DELETE_ENDED_STOPS_SQL,
            "dispatch_stops_ended",
        ),
    ] {
        let plan = query_plan(&conn, sql);
        assert!(
            plan.contains(&format!("INDEX {index} ")),
            "{sql}\n=> {plan}"
        );
        assert!(!plan.contains("SCAN dispatch_stops"), "{sql}\n=> {plan}");
    }
}

/// The plan of `sql` on `conn`, its steps joined by "; ".
fn query_plan(conn: &rusqlite::Connection, sql: &str) -> String {
    let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    // raw_query: the plan does not depend on the (unbound, NULL) parameters.
    let mut rows = statement.raw_query();
    let mut steps = Vec::new();
    while let Some(row) = rows.next().unwrap() {
        steps.push(row.get::<_, String>(3).unwrap());
    }
    steps.join("; ")
}

/// Every list of `jobs list` reads its state's own index in order and stops at the page's
/// end: no sort, no scan of the table, however many jobs the ledger holds. The history, the
/// counts and the bulk retry read indexes too.
#[tokio::test]
async fn the_operator_statements_read_indexes_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    Ledger::open(&config.database).await.unwrap().close().await;
    let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
    let states = [
        (None, "jobs_received"),
        (Some(ledger::State::Claimed), "jobs_due"),
        (Some(ledger::State::Retrying), "jobs_due"),
        (Some(ledger::State::Running), "jobs_leased"),
        (Some(ledger::State::Done), "jobs_finished"),
        (Some(ledger::State::Dead), "jobs_dead"),
    ];
    for (state, index) in states {
        for (after, since) in [(false, false), (true, false), (false, true), (true, true)] {
            let sql = ledger::list_jobs_sql(state, after, since, ledger::Dialect::Sqlite);
            let plan = query_plan(&conn, &sql);
            assert!(plan.contains(&format!("INDEX {index}")), "{sql}\n=> {plan}");
            // Only ties of the time are sorted (by job_id), never the list.
            let sorts = plan.replace("USE TEMP B-TREE FOR LAST TERM OF ORDER BY", "");
            assert!(!sorts.contains("TEMP B-TREE"), "a sort: {sql}\n=> {plan}");
            if after || since {
                assert!(
                    plan.contains("SEARCH jobs USING INDEX"),
                    "no seek: {sql}\n=> {plan}"
                );
            }
        }
    }
    for (sql, indexes) in [
        (
            ledger::sqlite::ATTEMPTS_OF_JOB_SQL.to_owned(),
            &["job_attempts_of_job"][..],
        ),
        (
            ledger::sqlite::ACTIONS_OF_JOB_SQL.to_owned(),
            &["job_actions_of_job"],
        ),
        (
            ledger::sqlite::RETRY_MATCHING_SQL.to_owned(),
            &["jobs_finished"],
        ),
        (
            ledger::sqlite::COUNT_RETRY_MATCHING_SQL.to_owned(),
            &["jobs_finished"],
        ),
        (
            ledger::stats_sql(ledger::Dialect::Sqlite),
            &["jobs_due", "jobs_leased", "jobs_received", "jobs_dead"],
        ),
    ] {
        let plan = query_plan(&conn, &sql);
        for index in indexes {
            assert!(
                plan.contains(&format!("INDEX {index}")),
                "{index}: {sql}\n=> {plan}"
            );
        }
        assert!(
            !plan.contains("SCAN jobs;") && !plan.ends_with("SCAN jobs"),
            "{sql}\n=> {plan}"
        );
        assert!(!plan.contains("TEMP B-TREE"), "a sort: {sql}\n=> {plan}");
    }
    // The counts by state read the partial indexes of the backlog, and the finished counts
    // kept: never the finished jobs.
    let plan = query_plan(&conn, ledger::JOB_COUNTS_SQL);
    for read in ["INDEX jobs_due", "INDEX jobs_leased", "SCAN job_counts"] {
        assert!(plan.contains(read), "{read}: {plan}");
    }
    assert!(
        !plan.contains("jobs_finished") && !plan.contains("jobs_dead"),
        "{plan}"
    );
}

/// The service's reads run on read-only connections, and one that runs past its time budget is
/// interrupted: a console page or a scrape can neither write nor hold a reader for long.
#[tokio::test(flavor = "multi_thread")]
async fn service_reads_cannot_write_and_are_cut_at_their_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (_config, ledger) = open_ledger(dir.path()).await;
    let sqlite = ledger.sqlite().expect("a SQLite ledger");
    let write = sqlite
        .read_for_test(Duration::from_secs(5), |conn| {
            conn.execute("DELETE FROM jobs", [])
        })
        .await;
    assert!(
        write.unwrap_err().to_string().contains("readonly"),
        "a reader wrote"
    );
    let started = std::time::Instant::now();
    let endless = sqlite
        .read_for_test(Duration::from_millis(200), |conn| {
            conn.query_row(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
                 SELECT count(*) FROM n",
                [],
                |row| row.get::<_, i64>(0),
            )
        })
        .await;
    assert!(
        endless.unwrap_err().to_string().contains("interrupt"),
        "not cut"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The connection is good for the next read, with the usual budget.
    let jobs = sqlite
        .read_for_test(Duration::from_secs(5), |conn| {
            conn.query_row("SELECT count(*) FROM jobs", [], |row| row.get::<_, i64>(0))
        })
        .await
        .unwrap();
    assert_eq!(jobs, 0);
    ledger.close().await;
}

/// A ledger written by the release before the history (schema 2) migrates forward with its jobs:
/// a waiting job still runs, and says why; a finished one keeps its place in the lists.
#[tokio::test(flavor = "multi_thread")]
async fn a_schema_2_ledger_migrates_with_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    {
        let conn = rusqlite::Connection::open(sqlite_path(&config)).unwrap();
        conn.execute_batch(include_str!("../migrations/sqlite/0001_jobs.sql"))
            .unwrap();
        conn.execute_batch(include_str!("../migrations/sqlite/0002_expected_jobs.sql"))
            .unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             INSERT INTO jobs (job_id, state, source, body, received_at, attempts,
                               next_attempt_at, finished_at, last_error, updated_at) VALUES
               ('old-retrying', 'retrying', 'webhook', '{}', 1000, 1, 2000, NULL, 'boom', 1000),
               ('old-polled', 'claimed', 'poll', '{}', 1100, 0, 1100, NULL, NULL, 1100),
               ('old-done', 'done', 'webhook', '{}', 900, 1, NULL, 950, NULL, 950);
             PRAGMA user_version = 2;",
        )
        .unwrap();
    }
    let ledger = Ledger::open(&config.database).await.unwrap();
    for (job_id, cause) in [
        ("old-retrying", "backoff"),
        ("old-polled", "poll"),
        ("old-done", "first"),
    ] {
        let job = ledger
            .show_job(&JobId::parse(job_id).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(job.next_attempt_cause, cause, "{job_id}");
        assert!(job.history.is_empty() && job.duplicates == 0, "{job_id}");
    }
    let due = ledger
        .due_jobs(
            &sume_receiver::route_name::RouteName::default_route(),
            3_000,
            10,
        )
        .await
        .unwrap();
    assert_eq!(due.runnable.len(), 2, "{:?}", due.runnable);
    let attempt = ledger
        .start_attempt(
            &JobId::parse("old-retrying").unwrap(),
            &sume_receiver::route_name::RouteName::default_route(),
            3_000,
            i64::MAX,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(attempt.number, 2);
    let job = ledger
        .show_job(&JobId::parse("old-retrying").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.history[0].cause, "backoff");
    let page = ledger.list_jobs(None, None, None, 10).await.unwrap();
    let ids: Vec<&str> = page.jobs.iter().map(|job| job.job_id.as_str()).collect();
    assert_eq!(ids, ["old-polled", "old-retrying", "old-done"]);
    ledger.close().await;
}

/// A ledger of schema 10 (work keyed by job_id) migrates to work keyed by the job's number:
/// every job keeps each of its routes' work, and a VACUUM afterwards (which renumbers a plain
/// rowid, and which a backup's VACUUM INTO does as well) leaves each route's work with its job.
#[tokio::test(flavor = "multi_thread")]
async fn a_schema_10_ledger_keeps_each_jobs_work_through_the_migration_and_a_vacuum() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    let path = sqlite_path(&config);
    let mut migrations: Vec<_> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
    migrations.sort();
    // A connection each: 0005 edits the schema in place, which a connection that read the
    // schema before does not see.
    for migration in &migrations[..10] {
        rusqlite::Connection::open(path)
            .unwrap()
            .execute_batch(&std::fs::read_to_string(migration).unwrap())
            .unwrap();
    }
    {
        let conn = rusqlite::Connection::open(path).unwrap();
        // Jobs with gaps between their rowids (the deleted ones), so that a VACUUM of a plain
        // rowid table would renumber those after the gaps.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             INSERT INTO jobs (job_id, state, body, received_at, next_attempt_at, updated_at)
             VALUES ('gone-1', 'claimed', '{}', 1, 1, 1), ('kept-a', 'claimed', '{}', 2, 2, 2),
                    ('gone-2', 'claimed', '{}', 3, 3, 3), ('kept-b', 'claimed', '{}', 4, 4, 4);
             INSERT INTO job_routes (job_id, route, state, next_attempt_at, updated_at)
             VALUES ('kept-a', 'default', 'claimed', 2, 2), ('kept-a', 'pager', 'claimed', 2, 2),
                    ('kept-b', 'archive', 'claimed', 4, 4);
             DELETE FROM jobs WHERE job_id LIKE 'gone-%';
             PRAGMA user_version = 10;",
        )
        .unwrap();
    }
    let ledger = Ledger::open(&config.database).await.unwrap();
    ledger.close().await;
    rusqlite::Connection::open(path)
        .unwrap()
        .execute_batch("VACUUM")
        .unwrap();

    let ledger = Ledger::open(&config.database).await.unwrap();
    let due_on = |route: &str| {
        let route = sume_receiver::route_name::RouteName::parse(route).unwrap();
        let ledger = &ledger;
        async move {
            let due = ledger.due_jobs(&route, 10, 10).await.unwrap();
            let ids: Vec<String> = due.runnable.iter().map(|id| id.to_string()).collect();
            ids
        }
    };
    assert_eq!(due_on("default").await, ["kept-a"]);
    assert_eq!(due_on("pager").await, ["kept-a"]);
    assert_eq!(due_on("archive").await, ["kept-b"]);
    let attempt = ledger
        .start_attempt(
            &JobId::parse("kept-b").unwrap(),
            &sume_receiver::route_name::RouteName::parse("archive").unwrap(),
            10,
            i64::MAX,
        )
        .await
        .unwrap()
        .expect("kept-b's archive work starts");
    assert_eq!(attempt.number, 1);
    // The trigger sums the job's own routes' work into its row, and no other job's.
    for (job_id, state) in [("kept-a", "claimed"), ("kept-b", "running")] {
        let job = ledger
            .show_job(&JobId::parse(job_id).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(job.summary.state, state, "{job_id}");
    }
    ledger.close().await;
}

/// Regression: a claim's future was 2.2 KB, sized by a path no delivery takes (the command
/// line's batch of one on PostgreSQL), and every delivery copied it several times over as it
/// was built and moved into place (about 37 KB of copies per delivery, 16 KB now). The rare
/// paths are boxed.
#[tokio::test(flavor = "multi_thread")]
async fn a_claims_future_is_small_whatever_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    let ledger = Ledger::open(&config.database).await.unwrap();
    let claimed = ledger.claim(claim("future-size".into()));
    let size = std::mem::size_of_val(&claimed);
    drop(claimed);
    ledger.close().await;
    assert!(size <= 512, "a claim's future takes {size} bytes");
}

/// The worker sleeps until woken when the ledger sees other processes' changes: a commit of
/// another connection (a `jobs retry` from the command line) wakes it, and an idle ledger,
/// whose own threads write nothing, does not.
#[tokio::test(flavor = "multi_thread")]
async fn another_connections_commit_is_seen_and_an_idle_ledger_stays_quiet() {
    let dir = tempfile::tempdir().unwrap();
    // Without the check after the start, whose connection closes when it ends.
    let text = config_text(dir.path(), "[database]\ncheck_at_start = \"off\"\n");
    let config = Config::parse(&text, dir.path()).unwrap();
    let ledger = Ledger::open(&config.database).await.unwrap();
    assert!(ledger.sees_work_added_elsewhere());
    let seen_now = || tokio::time::timeout(Duration::ZERO, ledger.work_added_elsewhere());
    // What the start itself wrote.
    while seen_now().await.is_ok() {}
    let idle = tokio::time::timeout(Duration::from_millis(300), ledger.work_added_elsewhere());
    assert!(idle.await.is_err(), "woken with nothing written");

    let cli = Ledger::open_existing(&config.database).await.unwrap();
    cli.set_dispatch(
        true,
        &ledger::Actor::because("cli:test", None),
        ledger::now_ms(),
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), ledger.work_added_elsewhere())
        .await
        .expect("the other connection's commit is seen");
    cli.close().await;
    ledger.close().await;
}
