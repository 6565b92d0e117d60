//! What only a PostgreSQL ledger has: its outages, several receivers, its schema checks.
//! Runs against the server in SUME_TEST_POSTGRES_URL (skipped with a message without it).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::relay::{server_of, Relay};
use common::*;
use sume_receiver::config::Config;
use sume_receiver::ledger::Ledger;

/// How PostgreSQL goes away in [`outage_under_load`].
enum Outage {
    /// Every connection cut mid-stream and new ones refused for 3 s, then back.
    Cut,
    /// The server itself restarted by this command (it waits for the restart).
    Restart(String),
}

/// Tests that need the server up for their whole run take this lock shared; a restart takes it
/// alone.
static SERVER_UP: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The command that restarts the test server, for the restart test: as root on Debian,
/// `pg_ctlcluster 15 main restart` (CI sets it; without it the test is skipped).
const RESTART_VARIABLE: &str = "SUME_TEST_POSTGRES_RESTART";

/// PostgreSQL goes away under load (connections cut mid-commit, new ones refused) and comes
/// back: the two receivers answer 503 with Retry-After meanwhile, never 2xx without a row, say
/// so on /readyz, and take deliveries again without a restart of their own.
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_outage_under_load_is_503_then_recovers_without_a_restart() {
    Backend::Postgres
        .run(
            "a_postgres_outage_under_load_is_503_then_recovers_without_a_restart",
            async {
                let _up = SERVER_UP.read().await;
                outage_under_load(Outage::Cut).await
            },
        )
        .await;
}

/// The same with the real server restarted (fast shutdown: it terminates every session).
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_restart_under_load_is_503_then_recovers_without_a_restart() {
    let Ok(command) = std::env::var(RESTART_VARIABLE) else {
        skip(
            "a_postgres_restart_under_load",
            &format!("set {RESTART_VARIABLE} to a command that restarts the test server"),
        );
        return;
    };
    Backend::Postgres
        .run(
            "a_postgres_restart_under_load_is_503_then_recovers_without_a_restart",
            async {
                let _alone = SERVER_UP.write().await;
                outage_under_load(Outage::Restart(command)).await
            },
        )
        .await;
}

async fn outage_under_load(outage: Outage) {
    let database = new_postgres_database();
    let server = server_of(&database);
    let relay = Relay::start(server.clone()).await;
    let relayed = database.replacen(&server, &format!("127.0.0.1:{}", relay.port), 1);
    let mut servers = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("postgres-url"), &relayed).unwrap();
        servers.push(Arc::new(
            TestServer::start_in(dir, "[server]\nclaim_timeout = \"2s\"\n").await,
        ));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let answers: Arc<Mutex<Vec<(String, u16, bool)>>> = Arc::default();
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..8 {
        let (stop, next, answers) = (stop.clone(), next.clone(), answers.clone());
        let server = servers[sender % 2].clone();
        senders.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let job_id = format!("outage-{}", next.fetch_add(1, Ordering::SeqCst));
                let answer = server.deliver(&job_body(&job_id)).await;
                let retry_after = answer.headers.get("retry-after").is_some();
                answers
                    .lock()
                    .unwrap()
                    .push((job_id, answer.status.as_u16(), retry_after));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    match &outage {
        Outage::Cut => {
            relay.cut();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for server in &servers {
                assert_eq!(
                    server.get_status("/readyz").await,
                    503,
                    "not ready while PostgreSQL is away"
                );
                assert_eq!(
                    server.get_status("/healthz").await,
                    200,
                    "alive all the same"
                );
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            relay.restore();
        }
        Outage::Restart(command) => {
            let command = command.clone();
            let restarted = tokio::task::spawn_blocking(move || {
                std::process::Command::new("sh")
                    .args(["-c", &command])
                    .status()
            })
            .await
            .unwrap()
            .unwrap();
            assert!(restarted.success(), "{restarted}");
        }
    }
    let recovered_at = answers.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    while senders.join_next().await.is_some() {}

    let answers = answers.lock().unwrap().clone();
    let refused: Vec<_> = answers
        .iter()
        .filter(|(_, status, _)| *status == 503)
        .collect();
    assert!(
        !refused.is_empty(),
        "no delivery was refused while PostgreSQL was away"
    );
    assert!(
        refused.iter().all(|(_, _, retry_after)| *retry_after),
        "a 503 without Retry-After"
    );
    assert!(
        answers
            .iter()
            .all(|(_, status, _)| matches!(status, 200 | 503)),
        "only 200 or 503: {:?}",
        answers
            .iter()
            .filter(|(_, s, _)| !matches!(s, 200 | 503))
            .collect::<Vec<_>>()
    );
    // Recovered without a restart: the last second of deliveries all claimed.
    let tail: Vec<_> = answers[recovered_at..].iter().rev().take(20).collect();
    assert!(
        tail.iter().all(|(_, status, _)| *status == 200),
        "still refused after PostgreSQL came back: {tail:?}"
    );
    for server in &servers {
        assert_eq!(server.get_status("/readyz").await, 200, "ready again");
    }
    // No 2xx without its row.
    let stored: std::collections::HashSet<String> = with_postgres(&database, |client| {
        client
            .query("SELECT job_id FROM jobs", &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    });
    let acknowledged: Vec<_> = answers
        .iter()
        .filter(|(_, status, _)| *status == 200)
        .collect();
    let missing: Vec<_> = acknowledged
        .iter()
        .filter(|(job_id, _, _)| !stored.contains(job_id))
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged without a row: {missing:?}"
    );
    println!(
        "{}: {} deliveries, {} claimed, {} refused (503) while PostgreSQL was away, 0 acknowledged without a row",
        match outage {
            Outage::Cut => "connections cut for 3 s",
            Outage::Restart(_) => "server restarted",
        },
        answers.len(),
        acknowledged.len(),
        refused.len()
    );
    for server in servers {
        Arc::into_inner(server).unwrap().stop().await.0.unwrap();
    }
}

/// A receiver started while PostgreSQL is not there yet (booting together, failing over) waits
/// for it instead of exiting, and serves as soon as it comes.
#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_started_before_postgres_waits_for_it() {
    Backend::Postgres
        .run("a_receiver_started_before_postgres_waits_for_it", async {
            let _up = SERVER_UP.read().await;
            let database = new_postgres_database();
            let server = server_of(&database);
            let relay = Relay::start(server.clone()).await;
            let relayed = database.replacen(&server, &format!("127.0.0.1:{}", relay.port), 1);
            relay.cut();
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("postgres-url"), &relayed).unwrap();
            let restore = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                relay.restore();
                relay
            });
            let started = std::time::Instant::now();
            let receiver = TestServer::start_in(dir, "").await;
            assert!(
                started.elapsed() >= Duration::from_millis(1400),
                "served before PostgreSQL came"
            );
            assert_eq!(
                receiver.deliver(&job_body("job-after-boot")).await.status,
                200
            );
            receiver.stop().await.0.unwrap();
            drop(restore.await.unwrap());
        })
        .await;
}

