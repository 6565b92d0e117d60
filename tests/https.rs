//! HTTPS from certificate files: real TLS clients, reloads, refusals, limits, the handler's https.

mod common;

use std::time::{Duration, Instant};

use common::tls::{connect, health_on, https_server, presented, TestCa};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The metrics are the process's: these tests count them, so they take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(line_start))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

#[tokio::test]
async fn a_delivery_over_https_is_claimed_and_curl_agrees() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ca = TestCa::new();
    let server = https_server(&ca, "").await;
    let answer = server.deliver(&job_body("https-1")).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(json(&answer)["duplicate"], false);
    assert_eq!(server.state_of("https-1").as_deref(), Some("claimed"));

    // curl, with the test's CA, as an operator would try it: TLS 1.3 and 1.2 both served.
    let ca_file = server.dir.path().join("ca.pem");
    for version in ["--tlsv1.3", "--tlsv1.2"] {
        let max = &version[6..];
        // Not std's: the server runs on this test's one thread while curl waits.
        let output = tokio::process::Command::new("curl")
            .args(["-sS", "--cacert"])
            .arg(&ca_file)
            .args([
                version,
                "--tls-max",
                max,
                "-w",
                " %{http_code} %{http_version}",
            ])
            .arg(format!("https://{}/healthz", server.addr))
            .output()
            .await
            .expect("curl is installed");
        let text = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(text.ends_with(" 200 1.1"), "{version}: {text} {stderr}");
    }
    server.stop().await.0.unwrap();
}

#[tokio::test]
async fn plain_http_and_unknown_names_are_refused_at_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ca = TestCa::new();
    let server = https_server(&ca, "").await;
    let started = Instant::now();
    let mut plain = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    plain.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.ends_with("use an https:// URL\n"), "{answer}");

    // A name the certificate does not cover: a handshake alert that says so (not rustls's
    // `access_denied`), not a certificate to doubt.
    let refused = connect(server.addr, "other.example", &ca.pem).await;
    let refused = refused.expect_err("a handshake for a name it does not cover");
    assert!(
        refused.to_string().contains("UnrecognisedName"),
        "{refused}"
    );
    let ca_file = server.dir.path().join("ca.pem");
    // Not std's: the server runs on this test's one thread while curl waits.
    let curl = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(&ca_file)
        .arg("--resolve")
        .arg(format!("other.example:{}:127.0.0.1", server.addr.port()))
        .arg(format!(
            "https://other.example:{}/healthz",
            server.addr.port()
        ))
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&curl.stderr);
    assert!(said.contains("unrecognized name"), "curl: {said}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let metrics = server.metrics().await;
    let refused = |reason: &str| {
        metric(
            &metrics,
            &format!(
                "sume_tls_handshakes_refused_total{{listener=\"webhook\",reason=\"{reason}\"}}"
            ),
        )
    };
    assert_eq!(refused("plain_http"), 1.0, "{metrics}");
    assert_eq!(
        refused("unknown_name"),
        2.0,
        "rustls's and curl's: {metrics}"
    );
    server.stop().await.0.unwrap();
}

