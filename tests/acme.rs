//! Certificates from a real ACME CA (Pebble, validating for real): TLS-ALPN-01 and HTTP-01, a
//! restart that orders nothing, the CA down at start, a renewal served without a restart.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::pebble::{Pebble, Validation};
use common::tls::{connect, presented};
use common::*;
use hyper::Method;
use sume_receiver::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAME: &str = "receiver.sume.test";

/// The real receiver on `listener`, with `[server.tls.acme]` for [`NAME`] from `pebble`.
struct Receiver {
    address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

fn acme_config(
    dir: &std::path::Path,
    directory: &str,
    ca_file: &std::path::Path,
    extra: &str,
) -> Config {
    let text = config_text(
        dir,
        &format!(
            "[server.tls.acme]\ndomains = [\"{NAME}\"]\ncontact = [\"mailto:ops@sume.test\"]\n\
             directory = \"{directory}\"\ndirectory_ca_file = \"{}\"\ncache_dir = \"acme\"\n{extra}",
            ca_file.display()
        ),
    );
    Config::parse(&text, dir).unwrap()
}

impl Receiver {
    async fn start(config: Config, listener: tokio::net::TcpListener) -> Receiver {
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(sume_receiver::run(config, listener, async {
            let _ = stopped.await;
        }));
        Receiver {
            address,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }

    /// The certificate it presents for [`NAME`], once it has one (within 30 s).
    async fn certificate(&self, root: &str) -> Vec<u8> {
        for _ in 0..600 {
            if let Ok(der) = presented(self.address, NAME, root).await {
                return der;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no certificate for {NAME} within 30 s");
    }

    /// A signed delivery over TLS for [`NAME`]: the status line of the answer.
    async fn deliver(&self, root: &str, job_id: &str) -> String {
        let body = job_body(job_id);
        let mut stream = connect(self.address, NAME, root).await.unwrap();
        let mut request = format!(
            "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: {NAME}\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in signed_headers(&body, unix_now(), &[SECRET]) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        answer.lines().next().unwrap_or_default().to_owned()
    }
}

async fn listener() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_alpn_01_gets_a_certificate_a_restart_orders_nothing_and_a_ca_down_changes_nothing() {
    let listener = listener().await;
    let port = listener.local_addr().unwrap().port();
    let validation = Validation {
        tls_port: port,
        http_port: free_port(),
        validity: Duration::from_secs(90 * 86_400),
    };
    let Some(mut pebble) = Pebble::start("tls_alpn_01_gets_a_certificate", validation).await else {
        return;
    };
    let root = pebble.root().await;
    let dir = tempfile::tempdir().unwrap();
    let config = acme_config(dir.path(), &pebble.directory, &pebble.ca_file, "");
    let started = Instant::now();
    let receiver = Receiver::start(config.clone(), listener).await;
    let first = receiver.certificate(&root).await;
    println!(
        "first certificate (TLS-ALPN-01) after {:?}",
        started.elapsed()
    );
    assert_eq!(
        receiver.deliver(&root, "over-acme").await,
        "HTTP/1.1 200 OK"
    );
    assert_eq!(pebble.orders(), 1);
    let address = receiver.address;
    receiver.stop().await;

    // A restart serves the cached certificate at once and orders nothing.
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let receiver = Receiver::start(config.clone(), listener).await;
    assert_eq!(receiver.certificate(&root).await, first);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(pebble.orders(), 1, "a restart ordered a certificate");
    receiver.stop().await;

    // The CA down at start: the cached certificate serves, deliveries are claimed.
    pebble.stop();
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let receiver = Receiver::start(config, listener).await;
    assert_eq!(receiver.certificate(&root).await, first);
    assert_eq!(receiver.deliver(&root, "ca-down").await, "HTTP/1.1 200 OK");
    receiver.stop().await;
    let cache = dir.path().join("acme");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&cache).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "the cache holds the account key");
}

#[tokio::test(flavor = "multi_thread")]
async fn http_01_gets_a_certificate_on_its_own_listener() {
    let listener = listener().await;
    let http_port = free_port();
    let validation = Validation {
        tls_port: free_port(),
        http_port,
        validity: Duration::from_secs(90 * 86_400),
    };
    let Some(pebble) = Pebble::start("http_01_gets_a_certificate", validation).await else {
        return;
    };
    let root = pebble.root().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("challenge = \"http-01\"\nhttp_listen = \"127.0.0.1:{http_port}\"\n");
    let config = acme_config(dir.path(), &pebble.directory, &pebble.ca_file, &extra);
    let started = Instant::now();
    let receiver = Receiver::start(config, listener).await;
    receiver.certificate(&root).await;
    println!("first certificate (HTTP-01) after {:?}", started.elapsed());
    assert_eq!(
        receiver.deliver(&root, "over-http-01").await,
        "HTTP/1.1 200 OK"
    );
    // The http-01 listener answers only open challenges.
    let answer = send_to(
        hyper::Method::GET,
        &format!("http://127.0.0.1:{http_port}/.well-known/acme-challenge/unknown"),
        &[],
    )
    .await;
    assert_eq!(answer.status, 404);
    receiver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_short_lived_certificate_is_renewed_and_served_without_a_restart() {
    let listener = listener().await;
    let validation = Validation {
        tls_port: listener.local_addr().unwrap().port(),
        http_port: free_port(),
        // Renewed when a third is left: 10 s after it is issued.
        validity: Duration::from_secs(15),
    };
    let Some(pebble) = Pebble::start("a_short_lived_certificate_is_renewed", validation).await
    else {
        return;
    };
    let root = pebble.root().await;
    let dir = tempfile::tempdir().unwrap();
    let config = acme_config(dir.path(), &pebble.directory, &pebble.ca_file, "");
    let receiver = Receiver::start(config, listener).await;
    let first = receiver.certificate(&root).await;
    let mut delivered = 0;
    let mut renewed = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        assert_eq!(
            receiver
                .deliver(&root, &format!("renewal-{delivered}"))
                .await,
            "HTTP/1.1 200 OK"
        );
        delivered += 1;
        let now = receiver.certificate(&root).await;
        if now != first {
            renewed = Some(now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(renewed.is_some(), "not renewed within 30 s");
    assert_eq!(pebble.orders(), 2);
    assert_eq!(
        receiver.deliver(&root, "after-renewal").await,
        "HTTP/1.1 200 OK"
    );
    receiver.stop().await;
}

/// The value of the metric line that starts with `name` (a name with its labels), if served.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}

/// Regression: a first start with the CA unreachable said `ready` (and `sume_ready` 1) while
/// every handshake failed, served no metric an alert could fire on, counted the refused
/// handshakes as unknown names, and SIGHUP did not retry the order (it waited its 2 minutes).
#[tokio::test(flavor = "multi_thread")]
async fn without_a_certificate_a_receiver_is_not_ready_and_a_reload_orders_at_once() {
    let test = "without_a_certificate_a_receiver_is_not_ready_and_a_reload_orders_at_once";
    let port = free_port();
    let validation = Validation {
        tls_port: port,
        http_port: free_port(),
        validity: Duration::from_secs(90 * 86_400),
    };
    let Some(pebble) = Pebble::start(test, validation).await else {
        return;
    };
    let root = pebble.root().await;
    // The CA's directory behind a relay, cut: unreachable at the first start.
    let ca_address = pebble.directory["https://".len()..]
        .split('/')
        .next()
        .unwrap();
    let relay = common::relay::Relay::start(ca_address.to_owned()).await;
    relay.cut();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin_token"), "t".repeat(40)).unwrap();
    let admin_port = free_port();
    let config = common::service::write_config(
        dir.path(),
        port,
        "",
        &format!(
            "[server.tls.acme]\ndomains = [\"{NAME}\"]\n\
             directory = \"https://127.0.0.1:{}/dir\"\ndirectory_ca_file = \"{}\"\n\
             cache_dir = \"acme\"\n\
             [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n",
            relay.port,
            pebble.ca_file.display()
        ),
    );
    let service = common::service::Service::start(&config, port).await;
    // The admin listener is bound after the webhook's, which `start` waits for.
    let listening = eventually(Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", admin_port)).is_ok()
    });
    assert!(listening.await, "the admin listener never listened");
    let admin = format!("http://127.0.0.1:{admin_port}");
    let metrics = || async {
        String::from_utf8(
            send_to(Method::GET, &format!("{admin}/metrics"), &[])
                .await
                .body
                .to_vec(),
        )
        .unwrap()
    };
    let failed = "sume_tls_certificate_failures_total{listener=\"webhook\",operation=\"obtain\"}";
    let mut text = String::new();
    for _ in 0..300 {
        text = metrics().await;
        if metric(&text, failed) == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(&text, failed),
        Some(1.0),
        "the first order failed: {text}"
    );
    // Not ready, and why; the gauge the alert SumeNoTlsCertificate reads.
    let ready = send_to(Method::GET, &format!("{admin}/readyz"), &[]).await;
    assert_eq!(ready.status, 503);
    let ready = json(&ready);
    assert_eq!(ready["status"], "not ready");
    assert!(
        ready["reason"]
            .as_str()
            .unwrap()
            .contains("no TLS certificate"),
        "{ready}"
    );
    assert_eq!(metric(&text, "sume_ready "), Some(0.0), "{text}");
    let present = "sume_tls_certificate_present{listener=\"webhook\"}";
    assert_eq!(metric(&text, present), Some(0.0), "{text}");
    // A sender now hears that there is no certificate, counted as such.
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let refused = connect(address, NAME, &root)
        .await
        .expect_err("no certificate yet");
    assert!(refused.to_string().contains("InternalError"), "{refused}");
    let text = metrics().await;
    let no_certificate =
        "sume_tls_handshakes_refused_total{listener=\"webhook\",reason=\"no_certificate\"}";
    assert_eq!(metric(&text, no_certificate), Some(1.0), "{text}");

    // The CA back, then `systemctl reload`: ordered at once, not after the backoff's 2 minutes.
    relay.restore();
    // SAFETY: sending a signal to our own child has no memory-safety preconditions.
    unsafe { libc::kill(service.child.id() as i32, libc::SIGHUP) };
    let reloaded = Instant::now();
    let mut served = false;
    while !served && reloaded.elapsed() < Duration::from_secs(60) {
        served = presented(address, NAME, &root).await.is_ok();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        served,
        "no certificate within 60 s of SIGHUP (the backoff is 120 s)"
    );
    println!("certificate {:?} after SIGHUP", reloaded.elapsed());
    let ready = send_to(Method::GET, &format!("{admin}/readyz"), &[]).await;
    assert_eq!(ready.status, 200, "{}", json(&ready));
    assert_eq!(metric(&metrics().await, present), Some(1.0));

    // check-config says what a start would serve: the cached certificate's names.
    let check = common::service::cli(&config, &["check-config"]);
    let said = String::from_utf8_lossy(&check.stdout).into_owned()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(
        said.contains(&format!(
            "serves {NAME} at start: the cached certificate issued by"
        )),
        "{said}"
    );
    service.stop_cleanly().await;
}
