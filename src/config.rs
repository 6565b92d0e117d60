//! The TOML configuration: every key, its default, and the checks that refuse a bad file at start.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Deserializer};

use crate::job_id::JobId;

pub const DEFAULT_PATH: &str = "/etc/sume-receiver/config.toml";
/// The secret of the example config and the README's quick start: public, so never live on a
/// real listener.
pub const EXAMPLE_SECRET: &str = "whsec_change_me";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    pub signature: SignatureConfig,
    #[serde(default)]
    pub database: DatabaseConfig,
    /// No `[handler]` section: jobs stay `claimed` for an external consumer.
    pub handler: Option<HandlerConfig>,
    #[serde(default)]
    pub sweeper: SweeperConfig,
    #[serde(default)]
    pub retention: RetentionConfig,
    /// No `[sume_api]` section: no reconciliation, no `jobs redeliver`.
    pub sume_api: Option<SumeApiConfig>,
    /// No `[admin]` section (or no token): no admin listener.
    pub admin: Option<AdminConfig>,
    #[serde(default)]
    pub log: LogConfig,
    /// The file this was read from (`None` when parsed from text), for a reload.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// Paths the server answers itself; the webhook path may not take one of them.
pub const RESERVED_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics"];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub webhook_path: String,
    pub max_body_bytes: usize,
    /// How long a client may take to send the request head.
    #[serde(deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// How long a client may take to send the body, once the head is in.
    #[serde(deserialize_with = "duration")]
    pub body_read_timeout: Duration,
    pub max_headers: usize,
    /// Upper bound of the request head (request line plus headers), in bytes.
    pub max_header_bytes: usize,
    /// The longest a delivery waits for its claim to commit before it is answered 503.
    #[serde(deserialize_with = "duration")]
    pub claim_timeout: Duration,
    /// On SIGTERM: how long in-flight requests and running handlers may take to finish.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Connections served at once; past it, new ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Bytes of request bodies held in memory at once, over all connections.
    pub max_inflight_body_bytes: usize,
    /// Serve `/metrics` on this (public) listener too; the admin listener always serves it.
    pub expose_metrics: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            webhook_path: "/sume/webhook".into(),
            max_body_bytes: 1024 * 1024,
            header_read_timeout: Duration::from_secs(5),
            body_read_timeout: Duration::from_secs(10),
            max_headers: 64,
            max_header_bytes: 16 * 1024,
            claim_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            max_connections: 1024,
            max_inflight_body_bytes: 64 * 1024 * 1024,
            expose_metrics: true,
        }
    }
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureConfig {
    /// Secrets written in the config file itself. The live set is these plus `secrets_file`'s:
    /// see [`Config::signing_secrets`].
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// One secret a line; blank lines and `#` comments are skipped. Merged with `secrets`.
    /// Read only by the commands that sign or verify (`serve`, `loadgen`), at start and on
    /// SIGHUP: under systemd it is a credential that exists only while the unit runs.
    pub secrets_file: Option<PathBuf>,
    #[serde(default = "default_tolerance", deserialize_with = "duration")]
    pub tolerance: Duration,
}

fn default_tolerance() -> Duration {
    Duration::from_secs(300)
}

impl fmt::Debug for SignatureConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignatureConfig")
            .field(
                "secrets",
                &format_args!("[{} redacted]", self.secrets.len()),
            )
            .field("secrets_file", &self.secrets_file)
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

/// A signing secret. Its Debug form never shows the value, so it cannot leak into a log line.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares in constant time, for bearer tokens.
    pub fn matches(&self, candidate: &str) -> bool {
        use sha2::Digest;
        // Comparing digests keeps the time independent of where the strings first differ.
        let (a, b) = (
            sha2::Sha256::digest(&self.0),
            sha2::Sha256::digest(candidate),
        );
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

/// Reads a file holding one secret (surrounding whitespace dropped); `key` names it in errors.
fn read_secret_file(key: &str, path: &Path) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{key}: cannot read {}", path.display()))?;
    let value = text.trim();
    if value.is_empty() {
        bail!("{key}: {} is empty", path.display());
    }
    Ok(Secret::new(value))
}

impl AsRef<[u8]> for Secret {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// An acknowledged claim survives power loss: it is answered only after an fsync of the WAL
    /// that began after its commit.
    Full,
    /// fsync only at checkpoints: survives a process crash, may lose the last commits on power loss.
    Normal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// journald under systemd, text elsewhere.
    Auto,
    Text,
    Json,
    Journald,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// One `info` line per acknowledged delivery (refusals are always logged, at `warn`).
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Auto,
            access: true,
        }
    }
}

