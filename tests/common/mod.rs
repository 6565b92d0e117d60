//! Shared test helpers: start the real server on 127.0.0.1:0 with a temp ledger, sign deliveries.
#![allow(dead_code)] // each test binary uses its own subset of these helpers

pub mod otlp;
pub mod pebble;
pub mod peers;
pub mod powercut;
pub mod relay;
pub mod service;
pub mod sqlite_shell;
pub mod sume;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request};
use sume_receiver::config::{Config, LedgerConfig, PostgresConfig};
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
    /// `https` with `[server.tls]`: the client then trusts the CA at `<dir>/ca.pem`.
    scheme: &'static str,
    client: HttpClient,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// Which ledger a test's servers use: set for the test's task by [`on_both_ledgers!`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The server where each test on PostgreSQL gets a database of its own.
pub const POSTGRES_URL_VARIABLE: &str = "SUME_TEST_POSTGRES_URL";

/// What [`Backend::run`] sets for a test's task: its backend, and the PostgreSQL databases made
/// for it, dropped when it ends.
struct TestScope {
    backend: Backend,
    databases: Arc<Mutex<Vec<String>>>,
}

tokio::task_local! {
    static SCOPE: TestScope;
}

/// Drops a test's PostgreSQL databases when it ends, passed or failed: each is about 8 MB, and a
/// CI run makes about a hundred. Never panics (it may run while a failed test unwinds).
struct DropDatabases(Arc<Mutex<Vec<String>>>);

impl Drop for DropDatabases {
    fn drop(&mut self) {
        let names = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        let Ok(admin) = std::env::var(POSTGRES_URL_VARIABLE) else {
            return;
        };
        if names.is_empty() {
            return;
        }
        // The sync client runs a runtime of its own, which must not start on the test's.
        let dropping = std::thread::Builder::new().spawn(move || {
            let mut client = postgres::Client::connect(&admin, postgres::NoTls)?;
            for name in names {
                client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
            }
            Ok::<_, postgres::Error>(())
        });
        match dropping.map(|thread| thread.join()) {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => eprintln!("could not drop a test database: {error}"),
            Ok(Err(_)) => eprintln!("could not drop a test database: the dropping thread panicked"),
            Err(error) => eprintln!("could not drop a test database: {error}"),
        }
    }
}

impl Backend {
    /// The backend of the running test (SQLite outside [`on_both_ledgers!`]).
    pub fn current() -> Backend {
        SCOPE
            .try_with(|scope| scope.backend)
            .unwrap_or(Backend::Sqlite)
    }

    /// Runs a test body on this backend; on PostgreSQL without a server to use, says so and
    /// passes (CI sets the variable, so there it always runs).
    pub async fn run(self, test: &str, body: impl Future<Output = ()>) {
        if self == Backend::Postgres && std::env::var_os(POSTGRES_URL_VARIABLE).is_none() {
            skip(&format!("{test} on PostgreSQL"), &format!("set {POSTGRES_URL_VARIABLE}=postgres://user:password@host/database (a role that may CREATE DATABASE) to run it"));
            return;
        }
        let databases = Arc::new(Mutex::new(Vec::new()));
        let _dropped_at_the_end = DropDatabases(databases.clone());
        let scope = TestScope {
            backend: self,
            databases,
        };
        SCOPE.scope(scope, body).await
    }
}

/// Where skipped tests are listed, a line each, for the closing line of `.ci/test` (cargo
/// reports a skipped test as passed).
pub const SKIPPED_LIST: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/skipped-tests");

/// Says that `test` did not run and why, in its output and in [`SKIPPED_LIST`].
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    eprintln!("SKIPPED {test}: {why}");
    let mut list = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(SKIPPED_LIST)
        .unwrap();
    list.write_all(format!("{test}\n").as_bytes()).unwrap();
}

/// Writes each test twice, in modules `sqlite` and `postgres`: the same body against each
/// ledger backend.
#[allow(unused_macros)] // not every test binary runs on both
macro_rules! on_both_ledgers {
    ($( $(#[$attr:meta])* async fn $name:ident() $body:block )*) => {
        mod sqlite {
            use super::*;
            $( $(#[$attr])* async fn $name() {
                $crate::common::Backend::Sqlite.run(stringify!($name), async move $body).await
            } )*
        }
        mod postgres {
            use super::*;
            $( $(#[$attr])* async fn $name() {
                $crate::common::Backend::Postgres.run(stringify!($name), async move $body).await
            } )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_ledgers;

/// Runs `work` with a connection to PostgreSQL at `url`, on a thread of its own (the sync
/// client runs its own runtime, which must not be nested in the test's).
pub fn with_postgres<T: Send>(
    url: &str,
    work: impl FnOnce(&mut postgres::Client) -> T + Send,
) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut client = postgres::Client::connect(url, postgres::NoTls)
                    .unwrap_or_else(|error| panic!("cannot connect to {url}: {error}"));
                work(&mut client)
            })
            .join()
            .unwrap()
    })
}