/// Receivers starting at once on a new database: the migrations run once, under the lock.
#[tokio::test(flavor = "multi_thread")]
async fn receivers_starting_together_migrate_once() {
    Backend::Postgres
        .run("receivers_starting_together_migrate_once", async {
            let _up = SERVER_UP.read().await;
            let dir = tempfile::tempdir().unwrap();
            let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
            let starts: Vec<_> = (0..4)
                .map(|_| {
                    let database = config.database.clone();
                    tokio::spawn(async move { Ledger::open(&database).await })
                })
                .collect();
            for start in starts {
                start.await.unwrap().unwrap().close().await;
            }
            let migrations =
                std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
                    .unwrap()
                    .count();
            assert_eq!(
                ledger_rows(&config, "SELECT version FROM sume_schema", &[]),
                [[serde_json::json!(migrations)]]
            );
        })
        .await;
}

/// A database whose schema is newer than this binary, or that acknowledges commits before they
/// are durable, is refused with the reason; neither is changed.
#[tokio::test(flavor = "multi_thread")]
async fn a_newer_schema_and_synchronous_commit_off_are_refused() {
    Backend::Postgres
        .run(
            "a_newer_schema_and_synchronous_commit_off_are_refused",
            async {
                let dir = tempfile::tempdir().unwrap();
                let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
                Ledger::open(&config.database).await.unwrap().close().await;
                ledger_execute(&config, "UPDATE sume_schema SET version = 99", &[]);
                let error = format!("{:#}", Ledger::open(&config.database).await.err().unwrap());
                assert!(error.contains("newer than this binary knows"), "{error}");
                let cli = std::process::Command::new(env!("CARGO_BIN_EXE_sume-receiver"))
                    .arg("--config")
                    .arg({
                        let path = dir.path().join("config.toml");
                        std::fs::write(&path, config_text(dir.path(), "")).unwrap();
                        path
                    })
                    .args(["jobs", "list"])
                    .output()
                    .unwrap();
                assert!(!cli.status.success());
                assert!(
                    String::from_utf8_lossy(&cli.stderr).contains("schema version 99"),
                    "{cli:?}"
                );

                let other = tempfile::tempdir().unwrap();
                let url = postgres_url_of(other.path());
                let name: postgres::Config = url.parse().unwrap();
                with_postgres(&url, |client| {
                    client
                        .batch_execute(&format!(
                            "ALTER DATABASE {} SET synchronous_commit = off",
                            name.get_dbname().unwrap()
                        ))
                        .unwrap()
                });
                let config = Config::parse(&config_text(other.path(), ""), other.path()).unwrap();
                let error = format!("{:#}", Ledger::open(&config.database).await.err().unwrap());
                assert!(error.contains("synchronous_commit = off"), "{error}");
            },
        )
        .await;
}