/// What the service checks of the ledger's pages before it serves from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckAtStart {
    /// `PRAGMA quick_check`: every page's structure, without matching indexes to their tables.
    Quick,
    /// `PRAGMA integrity_check`: also that every index matches its table. Slower.
    Full,
    Off,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// The SQLite ledger file (when no `url` is set).
    pub path: PathBuf,
    /// A PostgreSQL database instead of the SQLite file: `postgres://user:password@host/db`.
    /// Several receivers may share it.
    pub url: Option<PostgresUrl>,
    /// A file holding that URL instead (keeps the password out of the config file); read when
    /// the ledger is opened.
    pub url_file: Option<PathBuf>,
    /// CA certificates (PEM) that PostgreSQL's TLS certificate may chain to, besides the
    /// system's (a managed provider's bundle); used with `sslmode=require`.
    pub ca_file: Option<PathBuf>,
    pub synchronous: Synchronous,
    /// How long a write waits for a lock held by another process before it gives up (503).
    #[serde(deserialize_with = "duration")]
    pub busy_timeout: Duration,
    /// Most claims and state changes committed in one transaction (group commit). 1 turns group
    /// commit off, which only the benchmark has reason to do.
    pub max_batch: usize,
    pub check_at_start: CheckAtStart,
    /// This receiver's name on the leases it takes in a shared (PostgreSQL) ledger: the host
    /// name and the listen port, unique among receivers and the same after a restart. Set at
    /// load, not configured.
    #[serde(skip)]
    pub receiver: String,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/var/lib/sume-receiver/ledger.sqlite3"),
            url: None,
            url_file: None,
            ca_file: None,
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(2),
            max_batch: 512,
            check_at_start: CheckAtStart::Quick,
            receiver: String::new(),
        }
    }
}

impl DatabaseConfig {
    /// Whether the ledger is a PostgreSQL database (`url` or `url_file`) rather than the file.
    pub fn uses_postgres(&self) -> bool {
        self.url.is_some() || self.url_file.is_some()
    }

    /// The PostgreSQL URL, read from `url_file` if that is how it is given; `None` for SQLite.
    pub fn postgres_url(&self) -> anyhow::Result<Option<PostgresUrl>> {
        let Some(file) = &self.url_file else {
            return Ok(self.url.clone());
        };
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("database.url_file: cannot read {}", file.display()))?;
        PostgresUrl::parse(text.trim()).map(Some).map_err(|error| {
            anyhow::anyhow!(
                "{} (in {})",
                error.replace("database.url", "database.url_file"),
                file.display()
            )
        })
    }
}

/// This machine's host name (gethostname), or "localhost" if it has none.
fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    let failed = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } != 0;
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    match std::str::from_utf8(&buffer[..end]) {
        Ok(name) if !failed && !name.is_empty() => name.to_owned(),
        _ => "localhost".to_owned(),
    }
}

/// A PostgreSQL connection URL (or key=value string), checked at load. Its Debug and Display
/// forms show host, port and database only: the password never reaches a log line.
#[derive(Clone)]
pub struct PostgresUrl(tokio_postgres::Config);

impl PostgresUrl {
    pub fn parse(text: &str) -> Result<PostgresUrl, String> {
        let config: tokio_postgres::Config = text.parse().map_err(|error| {
            format!(
                "database.url is not a PostgreSQL connection string ({error}); expected \
                 postgres://user:password@host:5432/database"
            )
        })?;
        if config.get_dbname().is_none() {
            return Err(
                "database.url names no database: add it, as in postgres://user@host/sume".into(),
            );
        }
        Ok(PostgresUrl(config))
    }

    /// The settings as the URL gives them (the ledger adds its timeouts and keepalives).
    pub fn settings(&self) -> &tokio_postgres::Config {
        &self.0
    }

    /// Whether the server is on this machine (loopback or a Unix socket): no need to encrypt.
    pub fn is_local(&self) -> bool {
        self.0.get_hosts().iter().all(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => {
                name == "localhost"
                    || name
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
            tokio_postgres::config::Host::Unix(_) => true,
        })
    }

    /// host:port/database, for logs and messages.
    pub fn location(&self) -> String {
        let host = match self.0.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
            None => "localhost".to_owned(),
        };
        let port = self.0.get_ports().first().copied().unwrap_or(5432);
        let database = self.0.get_dbname().unwrap_or_default();
        format!("postgres://{host}:{port}/{database}")
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.location())
    }
}