/// A new empty database on the test server; its URL.
pub fn new_postgres_database() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let admin = std::env::var(POSTGRES_URL_VARIABLE).expect("checked by Backend::run");
    let name = format!(
        "sume_test_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        fastrand::u32(..)
    );
    with_postgres(&admin, |client| {
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap()
    });
    // Made outside a test's task (in a thread or task it started), it stays until the next
    // .ci/start-postgres drops it.
    let _ = SCOPE.try_with(|scope| {
        let mut databases = scope
            .databases
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        databases.push(name.clone());
    });
    let mut config: postgres::Config = admin.parse().unwrap();
    config.dbname(&name);
    postgres_url(&config)
}

/// The URL form of a parsed config (host, port, user, password, database).
pub fn postgres_url(config: &postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let password = config
        .get_password()
        .map(|p| format!(":{}", String::from_utf8_lossy(p)))
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{password}@{host}:{port}/{database}")
}

/// The PostgreSQL database of the ledger in `dir`: made on first use, then the same one for
/// every server started on `dir` (a restart keeps its ledger).
pub fn postgres_url_of(dir: &Path) -> String {
    let file = dir.join("postgres-url");
    if let Ok(url) = std::fs::read_to_string(&file) {
        return url;
    }
    let url = new_postgres_database();
    std::fs::write(&file, &url).unwrap();
    url
}

