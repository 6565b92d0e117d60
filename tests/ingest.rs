//! The request path against the real server: verify -> claim -> answer.

mod common;

use std::time::{Duration, Instant};

use common::sqlite_shell::SqliteShell;
use common::*;
use hyper::Method;
use sume_receiver::config::Credentials;
use sume_receiver::ingest::{SIGNATURE_HEADER, TIMESTAMP_HEADER};
use sume_receiver::signature;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread")]
async fn a_locked_database_gets_503_in_time_then_200_once_released() {
    let server = TestServer::start("[database]\nbusy_timeout = \"1s\"\n").await;
    let blocker = server.db();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    let started = Instant::now();
    let answer = server.deliver(&job_body("job-locked")).await;
    assert_eq!(answer.status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(answer.headers.get("retry-after").unwrap(), "5");

    blocker.execute_batch("COMMIT").unwrap();
    let answer = server.deliver(&job_body("job-locked")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(json(&answer)["duplicate"], false);
    assert_eq!(server.state_of("job-locked").as_deref(), Some("claimed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_receiver_on_the_same_ledger_is_refused() {
    let server = TestServer::start("").await;
    let config = server.config.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = sume_receiver::run(config, listener, std::future::pending())
        .await
        .unwrap_err();
    assert!(
        format!("{error:#}").contains("another sume-receiver is already running"),
        "{error:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_receiver_reaching_the_ledger_through_a_symlink_is_refused() {
    let server = TestServer::start("").await;
    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("ledger.sqlite3");
    std::os::unix::fs::symlink(server.db_path(), &link).unwrap();
    let mut config = server.config.clone();
    let sume_receiver::config::LedgerConfig::Sqlite(sqlite) = &mut config.database else {
        panic!("a test of the SQLite ledger");
    };
    sqlite.path = link;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second = sume_receiver::run(config, listener, std::future::pending());
    let error = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("a second receiver started on the same ledger")
        .unwrap_err();
    assert!(
        format!("{error:#}").contains("another sume-receiver is already running"),
        "{error:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_or_oversized_request_heads_are_cut_off() {
    let server = TestServer::start(
        "[server]\nheader_read_timeout = \"300ms\"\nbody_read_timeout = \"300ms\"\nmax_headers = 16\n",
    )
    .await;

    // A client that never finishes its head is disconnected after header_read_timeout.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /sume/webhook HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection stayed open");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );

    // More headers than max_headers: refused before any body is read.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let headers: String = (0..40).map(|i| format!("x-filler-{i}: {i}\r\n")).collect();
    let head =
        format!("POST /sume/webhook HTTP/1.1\r\nhost: x\r\n{headers}content-length: 2\r\n\r\n{{}}");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");

    // A body that never finishes arriving gets 408 (its headers pass the checks made before
    // the body is read: a fresh timestamp, a well-formed entry).
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let now = unix_now();
    let entry = "00".repeat(32);
    let head = format!(
        "POST /sume/webhook HTTP/1.1\r\nhost: x\r\n{TIMESTAMP_HEADER}: {now}\r\n{SIGNATURE_HEADER}: sume-v1={entry}\r\n\
         content-length: 100\r\n\r\n{{\"job_id\""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert_eq!(server.row_count(), 0);
}

/// Holds a connection whose head promises a body of `length` bytes that never comes; the
/// headers pass every check made before the body is read.
async fn stalled_body(server: &TestServer, length: usize) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let now = unix_now();
    let entry = "ab".repeat(32);
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\n{TIMESTAMP_HEADER}: {now}\r\n\
         {SIGNATURE_HEADER}: sume-v1={entry}\r\ncontent-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Sends a body's bytes, 100 every 100 ms (above the minimum rate: never cut off for its
/// pace), until the connection closes: a body still arriving, neither stalled nor done.
fn keep_arriving(mut writing: tokio::net::tcp::OwnedWriteHalf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while writing.write_all(&[b' '; 100]).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// The head of a signed delivery of `body`, sent alone on a new connection.
async fn delivery_head_sent(server: &TestServer, body: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let timestamp = unix_now().to_string();
    let entries = signature::sign(&[SECRET], &timestamp, body.as_bytes());
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\n{TIMESTAMP_HEADER}: {timestamp}\r\n\
         {SIGNATURE_HEADER}: {entries}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Everything the server sends until it closes the connection (within 5 s).
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the server closed the connection")
        .unwrap_or_default();
    String::from_utf8_lossy(&answer).into_owned()
}

/// At shutdown, a delivery whose body is still arriving is read, claimed and answered (and its
/// connection then closed), while a connection waiting for its next request closes at once.
#[tokio::test(flavor = "multi_thread")]
async fn at_shutdown_a_delivery_in_progress_is_answered_and_idle_connections_close() {
    let server = TestServer::start("").await;
    let config = server.config.clone();
    let body = job_body("in-progress-at-shutdown");
    let mut idle = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut sending = delivery_head_sent(&server, &body).await;
    let (first, rest) = body.split_at(10);
    sending.write_all(first.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let stopping = tokio::spawn(server.stop());
    assert_eq!(read_until_closed(&mut idle).await, "");
    assert!(!stopping.is_finished(), "the stop waits for the delivery");
    sending.write_all(rest.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut sending).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");

    let (result, _dir) = stopping.await.unwrap();
    result.unwrap();
    let sql = "SELECT state FROM jobs WHERE job_id = ?1";
    let rows = ledger_rows(&config, sql, &["in-progress-at-shutdown"]);
    assert_eq!(rows, vec![vec![serde_json::json!("claimed")]]);
}

/// A body that arrives in several pieces is joined, and stored exactly as sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_arriving_in_pieces_is_stored_as_sent() {
    let server = TestServer::start("").await;
    let body = job_body("in-pieces");
    let mut sending = delivery_head_sent(&server, &body).await;
    for piece in body.as_bytes().chunks(body.len() / 3 + 1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        sending.write_all(piece).await.unwrap();
    }
    let mut answer = vec![0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(5), sending.read(&mut answer))
        .await
        .expect("answered")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let stored = server.rows("SELECT body FROM jobs WHERE job_id = ?1", &["in-pieces"]);
    assert_eq!(stored, vec![vec![serde_json::json!(body)]]);
}

/// Regression: connections still open when the shutdown grace ran out were left open.
#[tokio::test(flavor = "multi_thread")]
async fn past_the_shutdown_grace_a_delivery_still_arriving_is_cut_off_unanswered() {
    let server = TestServer::start("[server]\nshutdown_grace = \"1s\"\n").await;
    let config = server.config.clone();
    let (mut sending, writing) = stalled_body(&server, 100_000).await.into_split();
    let _arriving = keep_arriving(writing);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let stopping = tokio::spawn(server.stop());
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), sending.read_to_end(&mut answer));
    let _ = read.await.expect("the server closed the connection");
    assert_eq!(String::from_utf8_lossy(&answer), "");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900),
        "closed after {elapsed:?}"
    );
    let (result, _dir) = stopping.await.unwrap();
    result.unwrap();
    let rows = ledger_rows(&config, "SELECT count(*) FROM jobs", &[]);
    assert_eq!(rows, vec![vec![serde_json::json!(0)]]);
}

/// Regression: every body was read in full before the signature headers were looked at.
#[tokio::test(flavor = "multi_thread")]
async fn unsigned_requests_are_refused_before_their_body_is_read() {
    let server = TestServer::start("[server]\nbody_read_timeout = \"5s\"\n").await;
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head =
        format!("POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = vec![0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(4), stream.read(&mut answer))
        .await
        .expect("answered without waiting for the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// Regression: bodies in memory had no bound (2,000 x 1 MiB drove RSS to 3.2 GiB). Past the
/// budget a delivery waits briefly, then gets 503; small deliveries keep a share of their own.
#[tokio::test(flavor = "multi_thread")]
async fn the_body_budget_turns_large_bodies_away_and_keeps_room_for_small_ones() {
    let server = TestServer::start(
        "[server]\nmax_body_bytes = 1048576\nmax_inflight_body_bytes = 2097152\nbody_read_timeout = \"8s\"\n",
    )
    .await;
    // 1 MiB of the 1.5 MiB for large bodies, held by a body still arriving.
    let (_held, writing) = stalled_body(&server, 1 << 20).await.into_split();
    let _arriving = keep_arriving(writing);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut second = stalled_body(&server, 1 << 20).await;
    let started = Instant::now();
    let mut answer = vec![0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(5), second.read(&mut answer))
        .await
        .expect("answered while the first body is still awaited")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]).to_lowercase();
    assert!(answer.starts_with("http/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 5"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // An ordinary delivery is not starved by the large ones.
    assert_eq!(server.deliver(&job_body("job-small")).await.status, 200);
}

/// Sends `GET /healthz` on a new connection that closes after the answer; returns the answer.
async fn healthz_once(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    answer
}

/// Regression: nothing capped connections, so each one became a task and a descriptor. The
/// cap holds for connections whose request is vouched for (signed deliveries, here waiting for
/// a locked ledger): those are never shed, a new one waits.
#[tokio::test(flavor = "multi_thread")]
async fn connections_past_max_connections_wait_until_one_closes() {
    let server = TestServer::start(
        "[server]\nmax_connections = 3\nclaim_timeout = \"9s\"\n\n\
         [database]\nbusy_timeout = \"9s\"\n",
    )
    .await;
    let blocker = server.db();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut busy = Vec::new();
    for n in 0..3 {
        let body = job_body(&format!("waiting-{n}"));
        let mut stream = delivery_head_sent(&server, &body).await;
        stream.write_all(body.as_bytes()).await.unwrap();
        busy.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = tokio::spawn(healthz_once(server.addr));
    // Past the grace after which a connection nobody vouched for would have been shed.
    let early = tokio::time::timeout(Duration::from_millis(1500), &mut fourth).await;
    assert!(early.is_err(), "a fourth connection was served");
    blocker.execute_batch("COMMIT").unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), fourth)
        .await
        .expect("served once a connection closed")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Regression: slow heads held every slot until header_read_timeout (1,100 against 1,024
/// slots: a signed sender waited p50 1.0 s, p99 2.9 s). At the limit, the connection that has
/// waited longest for its head now makes room (once past its grace of 0.5 s), and a sender on
/// a new connection gets in well before the slow heads' 60 s.
#[tokio::test(flavor = "multi_thread")]
async fn at_the_connection_limit_slow_heads_make_room_for_a_sender() {
    let server =
        TestServer::start("[server]\nmax_connections = 8\nheader_read_timeout = \"60s\"\n").await;
    let mut slow = slow_heads(server.addr, 40).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        // A client of its own: no connection kept from before the slow heads came.
        let client = sume_receiver::http_client::new_client();
        let (url, body) = (server.webhook_url(), job_body(&format!("job-{i}")));
        let delivery = deliver_with(&client, &url, &body);
        let delivered = tokio::time::timeout(Duration::from_secs(10), delivery)
            .await
            .expect("a sender waited behind slow heads");
        assert_eq!(delivered.status, 200);
    }
    // The oldest slow heads were closed, 8 at a time as their grace ran out; the newest may
    // still wait for theirs.
    let mut closed = 0;
    for stream in &mut slow[..32] {
        let mut byte = [0u8; 1];
        // Closed, or reset (shed before the server read what was sent).
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 32,
        "only {closed} of the 32 oldest slow heads were shed"
    );
    let metrics = server.metrics().await;
    assert!(metrics.contains("sume_connections_shed_total"), "{metrics}");
}

/// The soft limit on open files is raised to the hard one at start (systemd gives soft 1024).
#[tokio::test(flavor = "multi_thread")]
async fn the_open_files_limit_is_raised_at_start() {
    let limits = || {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct we pass.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        limit
    };
    let hard = limits().rlim_max;
    let lowered = libc::rlimit {
        rlim_cur: 256.min(hard),
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct we pass.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
    let server = TestServer::start("").await;
    assert_eq!(limits().rlim_cur, hard);
    server.stop().await.0.unwrap();
}

/// Regression: a panic on the writer thread left /healthz 200 and every delivery 503 forever.
/// Now the service stops with an error (and systemd restarts it).
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_ledger_writer_stops_the_service_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (config, ledger) = open_ledger(dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let credentials = Credentials::read(&config).unwrap();
    let service = tokio::spawn(sume_receiver::run_on(
        config,
        credentials,
        ledger.clone(),
        listener,
        std::future::pending(),
    ));
    let injected = ledger
        .sqlite()
        .unwrap()
        .write_for_test(|_| -> rusqlite::Result<()> { panic!("injected fault") })
        .await;
    assert!(injected.is_err());
    let stopped = tokio::time::timeout(Duration::from_secs(10), service)
        .await
        .expect("the service stops by itself")
        .unwrap();
    let error = format!("{:#}", stopped.unwrap_err());
    assert!(error.contains("ledger writer"), "{error}");
}

/// The service runs with the credentials read at start (by `serve`'s start-up check, which
/// judged them), not with what a file holds by the time a part of the service starts: a signing
/// secret written after the read is not live until a SIGHUP.
#[tokio::test(flavor = "multi_thread")]
async fn the_service_runs_with_the_credentials_read_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, ledger) = open_ledger(dir.path()).await;
    let secrets_file = dir.path().join("secrets");
    config.signature.secrets = Vec::new();
    config.signature.secrets_file = Some(secrets_file.clone());
    std::fs::write(&secrets_file, "whsec_read_at_start\n").unwrap();
    let credentials = Credentials::read(&config).unwrap();
    std::fs::write(&secrets_file, "whsec_written_later\n").unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{WEBHOOK_PATH}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(sume_receiver::run_on(
        config,
        credentials,
        ledger,
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let deliver = |secret: &'static str, job_id: &'static str| {
        let url = url.clone();
        async move {
            let body = job_body(job_id);
            let headers = signed_headers(&body, unix_now(), &[secret]);
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            send_body_to(Method::POST, &url, &headers, &body)
                .await
                .status
        }
    };
    assert_eq!(deliver("whsec_read_at_start", "job-read").await, 200);
    assert_eq!(deliver("whsec_written_later", "job-later").await, 401);
    stop.send(()).unwrap();
    service.await.unwrap().unwrap();
}

/// Sume's resend of a delivery whose answer it did not get is answered from the job_ids the
/// ledger acknowledged in the last minutes: with the ledger locked, a duplicate still gets its
/// 200, a new job its 503, and a job the ledger failed is not taken for known.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_of_a_recent_claim_is_answered_without_the_ledger() {
    let server = TestServer::start("[database]\nbusy_timeout = \"300ms\"\n").await;
    let body = job_body("job-recent");
    assert_eq!(json(&server.deliver(&body).await)["duplicate"], false);

    let blocker = server.db();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let again = server.deliver(&body).await;
    assert_eq!(
        (again.status.as_u16(), json(&again)["duplicate"] == true),
        (200, true)
    );
    assert_eq!(server.deliver(&job_body("job-new")).await.status, 503);
    blocker.execute_batch("ROLLBACK").unwrap();

    let retried = server.deliver(&job_body("job-new")).await;
    assert_eq!(
        json(&retried)["duplicate"],
        false,
        "the failed claim was not remembered"
    );
    assert_eq!(server.state_of("job-new").as_deref(), Some("claimed"));
    let text = server.metrics().await;
    assert!(
        text.contains("\nsume_duplicates_from_memory_total 1\n"),
        "{text}"
    );
}

/// Regression: /healthz stayed 200 while deliveries got 503 on a full disk. /readyz says whether
/// a delivery sent now would be claimed; /healthz stays a liveness check.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_flips_while_commits_fail_and_back() {
    let server = TestServer::start("[database]\nbusy_timeout = \"300ms\"\n").await;
    let get = |path: &'static str| server.request(Method::GET, path, &[], "");
    assert_eq!(get("/readyz").await.unwrap().status, 200);

    // Another process: readiness sees the lock where it can (tests/readiness.rs).
    let blocker = SqliteShell::holding_the_write_lock(&server.db_path());
    assert_eq!(server.deliver(&job_body("job-blocked")).await.status, 503);
    let answer = get("/readyz").await.unwrap();
    assert_eq!(answer.status, 503);
    assert_eq!(
        json(&answer)["reason"],
        "another process holds the ledger's write lock: the last commit waited busy_timeout for it"
    );
    assert_eq!(get("/healthz").await.unwrap().status, 200, "still alive");

    blocker.let_go();
    assert_eq!(get("/readyz").await.unwrap().status, 200);
    assert_eq!(server.deliver(&job_body("job-after")).await.status, 200);
}

on_both_ledgers! {
#[tokio::test(flavor = "multi_thread")]
async fn first_delivery_is_claimed_and_redelivery_is_a_duplicate() {
    let server = TestServer::start("").await;
    let body = job_body("job-1");
    let answer = server.deliver(&body).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        json(&answer),
        serde_json::json!({"job_id": "job-1", "duplicate": false})
    );
    let row = &server.rows(
        "SELECT state, event_type, body FROM jobs WHERE job_id = 'job-1'",
        &[],
    )[0];
    assert_eq!((&row[0], &row[1]), (&"claimed".into(), &"job.completed".into()));
    assert_eq!(row[2], body, "the body is stored verbatim");

    // A Redeliver: same event, fresh timestamp and signature.
    let answer = server
        .deliver_signed(&body, unix_now() - 5, &[SECRET])
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        json(&answer),
        serde_json::json!({"job_id": "job-1", "duplicate": true})
    );
    assert_eq!(server.row_count(), 1);
    server.stop().await.0.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_deliveries_of_one_job_claim_it_once() {
    let server = std::sync::Arc::new(TestServer::start("").await);
    let mut deliveries = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let server = server.clone();
        deliveries.spawn(async move { server.deliver(&job_body("job-race")).await });
    }
    let mut first = 0;
    while let Some(answer) = deliveries.join_next().await {
        let answer = answer.unwrap();
        assert_eq!(answer.status, 200);
        if json(&answer)["duplicate"] == false {
            first += 1;
        }
    }
    assert_eq!(first, 1, "exactly one delivery is the first");
    assert_eq!(server.row_count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_deliveries_get_401_and_leave_no_row() {
    let server = TestServer::start("").await;
    let body = job_body("job-forged");
    let now = unix_now();
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("no headers", vec![]),
        ("no signature", vec![(TIMESTAMP_HEADER, now.to_string())]),
        (
            "no timestamp",
            vec![(
                SIGNATURE_HEADER,
                signature::sign(&[SECRET], &now.to_string(), body.as_bytes()),
            )],
        ),
        (
            "wrong secret",
            vec![
                (TIMESTAMP_HEADER, now.to_string()),
                (
                    SIGNATURE_HEADER,
                    signature::sign(&["whsec_wrong"], &now.to_string(), body.as_bytes()),
                ),
            ],
        ),
        (
            "stale timestamp",
            vec![
                (TIMESTAMP_HEADER, (now - 301).to_string()),
                (
                    SIGNATURE_HEADER,
                    signature::sign(&[SECRET], &(now - 301).to_string(), body.as_bytes()),
                ),
            ],
        ),
        (
            "signature over another body",
            vec![
                (TIMESTAMP_HEADER, now.to_string()),
                (
                    SIGNATURE_HEADER,
                    signature::sign(&[SECRET], &now.to_string(), b"{}"),
                ),
            ],
        ),
        (
            "empty entry",
            vec![
                (TIMESTAMP_HEADER, now.to_string()),
                (SIGNATURE_HEADER, "sume-v1=".into()),
            ],
        ),
    ];
    for (name, headers) in cases {
        let answer = server
            .request(Method::POST, WEBHOOK_PATH, &headers, &body)
            .await
            .unwrap();
        assert_eq!(answer.status, 401, "{name}");
        assert_eq!(
            json(&answer)["error"],
            "invalid or missing signature",
            "{name}: generic body"
        );
    }
    assert_eq!(server.row_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn rotation_any_entry_and_any_secret_may_match() {
    let server = TestServer::start("").await;
    let answer = server
        .deliver_signed(&job_body("job-rot"), unix_now(), &["whsec_newer", SECRET])
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(server.row_count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_payloads_get_400_with_a_reason_and_leave_no_row() {
    let server = TestServer::start("").await;
    for (body, reason) in [
        ("not json", "not a JSON object"),
        ("[1,2]", "not a JSON object"),
        (r#"{"type":"job.completed"}"#, "job_id is missing"),
        (r#"{"job_id":""}"#, "job_id is empty"),
        (r#"{"job_id":7}"#, "job_id must be a string"),
        // Regression: these were claimed, then could never run (NUL) or forged log lines.
        (r#"{"job_id":"a\u0000b"}"#, "control character"),
        (r#"{"job_id":"a\nINFO forged line"}"#, "control character"),
        (r#"{"job_id":"\u001b[31mred"}"#, "control character"),
        (r#"{"job_id":".."}"#, "`.` or `..`"),
    ] {
        let answer = server.deliver(body).await;
        assert_eq!(answer.status, 400, "{body}");
        let error = json(&answer)["error"].as_str().unwrap().to_owned();
        assert!(error.contains(reason), "{body}: {error}");
    }
    assert_eq!(server.row_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn oversize_bodies_get_413_declared_or_chunked() {
    let server = TestServer::start("[server]\nmax_body_bytes = 1024\n").await;
    let padding = "x".repeat(2000);
    let body = format!(r#"{{"job_id":"job-big","pad":"{padding}"}}"#);
    assert_eq!(server.deliver(&body).await.status, 413);

    // Chunked, with no declared length: the limit still holds while reading.
    let now = unix_now().to_string();
    let signature = signature::sign(&[SECRET], &now, body.as_bytes());
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\n\
         {TIMESTAMP_HEADER}: {now}\r\n{SIGNATURE_HEADER}: {signature}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.as_bytes().chunks(500) {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            break; // the server may answer and close before we finish
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(server.row_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn other_routes_health_and_metrics() {
    let server = TestServer::start("").await;
    let get = |path: &'static str| server.request(Method::GET, path, &[], "");
    assert_eq!(get("/healthz").await.unwrap().status, 200);
    assert_eq!(get("/nope").await.unwrap().status, 404);
    let answer = get(WEBHOOK_PATH).await.unwrap();
    assert_eq!(answer.status, 405);
    assert_eq!(answer.headers.get("allow").unwrap(), "POST");

    server.deliver(&job_body("job-m")).await;
    let metrics = get("/metrics").await.unwrap();
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        text.contains("sume_deliveries_total{outcome=\"claimed\"}"),
        "{text}"
    );
    assert!(text.contains("sume_jobs{state=\"claimed\"} 1"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_survive_a_restart() {
    let server = TestServer::start("").await;
    assert_eq!(server.deliver(&job_body("job-keep")).await.status, 200);
    let (result, dir) = server.stop().await;
    result.unwrap();
    let server = TestServer::start_in(dir, "").await;
    assert_eq!(
        json(&server.deliver(&job_body("job-keep")).await)["duplicate"],
        true
    );
}

/// /metrics, /healthz and /readyz on the admin listener (no token needed for these), and
/// `expose_metrics = false` takes /metrics off the public listener.
#[tokio::test(flavor = "multi_thread")]
async fn operational_endpoints_on_the_admin_listener() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin_token"), "t0ken").unwrap();
    let admin_port = free_port();
    let server = TestServer::start_in(
        dir,
        &format!(
            "[server]\nexpose_metrics = false\n\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n"
        ),
    )
    .await;
    assert_eq!(server.get_status("/metrics").await, 404);
    assert_eq!(server.get_status("/healthz").await, 200);
    for (path, expected) in [
        ("/metrics", "sume_deliveries_total"),
        ("/healthz", "ok"),
        ("/readyz", "ready"),
    ] {
        let answer = send_to(
            Method::GET,
            &format!("http://127.0.0.1:{admin_port}{path}"),
            &[],
        )
        .await;
        assert_eq!(answer.status, 200, "{path}");
        assert!(
            String::from_utf8_lossy(&answer.body).contains(expected),
            "{path}"
        );
    }
}
}