impl<'de> Deserialize<'de> for PostgresUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        PostgresUrl::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// `[handler]`, resolved: what runs a job, and its limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawHandlerConfig")]
pub struct HandlerConfig {
    pub kind: HandlerKind,
    pub timeout: Duration,
    pub concurrency: usize,
    pub max_attempts: u32,
    /// Delay before the first retry; doubles each attempt, with jitter, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

/// `[handler]` as the file has it: exactly one of `command` and `url`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHandlerConfig {
    /// Program and arguments, run directly (no shell) with the stored body on stdin.
    command: Option<Vec<String>>,
    /// An `http://` URL the stored body is POSTed to.
    url: Option<String>,
    #[serde(default = "default_handler_timeout", deserialize_with = "duration")]
    timeout: Duration,
    #[serde(default = "default_concurrency")]
    concurrency: usize,
    #[serde(default = "default_max_attempts")]
    max_attempts: u32,
    #[serde(default = "default_backoff", deserialize_with = "duration")]
    backoff: Duration,
    #[serde(default = "default_max_backoff", deserialize_with = "duration")]
    max_backoff: Duration,
}

fn default_handler_timeout() -> Duration {
    Duration::from_secs(300)
}
fn default_concurrency() -> usize {
    4
}
fn default_max_attempts() -> u32 {
    5
}
fn default_backoff() -> Duration {
    Duration::from_secs(10)
}
fn default_max_backoff() -> Duration {
    Duration::from_secs(3600)
}

/// What a handler does with a job, once validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerKind {
    Command(Vec<String>),
    Url(String),
}

impl TryFrom<RawHandlerConfig> for HandlerConfig {
    type Error = String;

    fn try_from(raw: RawHandlerConfig) -> Result<Self, String> {
        let kind = match (raw.command, raw.url) {
            (Some(_), Some(_)) => {
                return Err("handler: set exactly one of `command` and `url`, not both".into())
            }
            (None, None) => return Err("handler: set one of `command` or `url`".into()),
            (Some(command), None) => {
                if command.first().is_none_or(|program| program.is_empty()) {
                    return Err("handler.command must name a program".into());
                }
                HandlerKind::Command(command)
            }
            (None, Some(url)) => {
                let uri: hyper::Uri = url
                    .parse()
                    .map_err(|error| format!("handler.url: invalid URL {url:?}: {error}"))?;
                if uri.scheme_str() != Some("http") || uri.host().is_none() {
                    return Err(format!(
                        "handler.url must be an http:// URL with a host, got {url:?}"
                    ));
                }
                HandlerKind::Url(url)
            }
        };
        Ok(HandlerConfig {
            kind,
            timeout: raw.timeout,
            concurrency: raw.concurrency,
            max_attempts: raw.max_attempts,
            backoff: raw.backoff,
            max_backoff: raw.max_backoff,
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweeperConfig {
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// Slack past a running attempt's handler timeout before its lease is presumed dead.
    #[serde(deserialize_with = "duration")]
    pub stale_after: Duration,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            stale_after: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Finished jobs keep their body this long after finishing; then only a tombstone remains.
    #[serde(deserialize_with = "duration")]
    pub ttl: Duration,
    /// A tombstone (job_id, state, times) is kept this long after finishing, so that a late
    /// Redeliver is still recognised as a duplicate. After it, the job_id is forgotten.
    #[serde(deserialize_with = "duration")]
    pub dedupe_ttl: Duration,
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30 * DAY_SECS),
            dedupe_ttl: Duration::from_secs(365 * DAY_SECS),
            interval: Duration::from_secs(3600),
        }
    }
}

const DAY_SECS: u64 = 86_400;
/// Sume's deliveries are small JSON documents; a limit past this only serves a flood.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SumeApiConfig {
    pub base_url: String,
    /// Read when Sume is called (the reconciler at start, `jobs redeliver`): see
    /// [`SumeApiConfig::api_key`].
    pub api_key_file: PathBuf,
    /// Poll an expected job that has no claim this long after it was registered.
    #[serde(default = "default_reconcile_after", deserialize_with = "duration")]
    pub reconcile_after: Duration,
    /// Stop polling a job this long after it was registered.
    #[serde(default = "default_give_up_after", deserialize_with = "duration")]
    pub give_up_after: Duration,
    #[serde(default = "default_max_rps")]
    pub max_requests_per_second: f64,
    #[serde(default = "default_terminal_statuses")]
    pub terminal_statuses: Vec<String>,
    /// Deadline of one call to Sume's API.
    #[serde(default = "default_request_timeout", deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Delay before polling a job again after a non-terminal answer; doubles up to the max.
    #[serde(default = "default_poll_backoff", deserialize_with = "duration")]
    pub poll_backoff: Duration,
    #[serde(default = "default_max_poll_backoff", deserialize_with = "duration")]
    pub max_poll_backoff: Duration,
}

impl SumeApiConfig {
    pub const DEFAULT_RECONCILE_AFTER: Duration = Duration::from_secs(15 * 60);
}

