//! `[database]`: the SQLite file or the PostgreSQL URL, and how the ledger commits.

use std::fmt;
use std::path::{Path, PathBuf};
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

/// What the service checks of the ledger's pages at each start: in the background once it
/// serves, or before (`check_before_serving`, or after a check found damage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckAtStart {
    /// `PRAGMA quick_check`: every page's structure, without matching indexes to their tables.
    Quick,
    /// `PRAGMA integrity_check`: also that every index matches its table. Slower.
    Full,
    Off,
}

/// `[database]` as the file writes it; resolved into a [`LedgerConfig`] at load.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawDatabaseConfig {
    path: PathBuf,
    url: Option<PostgresUrl>,
    url_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    synchronous: Synchronous,
    #[serde(deserialize_with = "duration")]
    busy_timeout: Duration,
    max_batch: usize,
    check_at_start: CheckAtStart,
    check_before_serving: bool,
}

impl Default for RawDatabaseConfig {
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
            check_before_serving: false,
        }
    }
}

/// Which ledger, decided once at load: `database.url` or `url_file` names a PostgreSQL
/// database, otherwise the ledger is the SQLite file at `database.path`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawDatabaseConfig")]
pub enum LedgerConfig {
    Sqlite(SqliteConfig),
    Postgres(PostgresConfig),
}

#[derive(Debug, Clone)]
pub struct SqliteConfig {
    pub path: PathBuf,
    pub synchronous: Synchronous,
    /// How long a write waits for a lock held by another process before it gives up (503).
    pub busy_timeout: Duration,
    /// Most claims and state changes committed in one transaction (group commit). 1 turns group
    /// commit off, which only the benchmark has reason to do.
    pub max_batch: usize,
    pub check_at_start: CheckAtStart,
    /// Whether `check_at_start` runs before the service serves (the start then takes as long as
    /// reading the ledger) rather than in the background after.
    pub check_before_serving: bool,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig::from(RawDatabaseConfig::default())
    }
}

/// The SQLite settings of `[database]` (its PostgreSQL keys are not looked at).
impl From<RawDatabaseConfig> for SqliteConfig {
    fn from(raw: RawDatabaseConfig) -> Self {
        Self {
            path: raw.path,
            synchronous: raw.synchronous,
            busy_timeout: raw.busy_timeout,
            max_batch: raw.max_batch,
            check_at_start: raw.check_at_start,
            check_before_serving: raw.check_before_serving,
        }
    }
}

/// A PostgreSQL database that several receivers may share.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    pub url: PostgresUrlSource,
    /// CA certificates (PEM) that PostgreSQL's TLS certificate may chain to, besides the
    /// system's (a managed provider's bundle); used with `sslmode=require`.
    pub ca_file: Option<PathBuf>,
    /// Most claims committed in one transaction (group commit).
    pub max_batch: usize,
    /// This receiver's name on the leases it takes: the host name and the listen port, unique
    /// among receivers and the same after a restart. Set at load from `server.listen`, and by
    /// `run` from the port it listens on ([`LedgerConfig::name_receiver`]).
    pub receiver: String,
}

/// Where the URL comes from: the config file, or a file of its own that keeps the password out
/// of the config file and is read when the ledger is opened.
#[derive(Debug, Clone)]
pub enum PostgresUrlSource {
    Given(PostgresUrl),
    File(PathBuf),
}

impl TryFrom<RawDatabaseConfig> for LedgerConfig {
    type Error = String;

    fn try_from(mut raw: RawDatabaseConfig) -> Result<Self, String> {
        let url = match (raw.url.take(), raw.url_file.take()) {
            (Some(_), Some(_)) => return Err("database: set url or url_file, not both".into()),
            (Some(url), None) => PostgresUrlSource::Given(url),
            (None, Some(file)) => PostgresUrlSource::File(file),
            (None, None) => return Ok(LedgerConfig::Sqlite(SqliteConfig::from(raw))),
        };
        Ok(LedgerConfig::Postgres(PostgresConfig {
            url,
            ca_file: raw.ca_file,
            max_batch: raw.max_batch,
            receiver: String::new(),
        }))
    }
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig::Sqlite(SqliteConfig::default())
    }
}

impl LedgerConfig {
    /// Names this receiver's leases after the host and `port`, the port it listens on: two
    /// receivers of one host cannot listen on the same port, so neither takes the other's
    /// leases for its own.
    pub fn name_receiver(&mut self, port: u16) {
        if let LedgerConfig::Postgres(postgres) = self {
            postgres.receiver = format!("{}:{port}", crate::process::host_name());
        }
    }

    /// The SQLite file, if that is the ledger.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            LedgerConfig::Sqlite(sqlite) => Some(&sqlite.path),
            LedgerConfig::Postgres(_) => None,
        }
    }

    /// `database.ca_file`, if the ledger is PostgreSQL and one is set.
    pub fn ca_file(&self) -> Option<&Path> {
        match self {
            LedgerConfig::Postgres(postgres) => postgres.ca_file.as_deref(),
            LedgerConfig::Sqlite(_) => None,
        }
    }

    pub(super) fn max_batch(&self) -> usize {
        match self {
            LedgerConfig::Sqlite(sqlite) => sqlite.max_batch,
            LedgerConfig::Postgres(postgres) => postgres.max_batch,
        }
    }

    /// Takes the relative paths in it from `base_dir`.
    pub(super) fn resolve_paths(&mut self, base_dir: &Path) {
        match self {
            LedgerConfig::Sqlite(sqlite) => sqlite.path = base_dir.join(&sqlite.path),
            LedgerConfig::Postgres(postgres) => {
                if let PostgresUrlSource::File(file) = &mut postgres.url {
                    *file = base_dir.join(&*file);
                }
                if let Some(file) = &mut postgres.ca_file {
                    *file = base_dir.join(&*file);
                }
            }
        }
    }
}

impl PostgresConfig {
    /// The URL, read from its file if that is how it is given.
    pub fn url(&self) -> anyhow::Result<PostgresUrl> {
        let file = match &self.url {
            PostgresUrlSource::Given(url) => return Ok(url.clone()),
            PostgresUrlSource::File(file) => file,
        };
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("database.url_file: cannot read {}", file.display()))?;
        PostgresUrl::parse(text.trim()).map_err(|error| {
            anyhow::anyhow!(
                "{} (in {})",
                error.replace("database.url", "database.url_file"),
                file.display()
            )
        })
    }
}

/// A PostgreSQL connection URL (or key=value string), checked at load. Its Debug and Display
/// forms show host, port and database only: the password never reaches a log line.
#[derive(Clone)]
pub struct PostgresUrl(Box<tokio_postgres::Config>);

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
        Ok(PostgresUrl(Box::new(config)))
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
