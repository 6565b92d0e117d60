//! Shared test helpers: start the real server on 127.0.0.1:0 with a temp ledger, sign deliveries.
#![allow(dead_code)] // each test binary uses its own subset of these helpers

pub mod sume;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request};
use sume_receiver::config::Config;
use sume_receiver::http_client::{self, Answer, HttpClient};
use sume_receiver::ingest::{SIGNATURE_HEADER, TIMESTAMP_HEADER};
use sume_receiver::signature;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const SECRET: &str = "whsec_integration_test";
pub const WEBHOOK_PATH: &str = "/sume/webhook";

pub struct TestServer {
    pub addr: SocketAddr,
    pub dir: TempDir,
    pub config: Config,
    client: HttpClient,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// Config text for a test: one secret, a ledger in `dir`, plus `extra` sections (which may
/// include a `[database]` section of their own).
pub fn config_text(dir: &Path, extra: &str) -> String {
    let path_line = format!("path = \"{}\"\n", dir.join("ledger.sqlite3").display());
    let extra = if extra.contains("[database]\n") {
        extra.replacen("[database]\n", &format!("[database]\n{path_line}"), 1)
    } else {
        format!("{extra}\n[database]\n{path_line}")
    };
    format!("[signature]\nsecrets = [\"{SECRET}\"]\n\n{extra}\n")
}

impl TestServer {
    /// Starts the library's `run` on a fresh port with a fresh ledger.
    pub async fn start(extra_config: &str) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, extra_config).await
    }

    /// Starts on an existing directory (a restart keeps the ledger).
    pub async fn start_in(dir: TempDir, extra_config: &str) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_with(dir, extra_config, listener).await
    }

    /// Starts on a listener the test bound itself (to know the port before the server runs).
    pub async fn start_with(
        dir: TempDir,
        extra_config: &str,
        listener: tokio::net::TcpListener,
    ) -> TestServer {
        let config = Config::parse(&config_text(dir.path(), extra_config), dir.path()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(sume_receiver::run(config.clone(), listener, async {
            let _ = stopped.await;
        }));
        let server = TestServer {
            addr,
            dir,
            config,
            client: http_client::new_client(),
            stop: Some(stop),
            task: Some(task),
        };
        server.wait_until_healthy().await;
        server
    }

    async fn wait_until_healthy(&self) {
        for _ in 0..200 {
            if let Ok(answer) = self.request(Method::GET, "/healthz", &[], "").await {
                if answer.status == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("server on {} never became healthy", self.addr);
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("ledger.sqlite3")
    }

    pub fn db(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(self.db_path()).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn
    }

    pub fn row_count(&self) -> i64 {
        self.db()
            .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
            .unwrap()
    }

    pub fn webhook_url(&self) -> String {
        format!("http://{}{WEBHOOK_PATH}", self.addr)
    }

    pub fn state_of(&self, job_id: &str) -> Option<String> {
        self.db()
            .query_row(
                "SELECT state FROM jobs WHERE job_id = ?1",
                [job_id],
                |row| row.get(0),
            )
            .ok()
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: &str,
    ) -> Result<Answer, String> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        http_client::send(&self.client, request, Duration::from_secs(15), 1 << 20).await
    }

    /// The status of `GET path`.
    pub async fn get_status(&self, path: &str) -> u16 {
        self.request(Method::GET, path, &[], "")
            .await
            .unwrap()
            .status
            .as_u16()
    }

    /// POSTs `body` to the webhook path, signed now with the test secret (a fresh delivery).
    pub async fn deliver(&self, body: &str) -> Answer {
        self.deliver_signed(body, unix_now(), &[SECRET]).await
    }

    pub async fn deliver_signed(&self, body: &str, timestamp: i64, secrets: &[&str]) -> Answer {
        let timestamp = timestamp.to_string();
        let headers = [
            (TIMESTAMP_HEADER, timestamp.clone()),
            (
                SIGNATURE_HEADER,
                signature::sign(secrets, &timestamp, body.as_bytes()),
            ),
            ("content-type", "application/json".to_owned()),
        ];
        self.request(Method::POST, WEBHOOK_PATH, &headers, body)
            .await
            .unwrap()
    }

    /// Graceful stop; returns what `run` returned and the directory, for a restart.
    pub async fn stop(mut self) -> (anyhow::Result<()>, TempDir) {
        let _ = self.stop.take().unwrap().send(());
        let result = self.task.take().unwrap().await.unwrap();
        (result, self.dir)
    }
}

/// One request with an empty body to any `url` (another listener than the server's own).
pub async fn send_to(method: Method, url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(Full::new(Bytes::new())).unwrap();
    http_client::send(
        &http_client::new_client(),
        request,
        Duration::from_secs(5),
        1 << 16,
    )
    .await
    .unwrap()
}

/// A ledger of its own in `dir`, opened as the service opens it (writer thread started).
pub fn open_ledger(dir: &Path) -> (Config, std::sync::Arc<sume_receiver::ledger::Ledger>) {
    let config = Config::parse(&config_text(dir, ""), dir).unwrap();
    let ledger = sume_receiver::ledger::Ledger::open(&config.database).unwrap();
    (config, ledger)
}

/// A port nothing listens on right now (for a server the test starts later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub fn job_body(job_id: &str) -> String {
    format!(r#"{{"job_id":"{job_id}","type":"job.completed","result":{{"ok":true}}}}"#)
}

pub fn json(answer: &Answer) -> serde_json::Value {
    serde_json::from_slice(&answer.body).unwrap_or_else(|e| {
        panic!(
            "answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&answer.body)
        )
    })
}

/// Polls `condition` every 20 ms until it holds or `within` passes.
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    condition()
}