fn default_reconcile_after() -> Duration {
    SumeApiConfig::DEFAULT_RECONCILE_AFTER
}
fn default_give_up_after() -> Duration {
    Duration::from_secs(7 * DAY_SECS)
}
fn default_max_rps() -> f64 {
    5.0
}
fn default_terminal_statuses() -> Vec<String> {
    ["completed", "failed", "canceled", "expired"]
        .map(String::from)
        .to_vec()
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_poll_backoff() -> Duration {
    Duration::from_secs(60)
}
fn default_max_poll_backoff() -> Duration {
    Duration::from_secs(3600)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// The bearer token clients of the admin listener must send; no file, no listener.
    /// Read when the service starts.
    pub token_file: Option<PathBuf>,
}

impl AdminConfig {
    /// The token from `token_file`, if one is configured.
    pub fn token(&self) -> anyhow::Result<Option<Secret>> {
        self.token_file
            .as_deref()
            .map(|file| read_secret_file("admin.token_file", file))
            .transpose()
    }
}

fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8081))
}

/// The longest duration any key takes: past it, time arithmetic on it could overflow, and no
/// setting has a use for it.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * DAY_SECS);

/// Human durations: "300s", "5m", "30d", "1h 30m"; at most 100 years.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    let parsed = humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {text:?} ({e}); write it like \"300s\", \"5m\" or \"30d\""
        ))
    })?;
    if parsed > MAX_DURATION {
        return Err(serde::de::Error::custom(format!(
            "duration {text:?} is longer than 100 years"
        )));
    }
    Ok(parsed)
}

/// A TOML error without the source excerpt `toml` would print: the excerpt may be a secret
/// (the journal keeps what we print). Says the line, the key and what is wrong; in the
/// `[signature]` table, quoted values in the message are hidden too.
fn describe_toml_error(text: &str, error: &toml::de::Error) -> String {
    let Some(span) = error.span() else {
        return error.message().to_owned();
    };
    let start = span.start.min(text.len());
    let line_number = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(line_number - 1).unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(key, _)| key.trim())
        .filter(|key| !key.is_empty() && !key.contains(['"', '\'']))
        .map(|key| format!(" (key `{key}`)"))
        .unwrap_or_default();
    let table = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| line.starts_with('['))
        .unwrap_or("");
    let mut message = error.message().trim().to_owned();
    if table.trim_matches(['[', ']', ' ']) == "signature" {
        message = hide_quoted(&message);
    }
    format!("TOML error on line {line_number}{key}: {message}")
}

/// Replaces every `"..."` in `text` by `"(hidden)"`.
fn hide_quoted(text: &str) -> String {
    let mut parts = text.split('"');
    let mut out = parts.next().unwrap_or("").to_owned();
    for (index, part) in parts.enumerate() {
        out.push('"');
        out.push_str(if index % 2 == 0 { "(hidden)" } else { part });
    }
    out
}

