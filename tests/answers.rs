//! Answers from outside as the receiver reads them: an https downstream that closes without
//! TLS close_notify is judged by its status line, and an ACME directory's endless body fails
//! the order with the receiver's memory bounded.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::service::{write_config, Service};
use common::tls::{connect, health_on, presented, Pair, TestCa};
use common::*;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Python's `http.server` over `ssl`: HTTP/1.0, a body that ends when the connection does, and
/// a close without close_notify (its `SSLSocket.shutdown` sends none). Job ids starting with
/// `denied` get a 401.
const PYTHON_DOWNSTREAM: &str = r#"
import http.server, ssl, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        denied = self.headers.get("X-Sume-Job-Id", "").startswith("denied")
        self.send_response(401 if denied else 200)
        self.end_headers()
        self.wfile.write(b"denied: wrong credentials" if denied else b"fine")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The Python downstream, stopped when dropped.
struct PythonDownstream {
    child: Child,
    port: u16,
}

impl PythonDownstream {
    fn start(dir: &std::path::Path, pair: &Pair) -> PythonDownstream {
        pair.install(dir);
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(PYTHON_DOWNSTREAM)
            .arg(dir.join("cert.pem"))
            .arg(dir.join("key.pem"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("python3 printed its port");
        PythonDownstream { child, port }
    }
}

impl Drop for PythonDownstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_downstream_closing_without_close_notify_is_judged_by_its_status_line() {
    let ca = TestCa::new();
    let downstream_dir = tempfile::tempdir().unwrap();
    let downstream = PythonDownstream::start(downstream_dir.path(), &ca.leaf());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("downstream-ca.pem"), &ca.pem).unwrap();
    let server = TestServer::start_in(
        dir,
        &format!(
            "[handler]\nurl = \"https://127.0.0.1:{}/hook\"\nca_file = \"downstream-ca.pem\"\n\
             max_attempts = 1\nhold_after = 0\n",
            downstream.port
        ),
    )
    .await;
    for job_id in ["fine-1", "denied-1"] {
        assert_eq!(server.deliver(&job_body(job_id)).await.status, 200);
    }
    let ended = eventually(Duration::from_secs(10), || {
        server.state_of("fine-1").as_deref() == Some("done")
            && server.state_of("denied-1").as_deref() == Some("dead")
    })
    .await;
    let attempts = server.rows(
        "SELECT job_id, outcome, http_status, error FROM job_attempts ORDER BY job_id",
        &[],
    );
    assert!(ended, "{attempts:?}");
    assert_eq!(
        attempts,
        vec![
            vec![
                "denied-1".into(),
                "dead".into(),
                401.into(),
                "handler answered 401 Unauthorized: denied: wrong credentials".into()
            ],
            vec![
                "fine-1".into(),
                "done".into(),
                serde_json::Value::Null,
                serde_json::Value::Null
            ],
        ]
    );
    server.stop().await.0.unwrap();
}

/// What the endless directory sends at most, so that a receiver reading it all fails this test
/// instead of the machine.
const ENDLESS_CAP: u64 = 512 * 1024 * 1024;

/// An HTTPS server whose every answer is a 200 with a body that never ends (up to
/// [`ENDLESS_CAP`]); how many bytes of body it sent.
async fn endless_directory(pair: &Pair) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let acceptor = pair.acceptor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(stream).await else {
                    return;
                };
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let head =
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"newNonce\":\"";
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'a'; 64 * 1024];
                while counted.load(Ordering::Relaxed) < ENDLESS_CAP {
                    if stream.write_all(&chunk).await.is_err() {
                        return;
                    }
                    counted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (address, sent)
}

/// A line of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acme_directory_with_an_endless_body_fails_the_order_and_memory_stays_bounded() {
    const NAME: &str = "receiver.sume.test";
    let ca = TestCa::new();
    let (directory_address, sent) = endless_directory(&ca.leaf()).await;
    let directory = format!("https://{directory_address}/directory");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    // A cached certificate due for renewal (less than a third of its lifetime left): it serves,
    // and the renewal's order goes to the endless directory at once.
    let cache = dir.path().join("acme");
    std::fs::create_dir(&cache).unwrap();
    let cached = ca.leaf_valid(&[NAME], -2 * 86_400, 3_600);
    let digest = hex::encode(Sha256::digest(format!("{directory}\n{NAME}")));
    let cache_name = format!("{NAME}-{}", &digest[..12]);
    std::fs::write(cache.join(format!("{cache_name}.crt.pem")), &cached.cert).unwrap();
    std::fs::write(cache.join(format!("{cache_name}.key.pem")), &cached.key).unwrap();

    let port = free_port();
    let config = write_config(
        dir.path(),
        port,
        "",
        &format!(
            "[server.tls.acme]\ndomains = [\"{NAME}\"]\ncontact = [\"mailto:ops@sume.test\"]\n\
             directory = \"{directory}\"\ndirectory_ca_file = \"{}\"\ncache_dir = \"{}\"\n",
            ca_file.display(),
            cache.display()
        ),
    );
    let service = Service::start(&config, port).await;
    let pid = service.child.id();
    let started_kib = memory_kib(pid, "VmRSS");
    let log_path = dir.path().join("service.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let failed = eventually(Duration::from_secs(60), || {
        log().contains("TLS certificate order failed")
    })
    .await;
    assert!(failed, "no failed order within 60 s; log:\n{}", log());
    let (now_kib, peak_kib) = (memory_kib(pid, "VmRSS"), memory_kib(pid, "VmHWM"));
    let sent_mib = sent.load(Ordering::Relaxed) / (1024 * 1024);
    eprintln!(
        "receiver RSS {started_kib} KiB after start, {now_kib} KiB after the failed order, \
         peak {peak_kib} KiB; the directory sent {sent_mib} MiB"
    );
    let order_failure = log()
        .lines()
        .find(|line| line.contains("TLS certificate order failed"))
        .unwrap()
        .to_owned();
    assert!(
        order_failure.contains("longer than 1024 KiB"),
        "{order_failure}"
    );
    assert!(
        peak_kib < started_kib + 64 * 1024,
        "RSS {started_kib} KiB at start, peak {peak_kib} KiB"
    );
    assert!(sent_mib < 64, "the directory sent {sent_mib} MiB");

    // The cached certificate still serves, and the receiver answers.
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(
        presented(address, NAME, &ca.pem).await.unwrap(),
        cached.der()
    );
    let mut stream = connect(address, NAME, &ca.pem).await.unwrap();
    assert_eq!(health_on(&mut stream).await, "HTTP/1.1 200 OK");
    service.stop_cleanly().await;
}