#[tokio::test]
async fn new_files_are_served_from_the_next_handshake_and_a_bad_pair_keeps_the_old_one() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ca = TestCa::new();
    let server = https_server(&ca, "").await;
    let dir = server.dir.path().to_owned();
    let first = presented(server.addr, "localhost", &ca.pem).await.unwrap();
    // Open before any swap: it must keep working across all of them.
    let mut kept = connect(server.addr, "localhost", &ca.pem).await.unwrap();
    assert_eq!(health_on(&mut kept).await, "HTTP/1.1 200 OK");

    let renewed = ca.leaf();
    renewed.install(&dir);
    let mut served = first.clone();
    for _ in 0..100 {
        served = presented(server.addr, "localhost", &ca.pem).await.unwrap();
        if served != first {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served, renewed.der(), "the renewed certificate is served");
    let expiry = metric(
        &server.metrics().await,
        "sume_tls_certificate_expiry_timestamp_seconds{listener=\"webhook\"}",
    );
    let expected = (unix_now() + 90 * 86_400) as f64;
    assert!((expiry - expected).abs() < 30.0, "{expiry} vs {expected}");
    let present = metric(
        &server.metrics().await,
        "sume_tls_certificate_present{listener=\"webhook\"}",
    );
    assert_eq!(present, 1.0);

    // A certificate with another's key, an expired pair, then a pair that no longer covers a
    // name the one in use covers (its senders would all fail): refused, the renewed one stays.
    let other = ca.leaf();
    std::fs::write(dir.join("cert.pem"), &other.cert).unwrap();
    let expired = ca.leaf_valid(&["127.0.0.1", "localhost"], -86_400, -60);
    let narrower = ca.leaf_valid(&["localhost"], -86_400, 90 * 86_400);
    // Each refused pair counts once (a change that does not load is read once more first).
    let refusals = [
        (1.0, "the mismatched pair", None),
        (2.0, "the expired pair", Some(&expired)),
        (3.0, "the pair without 127.0.0.1", Some(&narrower)),
    ];
    for (failures, what, install) in refusals {
        if let Some(pair) = install {
            pair.install(&dir);
        }
        let mut counted = false;
        for _ in 0..100 {
            let text = server.metrics().await;
            let key =
                "sume_tls_certificate_failures_total{listener=\"webhook\",operation=\"reload\"}";
            if metric(&text, key) == failures {
                counted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(counted, "{what} counted as a failure");
        assert_eq!(
            presented(server.addr, "localhost", &ca.pem).await.unwrap(),
            renewed.der(),
            "{what}: the renewed certificate still serves"
        );
    }
    let answer = server.deliver(&job_body("after-swaps")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        health_on(&mut kept).await,
        "HTTP/1.1 200 OK",
        "the old connection lives"
    );
    server.stop().await.0.unwrap();
}

#[tokio::test]
async fn silent_handshakes_are_shed_at_the_connection_limit_and_time_out() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ca = TestCa::new();
    let server = https_server(
        &ca,
        "[server]\nmax_connections = 4\nheader_read_timeout = \"1s\"\n",
    )
    .await;
    // Strangers that connect and never say a word: all four slots.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(tokio::net::TcpStream::connect(server.addr).await.unwrap());
    }
    // Past their grace (0.5 s), not yet their handshake deadline (1 s).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let started = Instant::now();
    let answer = server.deliver(&job_body("past-the-silent")).await;
    assert_eq!(answer.status, 200);
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "a real sender got in at once: {:?}",
        started.elapsed()
    );
    // Each silent one is closed: shed, or by the handshake deadline.
    for mut stream in silent {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    }
    let metrics = server.metrics().await;
    let shed = metric(&metrics, "sume_connections_shed_total ");
    let timed_out = metric(
        &metrics,
        "sume_tls_handshakes_refused_total{listener=\"webhook\",reason=\"timeout\"}",
    );
    assert!(shed >= 1.0, "{metrics}");
    assert!(shed + timed_out >= 4.0, "{metrics}");
    server.stop().await.0.unwrap();
}