impl Config {
    /// Reads, parses and validates the file; the error names the offending key.
    /// Credential files (secrets, API key, admin token) are not read here: only the commands
    /// that need them read them (see [`Config::signing_secrets`]).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let mut config = Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("invalid config file {}", path.display()))?;
        config.source = Some(path.to_owned());
        Ok(config)
    }

    /// Parses and validates config text; relative paths in it are taken from `base_dir`.
    pub fn parse(text: &str, base_dir: &Path) -> anyhow::Result<Self> {
        let mut config: Config = toml::from_str(text)
            .map_err(|error| anyhow::anyhow!(describe_toml_error(text, &error)))?;
        config.resolve_paths(base_dir);
        config.database.receiver = format!("{}:{}", host_name(), config.server.listen.port());
        let mut problems = Vec::new();
        config.validate(&mut problems);
        match problems.len() {
            0 => Ok(config),
            1 => Err(anyhow::anyhow!(problems.remove(0))),
            n => bail!("{n} problems:\n  {}", problems.join("\n  ")),
        }
    }

    /// [`Config::signing_secrets`] from the file this config came from, read again (for a
    /// reload); from this config as it is when it was not read from a file.
    pub fn reload_signing_secrets(&self) -> anyhow::Result<Vec<Secret>> {
        match &self.source {
            Some(path) => Config::load(path)?.signing_secrets(),
            None => self.signing_secrets(),
        }
    }

    /// The live signing secrets: `signature.secrets` and the lines of `signature.secrets_file`,
    /// newest first. Refuses an empty set, an empty secret, and the published example secret
    /// on a listener that is not loopback.
    pub fn signing_secrets(&self) -> anyhow::Result<Vec<Secret>> {
        let mut secrets = self.signature.secrets.clone();
        if let Some(file) = &self.signature.secrets_file {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!("signature.secrets_file: cannot read {}", file.display())
            })?;
            secrets.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|line| !line.is_empty() && !line.starts_with('#'))
                    .map(Secret::new),
            );
        }
        if secrets.is_empty() {
            bail!("signature.secrets: no secret configured (set `secrets` or `secrets_file`)");
        }
        if let Some(i) = secrets.iter().position(|s| s.0.trim().is_empty()) {
            bail!(
                "signature.secrets[{i}] is empty: an empty secret would accept forged deliveries"
            );
        }
        if secrets.iter().any(|s| s.0 == EXAMPLE_SECRET) && !self.server.listen.ip().is_loopback() {
            bail!(
                "signature: the example secret {EXAMPLE_SECRET:?} is published in the README; \
                 refusing it on {} (not loopback). Set your Sume endpoint's signing secret",
                self.server.listen
            );
        }
        Ok(secrets)
    }

    /// How long after registration an expected job is first polled for.
    pub fn reconcile_after(&self) -> Duration {
        self.sume_api
            .as_ref()
            .map_or(SumeApiConfig::DEFAULT_RECONCILE_AFTER, |api| {
                api.reconcile_after
            })
    }

    /// Problems worth a warning at start, not a refusal.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.retention.dedupe_ttl < Duration::from_secs(7 * DAY_SECS) {
            warnings.push(format!(
                "retention.dedupe_ttl is {}: a Redeliver of a job older than that runs it again",
                humantime::format_duration(self.retention.dedupe_ttl)
            ));
        }
        if self
            .signature
            .secrets
            .iter()
            .any(|secret| secret.0 == EXAMPLE_SECRET)
        {
            warnings.push(format!(
                "signature.secrets holds the example secret {EXAMPLE_SECRET:?}, published in the \
                 README: fine for a try on loopback, refused on any other address"
            ));
        }
        if let Some(admin) = &self.admin {
            if admin.token_file.is_none() {
                warnings.push("[admin] has no token_file: the admin listener is off".into());
            } else if !admin.listen.ip().is_loopback() {
                warnings.push(format!(
                    "admin.listen {} is not a loopback address",
                    admin.listen
                ));
            }
        }
        warnings
    }

    fn resolve_paths(&mut self, base_dir: &Path) {
        self.database.path = base_dir.join(&self.database.path);
        let files = [
            self.database.url_file.as_mut(),
            self.database.ca_file.as_mut(),
            self.signature.secrets_file.as_mut(),
            self.sume_api.as_mut().map(|api| &mut api.api_key_file),
            self.admin
                .as_mut()
                .and_then(|admin| admin.token_file.as_mut()),
        ];
        for file in files.into_iter().flatten() {
            *file = base_dir.join(&*file);
        }
    }

    fn validate(&self, problems: &mut Vec<String>) {
        if self.database.url.is_some() && self.database.url_file.is_some() {
            problems.push("database: set url or url_file, not both".to_owned());
        }
        let signature = &self.signature;
        if signature.secrets.is_empty() && signature.secrets_file.is_none() {
            problems.push(
                "signature.secrets: no secret configured (set `secrets` or `secrets_file`)"
                    .to_owned(),
            );
        }
        if signature.tolerance.is_zero() {
            problems.push("signature.tolerance must be greater than zero".to_owned());
        }
        let server = &self.server;
        if !server.webhook_path.starts_with('/') || server.webhook_path.contains(['?', '#']) {
            problems.push(format!(
                "server.webhook_path must be a path starting with '/', got {:?}",
                server.webhook_path
            ));
        }
        if RESERVED_PATHS.contains(&server.webhook_path.as_str()) {
            problems.push(format!(
                "server.webhook_path {:?} is reserved",
                server.webhook_path
            ));
        }
        if server.max_body_bytes == 0 {
            problems.push("server.max_body_bytes must be greater than zero".to_owned());
        }
        if server.max_headers == 0 {
            problems.push("server.max_headers must be greater than zero".to_owned());
        }
        if server.max_header_bytes < 8192 {
            problems.push("server.max_header_bytes must be at least 8192".to_owned());
        }
        for (key, value) in [
            ("server.header_read_timeout", server.header_read_timeout),
            ("server.body_read_timeout", server.body_read_timeout),
            ("server.claim_timeout", server.claim_timeout),
            ("sweeper.interval", self.sweeper.interval),
            ("sweeper.stale_after", self.sweeper.stale_after),
            ("database.busy_timeout", self.database.busy_timeout),
        ] {
            if value.is_zero() {
                problems.push(format!("{key} must be greater than zero"));
            }
        }
        if server.claim_timeout >= Duration::from_secs(10) {
            problems.push(
                "server.claim_timeout must stay under Sume's 10 s delivery timeout".to_owned(),
            );
        }
        if server.max_connections == 0 {
            problems.push("server.max_connections must be at least 1".to_owned());
        }
        if server.max_inflight_body_bytes < server.max_body_bytes {
            problems.push(format!(
                "server.max_inflight_body_bytes ({}) must be at least server.max_body_bytes ({}): \
                 a largest body could never be read",
                server.max_inflight_body_bytes, server.max_body_bytes
            ));
        }
        if server.max_body_bytes > MAX_BODY_BYTES {
            problems.push(format!(
                "server.max_body_bytes must be at most {MAX_BODY_BYTES} (64 MiB)"
            ));
        }
        if self.database.max_batch == 0 {
            problems.push("database.max_batch must be at least 1".to_owned());
        }
        if let Some(handler) = &self.handler {
            handler.validate(problems);
        }
        let retention = &self.retention;
        if retention.ttl.is_zero() || retention.interval.is_zero() {
            problems
                .push("retention.ttl and retention.interval must be greater than zero".to_owned());
        }
        if retention.dedupe_ttl < retention.ttl {
            problems.push(format!(
                "retention.dedupe_ttl ({}) must be at least retention.ttl ({}): a job's body \
                 cannot outlive the memory of its job_id",
                humantime::format_duration(retention.dedupe_ttl),
                humantime::format_duration(retention.ttl)
            ));
        }
        if let Some(api) = &self.sume_api {
            api.validate(problems);
        }
    }
}