/// The claim and the start of a receiver of the release before routes (its SQL as it was,
/// minus the notification): what such a receiver still sends during a rolling upgrade.
const OLDER_RELEASE_CLAIM: &str = "INSERT INTO jobs (job_id, state, source, event_type, body,
        received_at, next_attempt_at, updated_at)
    SELECT job_id, 'claimed', source, event_type, body, $5, $5, $5
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
         AS claim (job_id, source, event_type, body)
    ON CONFLICT (job_id) DO NOTHING";
const OLDER_RELEASE_START: &str = "UPDATE jobs SET state = 'running', attempts = attempts + 1,
        lease_expires_at = $2, next_attempt_at = NULL, updated_at = $3, leased_by = $4
    WHERE job_id = $1 AND state IN ('claimed', 'retrying') AND body IS NOT NULL";

/// A rolling upgrade across the routes migration: once a receiver of this release has
/// migrated the database, one of the release before can neither claim (its delivery fails, so
/// Sume retries it, to a receiver of this release) nor start a job (which a receiver of this
/// release runs, once). Every job from before the migration belongs to the default route.
#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_of_the_release_before_routes_cannot_claim_nor_start_after_the_migration() {
    Backend::Postgres
        .run(
            "a_receiver_of_the_release_before_routes_cannot_claim_nor_start_after_the_migration",
            async {
                let dir = tempfile::tempdir().unwrap();
                let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
                let ledger = Ledger::open(&config.database).await.unwrap();
                let claim = sume_receiver::ledger::NewClaim {
                    job_id: sume_receiver::job_id::JobId::parse("new-1").unwrap(),
                    event_type: None,
                    body: "{}".into(),
                    source: sume_receiver::ledger::Source::Webhook,
                    routing: sume_receiver::ledger::Routing::default_route(),
                    trace_context: None,
                };
                ledger.claim(claim).await.unwrap();
                let url = postgres_url_of(dir.path());
                let (claimed, started) = with_postgres(&url, |client| {
                    let ids = vec!["old-1"];
                    let sources = vec!["webhook"];
                    let types: Vec<Option<&str>> = vec![None];
                    let bodies = vec!["{}"];
                    let claimed = client
                        .execute(
                            OLDER_RELEASE_CLAIM,
                            &[&ids, &sources, &types, &bodies, &1_000i64],
                        )
                        .map_err(|error| format!("{error:?}"));
                    let started = client
                        .execute(
                            OLDER_RELEASE_START,
                            &[&"new-1", &i64::MAX, &1_000i64, &"old-receiver"],
                        )
                        .map_err(|error| format!("{error:?}"));
                    (claimed, started)
                });
                let claimed = claimed.unwrap_err();
                assert!(claimed.contains("routed"), "{claimed}");
                let started = started.unwrap_err();
                assert!(started.contains("predates routes"), "{started}");
                let route = sume_receiver::route_name::RouteName::default_route();
                let job_id = sume_receiver::job_id::JobId::parse("new-1").unwrap();
                let attempt = ledger
                    .start_attempt(&job_id, &route, 2_000, i64::MAX)
                    .await
                    .unwrap()
                    .expect("this release starts it");
                assert_eq!(attempt.number, 1);
                ledger.close().await;
            },
        )
        .await;
}

/// The URL may come from a file (the password kept out of the config file), not both ways.
#[tokio::test(flavor = "multi_thread")]
async fn the_database_url_may_come_from_a_file() {
    Backend::Postgres
        .run("the_database_url_may_come_from_a_file", async {
            let _up = SERVER_UP.read().await;
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(
                dir.path().join("database-url"),
                format!("{}\n", new_postgres_database()),
            )
            .unwrap();
            let text = "[signature]\nsecrets = [\"s\"]\n[database]\nurl_file = \"database-url\"\n";
            let config = Config::parse(text, dir.path()).unwrap();
            Ledger::open(&config.database).await.unwrap().close().await;

            std::fs::remove_file(dir.path().join("database-url")).unwrap();
            let error = format!("{:#}", Ledger::open(&config.database).await.err().unwrap());
            assert!(error.contains("database.url_file: cannot read"), "{error}");
            let both = Config::parse(&format!("{text}url = \"postgres://u@h/d\"\n"), dir.path());
            assert!(format!("{:#}", both.err().unwrap()).contains("not both"));
        })
        .await;
}

