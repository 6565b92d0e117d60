//! Readiness at rest: with no delivery arriving, `/readyz` and the ledger's gauges follow the ledger.
//! A lock another process held (SQLite), a blip, a stopped server and a read-only flip
//! (PostgreSQL, against the server in SUME_TEST_POSTGRES_URL through a relay the test cuts;
//! skipped with a message without it). Each case prints its seconds to ready and to not ready.

mod common;

use std::time::{Duration, Instant};

use common::relay::{server_of, Relay};
use common::sqlite_shell::SqliteShell;
use common::*;

/// How soon readiness follows the ledger with no delivery, asked as a load balancer asks
/// (every 250 ms): a probe at most once a second, which gives up after 2 s (docs/operating.md).
const BOUND: Duration = Duration::from_secs(4);

/// Asks `/readyz` every 250 ms until it answers `status`: the seconds that took, or `None`
/// after `within`.
async fn seconds_until_readyz(server: &TestServer, status: u16, within: Duration) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < within {
        if server.get_status("/readyz").await == status {
            return Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// The value of an unlabelled gauge in a scrape.
fn gauge(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in the scrape:\n{scrape}"))
        .parse()
        .unwrap()
}

/// SQLite: the `sqlite3` shell takes the write lock with no delivery arriving: not ready within
/// `busy_timeout` and the bound; a delivery meanwhile waits `busy_timeout` and gets 503. The
/// shell lets go: ready again within the bound with no write to prove it (before: not ready
/// until some write committed), and the next delivery is claimed.
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_readiness_follows_a_lock_another_process_holds_with_no_delivery() {
    let server = TestServer::start("[database]\nbusy_timeout = \"1s\"\n").await;
    assert_eq!(server.get_status("/readyz").await, 200);
    let shell = SqliteShell::holding_the_write_lock(&server.db_path());
    let to_not_ready = seconds_until_readyz(&server, 503, Duration::from_secs(1) + BOUND)
        .await
        .expect("still ready while another process held the write lock past busy_timeout");
    assert_eq!(gauge(&server.metrics().await, "sume_ready"), 0.0);
    assert_eq!(server.deliver(&job_body("while-held")).await.status, 503);
    shell.let_go();
    let to_ready = seconds_until_readyz(&server, 200, BOUND)
        .await
        .expect("still not ready after the shell let go of the lock, with no delivery");
    assert_eq!(gauge(&server.metrics().await, "sume_ready"), 1.0);
    assert_eq!(server.deliver(&job_body("after")).await.status, 200);
    println!(
        "SQLite, the shell's lock: not ready {to_not_ready:.1} s after it was taken \
         (busy_timeout 1 s), ready {to_ready:.1} s after it was let go, no delivery"
    );
    server.stop().await.0.unwrap();
}

/// A receiver on PostgreSQL through a relay the test can cut.
async fn behind_a_relay() -> (TestServer, Relay, String) {
    let database = new_postgres_database();
    let server = server_of(&database);
    let relay = Relay::start(server.clone()).await;
    let relayed = database.replacen(&server, &format!("127.0.0.1:{}", relay.port), 1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("postgres-url"), &relayed).unwrap();
    let receiver = TestServer::start_in(dir, "[server]\nclaim_timeout = \"2s\"\n").await;
    assert_eq!(receiver.get_status("/readyz").await, 200);
    (receiver, relay, database)
}

/// PostgreSQL blips while one delivery arrives, which is refused; then nothing arrives. Ready
/// again within the bound after the server is back (before: not ready until the next
/// delivery, which a balancer following `/readyz` never sends).
#[tokio::test(flavor = "multi_thread")]
async fn postgres_ready_again_after_a_blip_that_refused_one_claim() {
    Backend::Postgres
        .run("postgres_ready_again_after_a_blip", async {
            let (server, relay, _) = behind_a_relay().await;
            relay.cut();
            assert_eq!(server.deliver(&job_body("in-the-blip")).await.status, 503);
            relay.restore();
            let to_ready = seconds_until_readyz(&server, 200, BOUND)
                .await
                .expect("still not ready after PostgreSQL came back, with no delivery");
            assert_eq!(gauge(&server.metrics().await, "sume_ready"), 1.0);
            assert_eq!(server.deliver(&job_body("after")).await.status, 200);
            println!("PostgreSQL blip, one claim refused: ready {to_ready:.1} s after it came back, no delivery");
            server.stop().await.0.unwrap();
        })
        .await;
}

/// PostgreSQL stops with no delivery arriving: not ready within the bound, and `sume_ready`
/// agrees with `sume_ledger_reachable` (before: ready until a delivery was refused); back,
/// ready within the bound.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_stopped_with_no_delivery_is_not_ready() {
    Backend::Postgres
        .run("postgres_stopped_with_no_delivery_is_not_ready", async {
            let (server, relay, _) = behind_a_relay().await;
            relay.cut();
            let to_not_ready = seconds_until_readyz(&server, 503, BOUND)
                .await
                .expect("still ready with PostgreSQL stopped");
            let scrape = server.metrics().await;
            assert_eq!(gauge(&scrape, "sume_ready"), 0.0, "{scrape}");
            assert_eq!(gauge(&scrape, "sume_ledger_reachable"), 0.0, "{scrape}");
            relay.restore();
            let to_ready = seconds_until_readyz(&server, 200, BOUND)
                .await
                .expect("not ready after PostgreSQL came back");
            let scrape = server.metrics().await;
            assert_eq!(gauge(&scrape, "sume_ready"), 1.0, "{scrape}");
            assert_eq!(gauge(&scrape, "sume_ledger_reachable"), 1.0, "{scrape}");
            println!(
                "PostgreSQL stopped, no delivery: not ready {to_not_ready:.1} s after, \
                 ready {to_ready:.1} s after it came back"
            );
            server.stop().await.0.unwrap();
        })
        .await;
}

/// The database flips read-only (a managed failover's `default_transaction_read_only`): the
/// ledger is still reachable and its gauges still read (the oldest due job's wait goes on
/// growing), while the receiver is not ready (it cannot claim). Before: unreachable, the due
/// job's wait read 0.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_read_only_is_reachable_but_not_ready() {
    Backend::Postgres
        .run("postgres_read_only_is_reachable_but_not_ready", async {
            let (server, relay, database) = behind_a_relay().await;
            // A job that waits (no handler): its wait is what the gauge shows.
            assert_eq!(server.deliver(&job_body("waiting")).await.status, 200);
            let name = database.rsplit('/').next().unwrap().to_owned();
            with_postgres(&database, |client| {
                client
                    .batch_execute(&format!(
                        "ALTER DATABASE {name} SET default_transaction_read_only = on"
                    ))
                    .unwrap()
            });
            // Every session ends, as in a failover; the new ones are read-only.
            relay.cut();
            relay.restore();
            let to_not_ready = seconds_until_readyz(&server, 503, BOUND)
                .await
                .expect("ready on a read-only server");
            tokio::time::sleep(Duration::from_secs(1)).await;
            let scrape = server.metrics().await;
            assert_eq!(gauge(&scrape, "sume_ledger_reachable"), 1.0, "{scrape}");
            assert_eq!(gauge(&scrape, "sume_ready"), 0.0, "{scrape}");
            assert!(
                gauge(&scrape, "sume_oldest_due_job_wait_seconds") >= 1.0,
                "{scrape}"
            );
            assert_eq!(
                gauge(&scrape, "sume_jobs{state=\"claimed\"}"),
                1.0,
                "{scrape}"
            );
            println!(
                "PostgreSQL read-only: not ready {to_not_ready:.1} s after, reachable, gauges read"
            );
            server.stop().await.0.unwrap();
        })
        .await;
}