impl SumeApiConfig {
    /// The API key from `api_key_file`.
    pub fn api_key(&self) -> anyhow::Result<Secret> {
        read_secret_file("sume_api.api_key_file", &self.api_key_file)
    }

    fn validate(&self, problems: &mut Vec<String>) {
        let uri = self.base_url.parse::<hyper::Uri>();
        if let Err(error) = &uri {
            problems.push(format!(
                "sume_api.base_url: invalid URL {:?}: {error}",
                self.base_url
            ));
        }
        let uri = uri.ok();
        let usable = uri.as_ref().is_some_and(|uri| {
            matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some()
        });
        if uri.is_some() && !usable {
            problems.push(format!(
                "sume_api.base_url must be an http(s):// URL with a host, got {:?}",
                self.base_url
            ));
        }
        if !(self.max_requests_per_second > 0.0 && self.max_requests_per_second.is_finite()) {
            problems.push("sume_api.max_requests_per_second must be a positive number".to_owned());
        }
        if self.terminal_statuses.is_empty() {
            problems.push("sume_api.terminal_statuses must list at least one status".to_owned());
        }
        if self.give_up_after <= self.reconcile_after {
            problems.push(
                "sume_api.give_up_after must be longer than sume_api.reconcile_after".to_owned(),
            );
        }
        for (key, value) in [
            ("sume_api.request_timeout", self.request_timeout),
            ("sume_api.poll_backoff", self.poll_backoff),
        ] {
            if value.is_zero() {
                problems.push(format!("{key} must be greater than zero"));
            }
        }
        if self.max_poll_backoff < self.poll_backoff {
            problems.push(
                "sume_api.max_poll_backoff must be at least sume_api.poll_backoff".to_owned(),
            );
        }
    }

    /// `{base_url}/v1/jobs/{job_id}/{action}`, with the job_id percent-encoded.
    pub fn job_url(&self, job_id: &JobId, action: &str) -> String {
        format!(
            "{}/v1/jobs/{}/{action}",
            self.base_url.trim_end_matches('/'),
            job_id.url_segment()
        )
    }
}