/// With `sslmode=require` the connections are encrypted and the server's certificate is
/// verified: against `database.ca_file` it is accepted, against the system's CAs alone (which
/// did not sign it) refused. SUME_TEST_POSTGRES_CA names the CA of the test server's
/// certificate for "localhost" (CI makes one; without it the test is skipped).
#[tokio::test(flavor = "multi_thread")]
async fn tls_is_used_and_verified_when_the_url_requires_it() {
    let Ok(ca) = std::env::var("SUME_TEST_POSTGRES_CA") else {
        skip(
            "tls_is_used_and_verified_when_the_url_requires_it",
            "set SUME_TEST_POSTGRES_CA to the CA of the test server's certificate for localhost",
        );
        return;
    };
    Backend::Postgres
        .run("tls_is_used_and_verified_when_the_url_requires_it", async {
            let _up = SERVER_UP.read().await;
            let database = new_postgres_database();
            let server = server_of(&database);
            let port = server.rsplit(':').next().unwrap();
            let tls_url = format!(
                "{}?sslmode=require",
                database.replacen(&server, &format!("localhost:{port}"), 1)
            );
            let dir = tempfile::tempdir().unwrap();
            let text = |ca_line: &str| {
                format!(
                    "[signature]\nsecrets = [\"s\"]\n[database]\nurl = \"{tls_url}\"\n{ca_line}"
                )
            };
            let config =
                Config::parse(&text(&format!("ca_file = \"{ca}\"\n")), dir.path()).unwrap();
            let ledger = Ledger::open(&config.database).await.unwrap();
            ledger.probe().await.unwrap(); // a pooled connection, open now
            let encrypted = with_postgres(&database, |client| {
                client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
                         WHERE datname = current_database() AND pid <> pg_backend_pid() AND ssl",
                        &[],
                    )
                    .unwrap()
                    .get::<_, i64>(0)
            });
            assert!(encrypted >= 1, "the ledger's connections are encrypted");
            ledger.close().await;

            let unverified = Config::parse(&text(""), dir.path()).unwrap();
            let error = format!(
                "{:#}",
                Ledger::open(&unverified.database).await.err().unwrap()
            );
            assert!(error.contains("certificate"), "{error}");
        })
        .await;
}

/// A job claimed on one receiver starts on another at once: the claim's NOTIFY wakes it (its
/// own look into the ledger would come only every second). Receiver A has no handler, so only
/// B can run the jobs.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_on_one_receiver_wakes_the_workers_of_the_others() {
    Backend::Postgres
        .run(
            "a_claim_on_one_receiver_wakes_the_workers_of_the_others",
            async {
                let _up = SERVER_UP.read().await;
                let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
                let runs = dir_b.path().join("runs.log");
                std::fs::write(
                    dir_b.path().join("postgres-url"),
                    postgres_url_of(dir_a.path()),
                )
                .unwrap();
                let claimer = TestServer::start_in(dir_a, "[sweeper]\ninterval = \"1h\"\n").await;
                let handler = format!(
                    "[handler]\ncommand = [\"sh\", \"-c\", {:?}]\n\n[sweeper]\ninterval = \"1h\"\n",
                    format!("echo \"$SUME_JOB_ID\" >> {}", runs.display())
                );
                let runner = TestServer::start_in(dir_b, &handler).await;
                // Let the runner's worker settle into its idle wait.
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let mut delays = Vec::new();
                for i in 0..5 {
                    let job_id = format!("woken-{i}");
                    let claimed = std::time::Instant::now();
                    assert_eq!(claimer.deliver(&job_body(&job_id)).await.status, 200);
                    let ran = eventually(Duration::from_secs(5), || {
                        std::fs::read_to_string(&runs)
                            .unwrap_or_default()
                            .contains(&job_id)
                    })
                    .await;
                    assert!(ran, "{job_id} never ran on the other receiver");
                    delays.push(claimed.elapsed());
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(200..700))).await;
                }
                delays.sort();
                assert!(
                delays[2] < Duration::from_millis(300),
                "claim -> start on the other receiver: {delays:?} (polling alone: ~500 ms median)"
            );
                claimer.stop().await.0.unwrap();
                runner.stop().await.0.unwrap();
            },
        )
        .await;
}