/// The size of the ledger's WAL file.
fn wal_bytes(server: &TestServer) -> u64 {
    let mut wal = server.db_path().into_os_string();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |wal| wal.len())
}

/// SQLite: a reader (the `sqlite3` shell in a read transaction, as a backup) keeps the WAL from
/// being copied back while 300 MiB are written; it goes, and nothing is written after: the WAL
/// is truncated within the bound (before: it kept its 300 MiB until the next write).
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_the_wal_shrinks_at_rest_after_the_reader_that_held_it_goes() {
    let server = TestServer::start("").await;
    let reader = SqliteShell::run(&server.db_path(), "BEGIN; SELECT count(*) FROM jobs;\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 300 MiB through the WAL, past the writer's 256 MiB limit, then a claim of the
    // receiver's own (its checkpointer wakes after its own commits).
    let db = server.db();
    db.execute_batch(
        "CREATE TABLE scratch (b);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
         INSERT INTO scratch SELECT zeroblob(1048576) FROM n;
         DROP TABLE scratch;",
    )
    .unwrap();
    drop(db);
    assert_eq!(
        server.deliver(&job_body("after-the-load")).await.status,
        200
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = wal_bytes(&server);
    assert!(held > 256 << 20, "the WAL did not grow: {held} bytes");
    reader.let_go();
    let started = Instant::now();
    let shrunk = eventually(BOUND, || wal_bytes(&server) <= 256 << 20).await;
    let after = wal_bytes(&server);
    assert!(
        shrunk,
        "the WAL kept {after} bytes for {BOUND:?} after the reader went, with no write"
    );
    println!(
        "SQLite WAL after a reader: {} MiB while held, {} MiB {:.1} s after it went, no write",
        held >> 20,
        after >> 20,
        started.elapsed().as_secs_f64()
    );
    server.stop().await.0.unwrap();
}