impl HandlerConfig {
    fn validate(&self, problems: &mut Vec<String>) {
        if self.timeout.is_zero() {
            problems.push("handler.timeout must be greater than zero".to_owned());
        }
        if self.concurrency == 0 {
            problems.push("handler.concurrency must be at least 1".to_owned());
        }
        if self.max_attempts == 0 {
            problems.push("handler.max_attempts must be at least 1".to_owned());
        }
        if self.backoff.is_zero() || self.max_backoff < self.backoff {
            problems.push(
                "handler.backoff must be greater than zero and no more than handler.max_backoff"
                    .to_owned(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Config> {
        Config::parse(text, Path::new("/base"))
    }

    fn error(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    const MINIMAL: &str = "[signature]\nsecrets = [\"whsec_a\"]\n";

    /// Every problem the checks find is reported at once, not the first alone.
    #[test]
    fn every_problem_is_reported_at_once() {
        let text = "[signature]\nsecrets = [\"whsec_0123456789abcdef\"]\n\
                    [server]\nmax_connections = 0\nmax_body_bytes = 0\n\
                    [handler]\ncommand = [\"true\"]\nconcurrency = 0\n";
        let message = error(text);
        for problem in [
            "3 problems",
            "server.max_connections must be at least 1",
            "server.max_body_bytes must be greater than zero",
            "handler.concurrency must be at least 1",
        ] {
            assert!(
                message.contains(problem),
                "{problem:?} missing from {message}"
            );
        }
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.server.webhook_path, "/sume/webhook");
        assert_eq!(config.signature.tolerance, Duration::from_secs(300));
        assert_eq!(config.database.synchronous, Synchronous::Full);
        assert!(config.handler.is_none());
    }

    #[test]
    fn relative_database_path_is_taken_from_the_config_dir() {
        let config = parse(&format!("{MINIMAL}[database]\npath = \"ledger.db\"\n")).unwrap();
        assert_eq!(config.database.path, Path::new("/base/ledger.db"));
    }

    #[test]
    fn refuses_missing_or_empty_secret() {
        assert!(error("[signature]\n").contains("signature.secrets: no secret"));
        let empty = parse("[signature]\nsecrets = [\"a\", \"\"]\n").unwrap();
        let e = empty.signing_secrets().unwrap_err().to_string();
        assert!(e.contains("signature.secrets[1] is empty"), "{e}");
        assert!(error("").contains("signature"));
    }

    /// Regression: the secrets file was read by every command, so with a systemd credential
    /// (present only while the unit runs) `jobs list` and `vacuum` failed on the host.
    #[test]
    fn the_secrets_file_is_read_only_by_who_needs_the_secrets() {
        let config = parse("[signature]\nsecrets_file = \"/nonexistent/secrets\"\n").unwrap();
        let e = config.signing_secrets().unwrap_err().to_string();
        assert!(
            e.contains("signature.secrets_file: cannot read /nonexistent/secrets"),
            "{e}"
        );
    }

    /// Regression: the published example secret was live on any address.
    #[test]
    fn the_example_secret_is_refused_off_loopback() {
        let on = |listen: &str| {
            parse(&format!(
                "[server]\nlisten = \"{listen}\"\n[signature]\nsecrets = [\"{EXAMPLE_SECRET}\"]\n"
            ))
            .unwrap()
        };
        assert!(on("127.0.0.1:8080").signing_secrets().is_ok());
        assert!(on("127.0.0.1:8080").warnings()[0].contains("example secret"));
        let e = on("0.0.0.0:8080")
            .signing_secrets()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("example secret") && e.contains("0.0.0.0:8080"),
            "{e}"
        );
        assert!(on("[::]:8080").signing_secrets().is_err());
    }

    #[test]
    fn secrets_file_lines_are_secrets() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("secrets"),
            "# rotation\nwhsec_new\n\n  whsec_old  \n",
        )
        .unwrap();
        let config = Config::parse(
            "[signature]\nsecrets = [\"whsec_inline\"]\nsecrets_file = \"secrets\"\n",
            dir.path(),
        )
        .unwrap();
        let secrets = config.signing_secrets().unwrap();
        let secrets: Vec<&[u8]> = secrets.iter().map(AsRef::as_ref).collect();
        assert_eq!(
            secrets,
            [
                b"whsec_inline".as_slice(),
                b"whsec_new".as_slice(),
                b"whsec_old".as_slice()
            ]
        );
    }

    #[test]
    fn refuses_unknown_key_naming_it() {
        let e = error(&format!(
            "{MINIMAL}[server]\nlisten_addr = \"127.0.0.1:1\"\n"
        ));
        assert!(e.contains("listen_addr"), "{e}");
        let e = error(&format!("{MINIMAL}[srever]\n"));
        assert!(e.contains("srever"), "{e}");
    }

    #[test]
    fn refuses_bad_duration_naming_the_key() {
        let e = error("[signature]\nsecrets = [\"a\"]\ntolerance = \"5 parsecs\"\n");
        assert!(
            e.contains("tolerance") && e.contains("invalid duration"),
            "{e}"
        );
    }

    #[test]
    fn durations_are_human() {
        let config = parse(&format!(
            "{MINIMAL}[sweeper]\ninterval = \"1m 30s\"\nstale_after = \"30d\"\n"
        ))
        .unwrap();
        assert_eq!(config.sweeper.interval, Duration::from_secs(90));
        assert_eq!(config.sweeper.stale_after, Duration::from_secs(30 * 86400));
    }

    #[test]
    fn handler_needs_exactly_one_target() {
        assert!(error(&format!("{MINIMAL}[handler]\n")).contains("handler: set one of"));
        let both =
            format!("{MINIMAL}[handler]\ncommand = [\"true\"]\nurl = \"http://127.0.0.1:1/\"\n");
        assert!(error(&both).contains("not both"));
        let https = format!("{MINIMAL}[handler]\nurl = \"https://example.com/\"\n");
        assert!(error(&https).contains("http:// URL"));
        let ok = parse(&format!("{MINIMAL}[handler]\ncommand = [\"true\"]\n")).unwrap();
        assert_eq!(
            ok.handler.unwrap().kind,
            HandlerKind::Command(vec!["true".into()])
        );
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let config = parse(MINIMAL).unwrap();
        assert!(!format!("{config:?}").contains("whsec_a"));
    }

    #[test]
    fn dedupe_ttl_must_cover_ttl_and_short_ones_warn() {
        let e = error(&format!(
            "{MINIMAL}[retention]\nttl = \"30d\"\ndedupe_ttl = \"1d\"\n"
        ));
        assert!(
            e.contains("retention.dedupe_ttl (1day) must be at least retention.ttl"),
            "{e}"
        );
        let config = parse(&format!(
            "{MINIMAL}[retention]\nttl = \"1d\"\ndedupe_ttl = \"2d\"\n"
        ))
        .unwrap();
        assert!(config.warnings()[0].contains("retention.dedupe_ttl is 2days"));
        assert!(parse(MINIMAL).unwrap().warnings().is_empty());
    }

    #[test]
    fn sume_api_reads_its_key_file_and_checks_the_url() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("key"), "sk_live_123\n").unwrap();
        let section = |url: &str| {
            format!("{MINIMAL}[sume_api]\nbase_url = \"{url}\"\napi_key_file = \"key\"\n")
        };
        let config = Config::parse(&section("https://api.sume.example/"), dir.path()).unwrap();
        let api = config.sume_api.unwrap();
        assert_eq!(api.api_key().unwrap().expose(), "sk_live_123");
        assert_eq!(
            api.job_url(&JobId::parse("job 1/x").unwrap(), "status"),
            "https://api.sume.example/v1/jobs/job%201%2Fx/status"
        );
        let e = format!(
            "{:#}",
            Config::parse(&section("ftp://x"), dir.path()).unwrap_err()
        );
        assert!(e.contains("sume_api.base_url"), "{e}");
        std::fs::write(dir.path().join("key"), "  \n").unwrap();
        let config = Config::parse(&section("https://x"), dir.path()).unwrap();
        let e = format!("{:#}", config.sume_api.unwrap().api_key().unwrap_err());
        assert!(
            e.contains("sume_api.api_key_file") && e.contains("is empty"),
            "{e}"
        );
    }

    #[test]
    fn secret_matches_only_itself() {
        let token = Secret::new("t0ken");
        assert!(token.matches("t0ken"));
        assert!(!token.matches("t0ke") && !token.matches("t0ken ") && !token.matches(""));
    }

    #[test]
    fn absurd_durations_and_limits_are_refused() {
        for (section, key) in [
            ("sweeper", "stale_after = \"0s\""),
            ("sweeper", "interval = \"0s\""),
            ("database", "busy_timeout = \"0s\""),
            ("server", "max_connections = 0"),
            ("server", "max_inflight_body_bytes = 1000"),
            (
                "server",
                "max_body_bytes = 100000000\nmax_inflight_body_bytes = 200000000",
            ),
        ] {
            let e = error(&format!("{MINIMAL}[{section}]\n{key}\n"));
            let name = key.split(' ').next().unwrap();
            assert!(e.contains(name), "{key}: {e}");
        }
        let e = error(&format!(
            "{MINIMAL}[sweeper]\ninterval = \"1000000years\"\n"
        ));
        assert!(e.contains("longer than 100 years"), "{e}");
        assert!(e.contains("line 4") && e.contains("`interval`"), "{e}");
    }

    /// Regression: `toml` quotes the offending line, and the journal kept it: a typo on the
    /// secrets line published the secret.
    #[test]
    fn toml_errors_never_echo_a_secret() {
        for text in [
            "[signature]\nsecrets = [\"whsec_live_abc123\" \"whsec_live_def456\"]\n",
            "[signature]\nsecrets = \"whsec_live_abc123\"\n",
            "[signature]\nsecrets = [\"whsec_live_abc123\",\n  whsec_live_def456]\n",
        ] {
            let e = error(text);
            assert!(!e.contains("whsec_live"), "{e}");
            assert!(e.contains("line "), "{e}");
        }
        // Outside [signature] the message keeps its detail.
        let e = error(&format!(
            "{MINIMAL}[database]\nsynchronous = \"sometimes\"\n"
        ));
        assert!(
            e.contains("sometimes") && e.contains("`synchronous`"),
            "{e}"
        );
    }

    #[test]
    fn example_config_is_valid() {
        let text = include_str!("../config.example.toml");
        Config::parse(text, Path::new("/base")).unwrap();
    }
}