/// Config text for a test: one secret, a ledger in `dir` (a SQLite file, or a PostgreSQL
/// database of its own), plus `extra` sections (which may include a `[database]` section).
pub fn config_text(dir: &Path, extra: &str) -> String {
    let path_line = match Backend::current() {
        Backend::Sqlite => format!("path = \"{}\"\n", dir.join("ledger.sqlite3").display()),
        Backend::Postgres => format!(
            "path = \"{}\"\nurl = \"{}\"\n",
            dir.join("ledger.sqlite3").display(),
            postgres_url_of(dir)
        ),
    };
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
        let (scheme, client) = if config.server.tls.is_some() {
            let ca = dir.path().join("ca.pem");
            ("https", http_client::client_trusting(Some(&ca)).unwrap())
        } else {
            ("http", http_client::new_client())
        };
        let server = TestServer {
            addr,
            dir,
            config,
            scheme,
            client,
            stop: Some(stop),
            task: Some(task),
        };
        server.wait_until_healthy().await;
        server
    }

    async fn wait_until_healthy(&self) {
        // Up to 5 s: a start may wait for its database.
        for _ in 0..500 {
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

    /// The SQLite ledger file, for what only SQLite has (locks, pragmas, the file itself).
    pub fn db(&self) -> rusqlite::Connection {
        assert_eq!(
            Backend::current(),
            Backend::Sqlite,
            "db() opens the SQLite file"
        );
        let conn = rusqlite::Connection::open(self.db_path()).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn
    }

    /// The rows a query returns from this server's ledger, whichever backend, each value as
    /// JSON (integers, text, booleans, null). Statements use `?1`-style text parameters.
    pub fn rows(&self, sql: &str, params: &[&str]) -> Vec<Vec<serde_json::Value>> {
        ledger_rows(&self.config, sql, params)
    }

    /// The first value of the first row (null when there is none).
    pub fn value(&self, sql: &str, params: &[&str]) -> serde_json::Value {
        self.rows(sql, params)
            .into_iter()
            .next()
            .and_then(|row| row.into_iter().next())
            .unwrap_or(serde_json::Value::Null)
    }

    /// Runs a statement that changes the ledger; how many rows it changed.
    pub fn execute(&self, sql: &str, params: &[&str]) -> u64 {
        ledger_execute(&self.config, sql, params)
    }

    pub fn row_count(&self) -> i64 {
        self.value("SELECT count(*) FROM jobs", &[])
            .as_i64()
            .unwrap()
    }

    pub fn webhook_url(&self) -> String {
        format!("{}://{}{WEBHOOK_PATH}", self.scheme, self.addr)
    }

    pub fn state_of(&self, job_id: &str) -> Option<String> {
        self.value("SELECT state FROM jobs WHERE job_id = ?1", &[job_id])
            .as_str()
            .map(str::to_owned)
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
            .uri(format!("{}://{}{path}", self.scheme, self.addr));
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        http_client::send(&self.client, request, Duration::from_secs(15), 1 << 20)
            .await
            .map_err(|error| error.to_string())
    }

    /// The status of `GET path`.
    pub async fn get_status(&self, path: &str) -> u16 {
        self.request(Method::GET, path, &[], "")
            .await
            .unwrap()
            .status
            .as_u16()
    }

    /// The text of `GET /metrics`.
    pub async fn metrics(&self) -> String {
        let scrape = self
            .request(Method::GET, "/metrics", &[], "")
            .await
            .unwrap();
        assert_eq!(scrape.status, 200);
        String::from_utf8(scrape.body.to_vec()).unwrap()
    }

    /// POSTs `body` to the webhook path, signed now with the test secret (a fresh delivery).
    pub async fn deliver(&self, body: &str) -> Answer {
        self.deliver_signed(body, unix_now(), &[SECRET]).await
    }

    pub async fn deliver_signed(&self, body: &str, timestamp: i64, secrets: &[&str]) -> Answer {
        let headers = signed_headers(body, timestamp, secrets);
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

/// The headers Sume sends with `body`, signed at `timestamp` with `secrets`.
pub fn signed_headers(body: &str, timestamp: i64, secrets: &[&str]) -> [(&'static str, String); 3] {
    let timestamp = timestamp.to_string();
    [
        (TIMESTAMP_HEADER, timestamp.clone()),
        (
            SIGNATURE_HEADER,
            signature::sign(secrets, &timestamp, body.as_bytes()),
        ),
        ("content-type", "application/json".to_owned()),
    ]
}

/// A delivery of `body`, signed now with the test secret, to `url` through `client`.
pub async fn deliver_with(client: &HttpClient, url: &str, body: &str) -> Answer {
    let mut builder = Request::builder().method(Method::POST).uri(url);
    for (name, value) in signed_headers(body, unix_now(), &[SECRET]) {
        builder = builder.header(name, value);
    }
    let request = builder
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    http_client::send(client, request, Duration::from_secs(15), 1 << 20)
        .await
        .unwrap()
}

/// One request with an empty body to any `url` (another listener than the server's own).
pub async fn send_to(method: Method, url: &str, headers: &[(&str, &str)]) -> Answer {
    send_body_to(method, url, headers, "").await
}

/// One request with `body` to any `url`; an answer of up to 1 MiB.
pub async fn send_body_to(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    http_client::send(
        &http_client::new_client(),
        request,
        Duration::from_secs(5),
        1 << 20,
    )
    .await
    .unwrap()
}

/// A ledger of its own in `dir`, opened as the service opens it (writer thread started).
pub async fn open_ledger(dir: &Path) -> (Config, std::sync::Arc<sume_receiver::ledger::Ledger>) {
    let config = Config::parse(&config_text(dir, ""), dir).unwrap();
    let ledger = sume_receiver::ledger::Ledger::open(&config.database)
        .await
        .unwrap();
    (config, ledger)
}

/// See [`TestServer::rows`].
pub fn ledger_rows(config: &Config, sql: &str, params: &[&str]) -> Vec<Vec<serde_json::Value>> {
    use serde_json::Value;
    match &config.database {
        LedgerConfig::Sqlite(sqlite) => {
            let conn = rusqlite::Connection::open(&sqlite.path).unwrap();
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            let mut statement = conn.prepare(sql).unwrap();
            let columns = statement.column_count();
            let rows = statement
                .query_map(rusqlite::params_from_iter(params), |row| {
                    (0..columns)
                        .map(|i| {
                            Ok(match row.get_ref(i)? {
                                rusqlite::types::ValueRef::Null => Value::Null,
                                rusqlite::types::ValueRef::Integer(n) => Value::from(n),
                                rusqlite::types::ValueRef::Real(x) => Value::from(x),
                                rusqlite::types::ValueRef::Text(t) => {
                                    Value::from(String::from_utf8_lossy(t).into_owned())
                                }
                                rusqlite::types::ValueRef::Blob(b) => Value::from(b.len()),
                            })
                        })
                        .collect()
                })
                .unwrap();
            rows.collect::<Result<_, _>>().unwrap()
        }
        LedgerConfig::Postgres(postgres) => {
            let sql = postgres_form(sql);
            with_postgres(&url_of(postgres), |client| {
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as _).collect();
                let rows = client
                    .query(&sql, &params)
                    .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
                rows.iter()
                    .map(|row| {
                        (0..row.len())
                            .map(|i| match *row.columns()[i].type_() {
                                postgres::types::Type::INT4 => row
                                    .get::<_, Option<i32>>(i)
                                    .map_or(Value::Null, Value::from),
                                postgres::types::Type::INT8 => row
                                    .get::<_, Option<i64>>(i)
                                    .map_or(Value::Null, Value::from),
                                postgres::types::Type::BOOL => row
                                    .get::<_, Option<bool>>(i)
                                    .map_or(Value::Null, Value::from),
                                _ => row
                                    .get::<_, Option<String>>(i)
                                    .map_or(Value::Null, Value::from),
                            })
                            .collect()
                    })
                    .collect()
            })
        }
    }
}

/// A test's statement, written in SQLite's `?N` form, in PostgreSQL's `$N` form.
fn postgres_form(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// See [`TestServer::execute`].
pub fn ledger_execute(config: &Config, sql: &str, params: &[&str]) -> u64 {
    match &config.database {
        LedgerConfig::Sqlite(sqlite) => {
            let conn = rusqlite::Connection::open(&sqlite.path).unwrap();
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            conn.execute(sql, rusqlite::params_from_iter(params))
                .unwrap() as u64
        }
        LedgerConfig::Postgres(postgres) => {
            let sql = postgres_form(sql);
            with_postgres(&url_of(postgres), |client| {
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as _).collect();
                client.execute(&sql, &params).unwrap()
            })
        }
    }
}

/// Inserts jobs straight into the ledger in one statement, as rows left by an earlier run:
/// (job_id, state, body, finished_at). Unfinished ones are due at once.
pub fn insert_jobs(
    config: &Config,
    jobs: impl Iterator<Item = (String, &'static str, String, Option<i64>)>,
) {
    let quote = |text: &str| format!("'{}'", text.replace('\'', "''"));
    let routed = if config.database.sqlite_path().is_some() {
        ""
    } else {
        ", true"
    };
    let rows: Vec<String> = jobs
        .map(|(job_id, state, body, finished_at)| {
            let due = if matches!(state, "claimed" | "retrying") {
                "1"
            } else {
                "NULL"
            };
            let finished = finished_at.map_or("NULL".to_owned(), |at| at.to_string());
            format!(
                "({}, '{state}', {}, 1, {due}, {finished}, 1{routed})",
                quote(&job_id),
                quote(&body)
            )
        })
        .collect();
    ledger_execute(
        config,
        &format!(
            "INSERT INTO jobs (job_id, state, body, received_at, next_attempt_at, finished_at, \
             updated_at{}) VALUES {}",
            // PostgreSQL's ledger refuses a job no receiver of this release wrote (a rolling
            // upgrade's older receivers): these rows are written as one would.
            if config.database.sqlite_path().is_some() {
                ""
            } else {
                ", routed"
            },
            rows.join(", ")
        ),
        &[],
    );
    // Each job's work on the default route, as a claim writes it.
    let (key, job) = if config.database.sqlite_path().is_some() {
        ("job", "id")
    } else {
        ("job_id", "job_id")
    };
    ledger_execute(
        config,
        &format!(
            "INSERT INTO job_routes ({key}, route, state, next_attempt_at, finished_at, updated_at)
             SELECT {job}, 'default', state, next_attempt_at, finished_at, updated_at FROM jobs
             WHERE NOT EXISTS (SELECT 1 FROM job_routes AS r WHERE r.{key} = jobs.{job})"
        ),
        &[],
    );
}

/// The condition that picks a job's work rows in `job_routes`, the job's job_id given as the
/// parameter `param` (`?1`, or a quoted literal): SQLite keys them by the job's number in the
/// ledger (`jobs.id`), PostgreSQL by its job_id.
pub fn work_of_job(config: &Config, param: &str) -> String {
    if config.database.sqlite_path().is_some() {
        format!("job = (SELECT id FROM jobs WHERE job_id = {param})")
    } else {
        format!("job_id = {param}")
    }
}

/// The URL of a test's PostgreSQL ledger.
fn url_of(config: &PostgresConfig) -> String {
    postgres_url(&config.url().unwrap().settings().clone().into())
}

/// The SQLite file of a test's ledger; panics on PostgreSQL.
pub fn sqlite_path(config: &Config) -> &Path {
    config
        .database
        .sqlite_path()
        .expect("a test of the SQLite ledger")
}

/// `count` connections that each send part of a request head and then nothing (a slow
/// client holding its slot until `header_read_timeout`).
pub async fn slow_heads(
    address: impl tokio::net::ToSocketAddrs + Copy,
    count: usize,
) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut slow = Vec::with_capacity(count);
    for _ in 0..count {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"POST /sume/webhook HTTP/1.1\r\nhost: x\r\nx-slow: a")
            .await
            .unwrap();
        slow.push(stream);
    }
    slow
}

/// A port nothing listens on right now, for a server the test starts (and may restart) later;
/// never the same twice in one test binary. Below the kernel's ephemeral range (32768-60999),
/// which outgoing connections take their local ports from: while a server of that range was
/// down after a kill, a connection could take its port (one of its clients retrying could even
/// connect to itself there), and the server started again could not listen on it, while the
/// test took the port's answers for its own.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let port = fastrand::u16(20_000..32_000);
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
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