/// Two receivers' retention runs at the same moment on one database: every old row is removed
/// once, and the counts add up (each batch takes its rows with SKIP LOCKED).
#[tokio::test(flavor = "multi_thread")]
async fn retention_on_two_receivers_at_once_removes_each_row_once() {
    Backend::Postgres
        .run(
            "retention_on_two_receivers_at_once_removes_each_row_once",
            async {
                let _up = SERVER_UP.read().await;
                let dir = tempfile::tempdir().unwrap();
                let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
                let (first, second) = (
                    Ledger::open(&config.database).await.unwrap(),
                    Ledger::open(&config.database).await.unwrap(),
                );
                let long_ago = sume_receiver::ledger::now_ms() - 400 * 86_400_000;
                insert_jobs(
                    &config,
                    (0..5000)
                        .map(|i| (format!("old-{i}"), "done", "{}".to_owned(), Some(long_ago))),
                );
                let retention = sume_receiver::config::RetentionConfig {
                    ttl: Duration::from_secs(30 * 86_400),
                    dedupe_ttl: Duration::from_secs(365 * 86_400),
                    interval: Duration::from_secs(3600),
                };
                let run = |ledger: std::sync::Arc<Ledger>| {
                    let retention = retention.clone();
                    tokio::spawn(async move {
                        sume_receiver::vacuum::Vacuum::new(
                            ledger,
                            retention,
                            tokio_util::sync::CancellationToken::new(),
                        )
                        .vacuum_once()
                        .await
                        .unwrap()
                    })
                };
                let (a, b) = (run(first.clone()), run(second.clone()));
                let (a, b) = (a.await.unwrap(), b.await.unwrap());
                // (One run may delete rows before the other purged their bodies: only the rows
                // removed add up exactly.)
                assert_eq!(a.jobs_forgotten + b.jobs_forgotten, 5000, "{a:?} {b:?}");
                assert_eq!(
                    ledger_rows(&config, "SELECT count(*) FROM jobs", &[]),
                    [[serde_json::json!(0)]]
                );
                first.close().await;
                second.close().await;
            },
        )
        .await;
}

/// The service's reads (console pages, scrapes) run on read-only connections whose statements
/// the server cancels past their budget, as SQLite's are cut: a console page can neither
/// write nor hold a connection for long.
#[tokio::test(flavor = "multi_thread")]
async fn service_reads_cannot_write_and_are_cut_at_their_budget() {
    Backend::Postgres
        .run(
            "service_reads_cannot_write_and_are_cut_at_their_budget",
            async {
                let _up = SERVER_UP.read().await;
                let dir = tempfile::tempdir().unwrap();
                let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
                let ledger = Ledger::open(&config.database).await.unwrap();
                let postgres = ledger.postgres().expect("a PostgreSQL ledger");
                let write = postgres
                    .read_for_test("DELETE FROM jobs")
                    .await
                    .unwrap_err();
                assert!(
                    write.to_string().contains("read-only transaction"),
                    "{write}"
                );
                let started = std::time::Instant::now();
                let endless = postgres
                    .read_for_test("SELECT pg_sleep(30)")
                    .await
                    .unwrap_err();
                assert!(
                    endless.to_string().contains("statement timeout"),
                    "{endless}"
                );
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "{:?}",
                    started.elapsed()
                );
                let rows = postgres
                    .read_for_test("SELECT count(*) FROM jobs")
                    .await
                    .unwrap();
                assert_eq!(
                    rows[0].get::<_, i64>(0),
                    0,
                    "the connection is good for the next read"
                );
                ledger.close().await;
            },
        )
        .await;
}

/// Each server process keeps its own rows of the counts by state, so two receivers never wait
/// on each other's count rows; the rows of a process that has ended are folded into owner 0
/// by retention, and the sums do not move.
#[tokio::test(flavor = "multi_thread")]
async fn the_counts_of_ended_sessions_are_folded_and_the_sums_kept() {
    Backend::Postgres
        .run(
            "the_counts_of_ended_sessions_are_folded_and_the_sums_kept",
            async {
                let _up = SERVER_UP.read().await;
                let dir = tempfile::tempdir().unwrap();
                let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
                let (first, second) = (
                    Ledger::open(&config.database).await.unwrap(),
                    Ledger::open(&config.database).await.unwrap(),
                );
                insert_jobs(
                    &config,
                    (0..30).map(|i| (format!("fold-{i}"), "done", "{}".to_owned(), Some(1_000))),
                );
                for (ledger, job_id) in [(&first, "fold-first"), (&second, "fold-second")] {
                    let claim = sume_receiver::ledger::NewClaim {
                        job_id: sume_receiver::job_id::JobId::parse(job_id).unwrap(),
                        event_type: None,
                        body: job_body(job_id).into(),
                        source: sume_receiver::ledger::Source::Webhook,
                        trace_context: None,
                        routing: sume_receiver::ledger::Routing::default_route(),
                    };
                    ledger.claim(claim).await.unwrap();
                }
                // A process that ended (no live server process has this pid) left 7 done.
                ledger_execute(
                    &config,
                    "INSERT INTO job_counts (state, owner, jobs) VALUES ('done', 2147483000, 7)",
                    &[],
                );
                let count_rows = || {
                    ledger_rows(
                        &config,
                        "SELECT count(*) FROM job_counts WHERE owner <> 0",
                        &[],
                    )
                };
                let before = first
                    .job_stats(sume_receiver::ledger::now_ms())
                    .await
                    .unwrap();
                assert_eq!(before.by_state["done"], 37);
                assert_eq!(before.by_state["claimed"], 2);
                let owners_before = count_rows();
                first.fold_counts().await.unwrap();
                let after = second
                    .job_stats(sume_receiver::ledger::now_ms())
                    .await
                    .unwrap();
                assert_eq!(after.by_state, before.by_state);
                assert_eq!(
                    ledger_rows(
                        &config,
                        "SELECT count(*) FROM job_counts WHERE owner = 2147483000",
                        &[]
                    ),
                    [[serde_json::json!(0)]]
                );
                assert_ne!(
                    count_rows(),
                    owners_before,
                    "the ended process's row was folded"
                );
                first.close().await;
                second.close().await;
            },
        )
        .await;
}

