//! `[database]`: the SQLite file or the PostgreSQL URL, and how the ledger commits.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Deserializer};

use super::parsing::duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// An acknowledged claim survives power loss: it is answered only after an fsync of the WAL
    /// that began after its commit.
    Full,
    /// fsync only at checkpoints: survives a process crash, may lose the last commits on power loss.
    Normal,
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
pub(super) fn host_name() -> String {
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