#[tokio::test]
async fn deliveries_under_load_lose_nothing_across_certificate_swaps() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ca = TestCa::new();
    let server = std::sync::Arc::new(https_server(&ca, "").await);
    let dir = server.dir.path().to_owned();
    let ca_file = dir.join("ca.pem");
    let mut senders = Vec::new();
    for sender in 0..8 {
        let (server, ca_file) = (server.clone(), ca_file.clone());
        senders.push(tokio::spawn(async move {
            for n in 0..40 {
                let body = job_body(&format!("load-{sender}-{n}"));
                // Half the senders open a connection (a handshake) per delivery, as a sender
                // like Sume may; the others keep theirs.
                let answer = if sender % 2 == 0 {
                    let client =
                        sume_receiver::http_client::client_trusting(Some(&ca_file)).unwrap();
                    deliver_with(&client, &server.webhook_url(), &body).await
                } else {
                    server.deliver(&body).await
                };
                assert_eq!(answer.status, 200, "{sender}-{n}");
            }
        }));
    }
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        ca.leaf().install(&dir);
    }
    for sender in senders {
        sender.await.unwrap();
    }
    assert_eq!(
        server.row_count(),
        320,
        "every acknowledged delivery is in the ledger"
    );
    let metrics = server.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "sume_tls_certificate_failures_total{listener=\"webhook\",operation=\"reload\"}"
        ),
        0.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn an_https_handler_is_verified_and_its_userinfo_sent_as_basic_credentials() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ca = TestCa::new();
    let downstream = common::tls::HttpsDownstream::start(&ca.leaf()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("downstream-ca.pem"), &ca.pem).unwrap();
    let url = format!(
        "https://hook%40user:p%40ss:w0rd@{}/hook?x=1",
        downstream.address
    );
    let handler = |ca_file: &str| {
        format!("[handler]\nurl = \"{url}\"\n{ca_file}max_attempts = 1\nhold_after = 0\n")
    };
    let server = TestServer::start_in(dir, &handler("ca_file = \"downstream-ca.pem\"\n")).await;
    assert_eq!(server.deliver(&job_body("to-https")).await.status, 200);
    assert!(
        eventually(Duration::from_secs(10), || server
            .state_of("to-https")
            .as_deref()
            == Some("done"))
        .await,
        "state {:?}",
        server.state_of("to-https")
    );
    let seen = downstream.seen.lock().unwrap().clone();
    // "hook@user:p@ss:w0rd", decoded, in Basic; no userinfo on the request line.
    assert_eq!(
        seen,
        vec![(
            "/hook?x=1".to_owned(),
            Some("Basic aG9va0B1c2VyOnBAc3M6dzByZA==".to_owned())
        )]
    );
    server.stop().await.0.unwrap();

    // Without the CA: the certificate is not trusted, and the attempt fails saying so.
    let server = TestServer::start(&handler("")).await;
    assert_eq!(server.deliver(&job_body("untrusted")).await.status, 200);
    assert!(
        eventually(Duration::from_secs(10), || server
            .state_of("untrusted")
            .as_deref()
            == Some("dead"))
        .await,
        "state {:?}",
        server.state_of("untrusted")
    );
    let error = server.value(
        "SELECT last_error FROM jobs WHERE job_id = ?1",
        &["untrusted"],
    );
    assert!(error.to_string().contains("certificate"), "{error}");
    assert_eq!(
        downstream.seen.lock().unwrap().len(),
        1,
        "nothing sent unverified"
    );
    server.stop().await.0.unwrap();
}

#[tokio::test]
async fn the_admin_listener_speaks_https_from_its_own_files() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ca = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let admin_dir = dir.path().join("admin");
    std::fs::create_dir(&admin_dir).unwrap();
    ca.leaf().install(&admin_dir);
    std::fs::write(
        dir.path().join("admin_token"),
        "an-admin-token-of-32-characters-x",
    )
    .unwrap();
    let admin_port = free_port();
    let server = TestServer::start_in(
        dir,
        &format!(
            "[admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\
             [admin.tls]\ncert_file = \"admin/cert.pem\"\nkey_file = \"admin/key.pem\"\n"
        ),
    )
    .await;
    let address: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let mut admin = connect(address, "localhost", &ca.pem).await.unwrap();
    assert_eq!(health_on(&mut admin).await, "HTTP/1.1 200 OK");
    let mut plain = tokio::net::TcpStream::connect(address).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    plain.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");

    // Signed in over TLS: the cookie is Secure; the Config page shows the certificate.
    std::fs::write(server.dir.path().join("admin-ca.pem"), &ca.pem).unwrap();
    let client =
        sume_receiver::http_client::client_trusting(Some(&server.dir.path().join("admin-ca.pem")))
            .unwrap();
    let base = format!("https://127.0.0.1:{admin_port}");
    let send = |method: hyper::Method, path: &str, headers: Vec<(&str, String)>, body: &str| {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap();
        sume_receiver::http_client::send(&client, request, Duration::from_secs(5), 1 << 20)
    };
    let signed_in = send(
        hyper::Method::POST,
        "/console/sign-in",
        vec![
            ("origin", base.clone()),
            ("sec-fetch-site", "same-origin".into()),
            ("content-type", "application/x-www-form-urlencoded".into()),
        ],
        "token=an-admin-token-of-32-characters-x",
    )
    .await
    .unwrap();
    assert_eq!(signed_in.status, 303, "{signed_in:?}");
    let cookie = signed_in.headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("; Secure"), "{cookie}");
    // The listener is the console's whole host: a __Host- cookie, for all of it.
    assert!(
        cookie.starts_with("__Host-sume_console=") && cookie.contains("; Path=/;"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let config = send(
        hyper::Method::GET,
        "/console/config",
        vec![("cookie", session)],
        "",
    )
    .await
    .unwrap();
    let page = String::from_utf8_lossy(&config.body);
    assert!(page.contains("tls certificate (admin)"), "{page}");
    assert!(
        page.contains("127.0.0.1, localhost; issued by CN=sume test CA"),
        "{page}"
    );
    assert!(page.contains("from certificate files"), "{page}");
    server.stop().await.0.unwrap();
}