/// An expectation due for a poll is handed to one receiver only: taking it moves its next poll
/// a lease ahead, so another receiver looking at the same moment finds nothing due; after the
/// lease (the first receiver died while polling) it is due again.
#[tokio::test(flavor = "multi_thread")]
async fn a_due_expectation_is_polled_by_one_receiver_at_a_time() {
    Backend::Postgres
        .run(
            "a_due_expectation_is_polled_by_one_receiver_at_a_time",
            async {
                let _up = SERVER_UP.read().await;
                let dir = tempfile::tempdir().unwrap();
                let config = Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
                let (first, second) = (
                    Ledger::open(&config.database).await.unwrap(),
                    Ledger::open(&config.database).await.unwrap(),
                );
                let now = sume_receiver::ledger::now_ms();
                let job_id = sume_receiver::job_id::JobId::parse("job-expected").unwrap();
                assert!(first.expect_job(&job_id, now - 10, now - 5).await.unwrap());
                let lease = Duration::from_millis(500);
                let taken = first.due_expectations(now, 10, lease).await.unwrap();
                assert_eq!(taken.len(), 1);
                assert!(second
                    .due_expectations(now, 10, lease)
                    .await
                    .unwrap()
                    .is_empty());
                let after_lease = now + 600;
                let again = second
                    .due_expectations(after_lease, 10, lease)
                    .await
                    .unwrap();
                assert_eq!(again.len(), 1, "due again once the lease is over");
                first.close().await;
                second.close().await;
            },
        )
        .await;
}

/// The password of database.url never shows in logs or messages about the ledger.
#[test]
fn the_database_password_never_shows() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[signature]\nsecrets = [\"s3cret-signing\"]\n[database]\n\
                url = \"postgres://sume:hunter2@db.internal:6432/ledger\"\n";
    let config = Config::parse(text, dir.path()).unwrap();
    let shown = format!("{:?}", config.database);
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        shown.contains("postgres://db.internal:6432/ledger"),
        "{shown}"
    );
    let bad = Config::parse(
        "[signature]\nsecrets = [\"s\"]\n[database]\nurl = \"postgres://sume:hunter2@/\"\n",
        dir.path(),
    );
    let error = format!("{:#}", bad.err().unwrap());
    assert!(
        error.contains("database.url") && !error.contains("hunter2"),
        "{error}"
    );
}

/// The cluster whose commits wait for a synchronous standby that never comes (CI's second
/// cluster, made by .ci/start-postgres); its role is a superuser.
const ABSENT_STANDBY_VARIABLE: &str = "SUME_TEST_POSTGRES_ABSENT_STANDBY_URL";

/// `url` with `synchronous_commit = local` for the session: waits for no standby.
fn without_standby_wait(url: &str) -> String {
    format!("{url}?options=-c%20synchronous_commit%3Dlocal")
}

/// The pid of the backend whose commit waits for the standby in database `name`, if one does
/// within 5 s.
fn waiting_for_the_standby(admin: &str, name: &str) -> Option<i32> {
    with_postgres(admin, |client| {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            let waiting = client
                .query_opt(
                    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'SyncRep'",
                    &[&name],
                )
                .unwrap();
            if let Some(row) = waiting {
                return Some(row.get::<_, i32>(0));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    })
}

/// A database of its own on the cluster whose synchronous standby is absent, and the
/// cluster to itself: a test there changes its settings (fsync).
struct AbsentStandby {
    _alone: tokio::sync::MutexGuard<'static, ()>,
    /// The cluster's superuser, its commits waiting for no standby.
    admin: String,
    name: String,
    /// The database's: its commits wait for the standby, for ever.
    url: String,
}

/// A new database on the absent-standby cluster; `None`, the test listed as skipped, if
/// there is none.
async fn absent_standby_database(test: &str) -> Option<AbsentStandby> {
    static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let Ok(admin) = std::env::var(ABSENT_STANDBY_VARIABLE) else {
        skip(
            test,
            &format!("set {ABSENT_STANDBY_VARIABLE} to a server whose synchronous standby is absent (.ci/start-postgres makes one)"),
        );
        return None;
    };
    let name = format!("sume_standby_{}_{}", std::process::id(), fastrand::u32(..));
    let mut parsed: postgres::Config = admin.parse().unwrap();
    let admin = without_standby_wait(&admin);
    with_postgres(&admin, |client| {
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap()
    });
    parsed.dbname(&name);
    let url = postgres_url(&parsed);
    Some(AbsentStandby {
        _alone: CLUSTER.lock().await,
        admin,
        name,
        url,
    })
}

/// Ends the sessions left waiting for the standby: a commit waiting there keeps the cluster's
/// lock on NOTIFY, and every other database's claims would wait behind it.
impl Drop for AbsentStandby {
    fn drop(&mut self) {
        with_postgres(&self.admin, |client| {
            client
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                    &[&self.name],
                )
                .map(drop)
        })
        .unwrap_or_else(|error| eprintln!("could not end the sessions of {}: {error}", self.name));
    }
}

fn config_of(dir: &std::path::Path, url: &str) -> Config {
    Config::parse(
        &config_text(dir, &format!("[database]\nurl = \"{url}\"\n")),
        dir,
    )
    .unwrap()
}

/// Regression (the failover suite under load, a read-only flip while the standby was
/// promoted): a commit waiting for a synchronous standby that never answers held its
/// connection, and its batch slot, for ever; with both slots taken every later claim of the
/// receiver was refused until a restart. Now the statement is given up after its budget, its
/// outcome unknown, and the connection with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_the_standby_never_answers_is_given_up_with_its_connection() {
    let Some(standby) = absent_standby_database(
        "a_commit_the_standby_never_answers_is_given_up_with_its_connection",
    )
    .await
    else {
        return;
    };
    let url = &standby.url;
    let dir = tempfile::tempdir().unwrap();
    // The schema, made without waiting for the standby (a migration commits too).
    Ledger::open(&config_of(dir.path(), &without_standby_wait(url)).database)
        .await
        .unwrap()
        .close()
        .await;
    let ledger = Ledger::open(&config_of(dir.path(), url).database)
        .await
        .unwrap();
    // Two claims, one after the other: the second's batch is answered only once the first's
    // slot was given back, or the two batch slots were free.
    for job_id in ["unanswered-1", "unanswered-2"] {
        let claim = sume_receiver::ledger::NewClaim {
            job_id: sume_receiver::job_id::JobId::parse(job_id).unwrap(),
            event_type: None,
            body: job_body(job_id).into(),
            source: sume_receiver::ledger::Source::Webhook,
            trace_context: None,
            routing: sume_receiver::ledger::Routing::default_route(),
        };
        let answered = tokio::time::timeout(Duration::from_secs(30), ledger.claim(claim))
            .await
            .unwrap_or_else(|_| panic!("{job_id}: no answer in 30 s"));
        let error = answered.expect_err("committed without the standby");
        assert!(
            matches!(
                error,
                sume_receiver::ledger::StorageError::OutcomeUnknown(_)
            ),
            "{job_id}: {error}"
        );
        assert!(error.to_string().contains("did not answer"), "{error}");
    }
    ledger.close().await;
}

/// With a synchronous standby: a claim whose wait for it is cancelled (PostgreSQL then commits
/// locally and reports success, with a WARNING) or terminated is never answered 200, nor is
/// Sume's retry of it before the standby has it (regression: the cancel was 200, and the retry
/// "200 duplicate" in 6 ms, a batch that inserted nothing waiting for nothing). Also: fsync =
/// off is refused at start.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_is_never_200_before_the_synchronous_standby_has_it() {
    let Some(standby) =
        absent_standby_database("a_claim_is_never_200_before_the_synchronous_standby_has_it").await
    else {
        return;
    };
    let (admin, name, url) = (&standby.admin, &standby.name, &standby.url);
    let dir = tempfile::tempdir().unwrap();
    let config_for = |url: &str| config_of(dir.path(), url);

    // fsync = off: refused, with the reason.
    let set_fsync = |value: &str| {
        with_postgres(admin, |client| {
            client
                .batch_execute(&format!("ALTER SYSTEM SET fsync = {value}"))
                .unwrap();
            client.batch_execute("SELECT pg_reload_conf()").unwrap()
        });
        std::thread::sleep(Duration::from_millis(300));
    };
    set_fsync("off");
    let refused = Ledger::open(&config_for(&without_standby_wait(url)).database).await;
    set_fsync("on");
    let error = format!("{:#}", refused.err().expect("fsync = off was accepted"));
    assert!(error.contains("fsync = off"), "{error}");

    // The schema, made without waiting for the standby (a migration commits too).
    let ledger = Ledger::open(&config_for(&without_standby_wait(url)).database)
        .await
        .unwrap();
    ledger.close().await;
    let server = TestServer::start_in(dir, &format!("[database]\nurl = \"{url}\"\n")).await;
    let deliver_in_background = |job_id: &str| {
        let (addr, body) = (server.addr, job_body(job_id));
        tokio::spawn(async move {
            let timestamp = unix_now().to_string();
            let request = hyper::Request::post(format!("http://{addr}{WEBHOOK_PATH}"))
                .header(sume_receiver::ingest::TIMESTAMP_HEADER, &timestamp)
                .header(
                    sume_receiver::ingest::SIGNATURE_HEADER,
                    sume_receiver::signature::sign(&[SECRET], &timestamp, body.as_bytes()),
                )
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap();
            let client = sume_receiver::http_client::new_client();
            sume_receiver::http_client::send(&client, request, Duration::from_secs(15), 4096)
                .await
                .unwrap()
                .status
                .as_u16()
        })
    };
    let rows = |job_id: &str| {
        with_postgres(&without_standby_wait(url), |client| {
            client
                .query_one("SELECT count(*) FROM jobs WHERE job_id = $1", &[&job_id])
                .unwrap()
                .get::<_, i64>(0)
        })
    };

    for (job_id, stop) in [
        ("cancelled", "pg_cancel_backend"),
        ("terminated", "pg_terminate_backend"),
    ] {
        let delivery = deliver_in_background(job_id);
        let pid = tokio::task::block_in_place(|| waiting_for_the_standby(admin, name))
            .expect("the claim's commit waits for the standby");
        with_postgres(admin, |client| {
            client
                .execute(&format!("SELECT {stop}($1)"), &[&pid])
                .unwrap()
        });
        let status = delivery.await.unwrap();
        assert_eq!(
            status, 503,
            "{job_id}: answered {status} though the standby may not have it"
        );
        assert_eq!(
            rows(job_id),
            1,
            "{job_id}: committed locally, as PostgreSQL does"
        );

        // Sume's retry finds the row: it too must wait for the standby.
        let retry = deliver_in_background(job_id);
        let Some(pid) = tokio::task::block_in_place(|| waiting_for_the_standby(admin, name)) else {
            let status = retry.await.unwrap();
            panic!("{job_id}: the retry did not wait for the standby: answered {status}");
        };
        with_postgres(admin, |client| {
            client
                .execute("SELECT pg_cancel_backend($1)", &[&pid])
                .unwrap()
        });
        let status = retry.await.unwrap();
        assert_eq!(status, 503, "{job_id}: the retry was answered {status}");
    }

    // synchronous_commit is held on every connection: a database setting made later (and
    // new connections, after these are terminated) do not take the wait away.
    with_postgres(admin, |client| {
        client
            .batch_execute(&format!(
                "ALTER DATABASE {name} SET synchronous_commit = local;
                 SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            ))
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let delivery = deliver_in_background("after-alter-database");
    let Some(pid) = tokio::task::block_in_place(|| waiting_for_the_standby(admin, name)) else {
        let status = delivery.await.unwrap();
        panic!("a new connection took the database's synchronous_commit: answered {status}");
    };
    with_postgres(admin, |client| {
        client
            .execute("SELECT pg_cancel_backend($1)", &[&pid])
            .unwrap()
    });
    assert_eq!(delivery.await.unwrap(), 503);
    let (result, _dir) = server.stop().await;
    result.unwrap();
}

/// Regression: one row PostgreSQL cannot store (a NUL in a signed body's `type` did it, before
/// ingest refused such types) failed every claim of its batch: 3,043 of 15,779 unrelated
/// deliveries got 503 in 4 s. Now only that row fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_postgres_refuses_fails_only_its_own_claim() {
    Backend::Postgres
        .run("a_row_postgres_refuses_fails_only_its_own_claim", async {
            let dir = tempfile::tempdir().unwrap();
            let (_config, ledger) = open_ledger(dir.path()).await;
            let claim = |job_id: String, body: String| sume_receiver::ledger::NewClaim {
                job_id: sume_receiver::job_id::JobId::parse(&job_id).unwrap(),
                event_type: None,
                body: body.into(),
                source: sume_receiver::ledger::Source::Webhook,
                trace_context: None,
                routing: sume_receiver::ledger::Routing::default_route(),
            };
            for round in 0..5 {
                let mut claims = tokio::task::JoinSet::new();
                for i in 0..64 {
                    let ledger = ledger.clone();
                    let job_id = format!("r{round}-{i}");
                    // A text PostgreSQL cannot hold: the ledger itself does not check bodies.
                    let body = if i == 32 {
                        "{\"x\":\"\0\"}".to_owned()
                    } else {
                        job_body(&job_id)
                    };
                    let claim = claim(job_id.clone(), body);
                    claims.spawn(async move { (job_id, ledger.claim(claim).await) });
                }
                let mut failed = Vec::new();
                while let Some(done) = claims.join_next().await {
                    let (job_id, outcome) = done.unwrap();
                    match outcome {
                        Ok(outcome) => {
                            assert_eq!(outcome, sume_receiver::ledger::ClaimOutcome::Claimed)
                        }
                        Err(_) => failed.push(job_id),
                    }
                }
                assert_eq!(failed, [format!("r{round}-32")], "round {round}");
            }
            ledger.close().await;
        })
        .await;
}
