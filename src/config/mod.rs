//! The TOML configuration: every key, its default, and the checks that refuse a bad file at start.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

mod admin;
mod credentials;
mod database;
mod handler;
mod parsing;
mod route_match;
mod routes;
mod secret;
mod sume_api;
mod tls;
mod traces;

pub use admin::{AdminConfig, NamedToken, TokenRole, DEFAULT_DUE_JOB_LIMIT};
pub use credentials::{AdminTokens, Credentials, Unread};
pub use database::{
    CheckAtStart, LedgerConfig, PostgresConfig, PostgresUrl, PostgresUrlSource, SqliteConfig,
    Synchronous,
};
pub use handler::{HandlerConfig, HandlerKind, HandlerUrl, HoldConfig};
use parsing::{describe_toml_error, duration, DAY_SECS};
pub use route_match::{BodyFields, EventTypePattern, FieldCondition, RouteMatch};
pub use routes::{unmatched_error, Route, Routes, Selection, Unmatched, MAX_ROUTES};
use routes::{RouteTable, RoutingTable};
pub use secret::{redact_url, Secret};
pub use sume_api::SumeApiConfig;
pub use tls::{AcmeChallenge, AcmeConfig, CertificateSource, Listener, TlsConfig, LETS_ENCRYPT};
pub use traces::{TracingConfig, TracingToml};

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
    pub database: LedgerConfig,
    /// No `[handler]` section: jobs stay `claimed` for an external consumer. Also in
    /// [`Config::routes`], as the route `default`.
    pub handler: Option<HandlerConfig>,
    /// `[[route]]` and `[routing]` as the file has them: resolved into `routes` at load, and
    /// emptied then.
    #[serde(default, rename = "route")]
    route_tables: Vec<toml::Spanned<RouteTable>>,
    routing: Option<RoutingTable>,
    /// Where each event goes: the `[[route]]`s, or `[handler]` as the one route `default`
    /// taking every event, or none (neither section: jobs stay claimed).
    #[serde(skip)]
    pub routes: Routes,
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
    /// `[tracing]` as written; what runs is [`Config::tracing`].
    #[serde(rename = "tracing")]
    pub tracing_toml: Option<TracingToml>,
    /// `[tracing]` merged with the `OTEL_*` variables at parse time; `None`: tracing is off.
    #[serde(skip)]
    pub tracing: Option<TracingConfig>,
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
    /// `[server.tls]`: HTTPS instead of plain HTTP.
    pub tls: Option<TlsConfig>,
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
            tls: None,
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

/// Sume's deliveries are small JSON documents; a limit past this only serves a flood.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

impl Config {
    /// Reads, parses and validates the file; the error names the offending key.
    /// Credential files (secrets, API key, admin token) are not read here: only the commands
    /// that need them read them (`serve` once per start: [`Credentials`]).
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
        config.database.name_receiver(config.server.listen.port());
        let mut problems = Vec::new();
        config.tracing = TracingConfig::resolve(
            config.tracing_toml.as_ref(),
            |name| std::env::var(name).ok(),
            &mut problems,
        );
        config.routes = routes::resolve(
            std::mem::take(&mut config.route_tables),
            config.routing.take(),
            config.handler.as_ref(),
            text,
            &mut problems,
        );
        config.validate(&mut problems);
        match problems.len() {
            0 => Ok(config),
            1 => Err(anyhow::anyhow!(problems.remove(0))),
            n => bail!("{n} problems:\n  {}", problems.join("\n  ")),
        }
    }

    /// The config read again from the file it came from (for a reload); this config as it is
    /// when it was not read from a file.
    pub fn reload(&self) -> anyhow::Result<Config> {
        match &self.source {
            Some(path) => Config::load(path),
            None => Ok(self.clone()),
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
        if let Some(i) = secrets.iter().position(|s| s.expose().trim().is_empty()) {
            bail!(
                "signature.secrets[{i}] is empty: an empty secret would accept forged deliveries"
            );
        }
        if secrets.iter().any(|s| s.expose() == EXAMPLE_SECRET)
            && !self.server.listen.ip().is_loopback()
        {
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

    /// The listeners that speak TLS, with their tables: the webhook's first.
    pub fn tls_listeners(&self) -> impl Iterator<Item = (Listener, &TlsConfig)> {
        let admin = self.admin.as_ref().and_then(|admin| admin.tls.as_ref());
        let webhook = self.server.tls.as_ref();
        (webhook.map(|tls| (Listener::Webhook, tls)))
            .into_iter()
            .chain(admin.map(|tls| (Listener::Admin, tls)))
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
            .any(|secret| secret.expose() == EXAMPLE_SECRET)
        {
            warnings.push(format!(
                "signature.secrets holds the example secret {EXAMPLE_SECRET:?}, published in the \
                 README: fine for a try on loopback, refused on any other address"
            ));
        }
        if !self.server.listen.ip().is_loopback() && self.server.tls.is_none() {
            warnings.push(format!(
                "server.listen {} is not a loopback address and [server.tls] is not set: \
                 deliveries cross the network in clear unless a TLS proxy is in front",
                self.server.listen
            ));
        }
        if !self.server.listen.ip().is_loopback() && self.server.expose_metrics {
            warnings.push(format!(
                "server.listen {} is not a loopback address and serves /metrics to anyone who \
                 reaches it (server.expose_metrics, on by default): set it to false and scrape \
                 the admin listener",
                self.server.listen
            ));
        }
        for route in self.routes.list() {
            let HandlerKind::Url(url) = &route.handler.kind else {
                continue;
            };
            let basic = HandlerUrl::parse(url).is_ok_and(|target| target.basic_auth.is_some());
            if basic && url.starts_with("http:") {
                warnings.push(format!(
                    "{}: its user:password@ is sent as Basic credentials over plain http, \
                     readable on the way: use https",
                    route.handler_key("url")
                ));
            }
        }
        if let Some(admin) = &self.admin {
            if admin.token_file.is_none() {
                warnings.push("[admin] has no token_file: the admin listener is off".into());
            } else if !admin.listen.ip().is_loopback() {
                warnings.push(format!(
                    "admin.listen {} is not a loopback address: its /metrics needs no token, \
                     only one of the console's names as Host, which anyone may send: let a \
                     firewall keep the port to the scraper and the operators",
                    admin.listen
                ));
                if !admin.has_tls() {
                    // Refused without `allow_plain_http` (see `validate`): allowed, still said.
                    warnings.push(format!(
                        "admin.listen {} is not a loopback address and speaks plain HTTP \
                         (admin.allow_plain_http): tokens and the console's cookie cross the \
                         network readable",
                        admin.listen
                    ));
                }
            }
        }
        warnings
    }

    fn resolve_paths(&mut self, base_dir: &Path) {
        self.database.resolve_paths(base_dir);
        if let Some(tracing) = self.tracing_toml.as_mut() {
            TracingConfig::resolve_paths(tracing, base_dir);
        }
        let admin_tls = self.admin.as_mut().and_then(|admin| admin.tls.as_mut());
        for tls in self.server.tls.iter_mut().chain(admin_tls) {
            tls.resolve_paths(base_dir);
        }
        let (admin_token, admin_read_token) = match self.admin.as_mut() {
            Some(admin) => (admin.token_file.as_mut(), admin.read_token_file.as_mut()),
            None => (None, None),
        };
        let files = [
            self.signature.secrets_file.as_mut(),
            self.sume_api.as_mut().map(|api| &mut api.api_key_file),
            admin_token,
            admin_read_token,
        ];
        for file in files.into_iter().flatten() {
            *file = base_dir.join(&*file);
        }
        let route_handlers = self
            .route_tables
            .iter_mut()
            .map(|table| table.get_mut().handler_mut());
        for handler in self.handler.iter_mut().chain(route_handlers) {
            if let Some(ca_file) = handler.ca_file.as_mut() {
                *ca_file = base_dir.join(&*ca_file);
            }
        }
        for token in self.admin.iter_mut().flat_map(|admin| &mut admin.tokens) {
            token.file = base_dir.join(&token.file);
        }
    }

    fn validate(&self, problems: &mut Vec<String>) {
        if let Some(admin) = &self.admin {
            problems.extend(admin.token_problems());
            let exposed = !admin.listen.ip().is_loopback() && admin.token_file.is_some();
            if exposed && !admin.has_tls() && !admin.allow_plain_http {
                problems.push(format!(
                    "admin.listen {} is not a loopback address, and the admin listener speaks \
                     plain HTTP: its tokens and the console's cookie would cross the network \
                     readable. Listen on loopback (behind a TLS proxy), or set \
                     admin.allow_plain_http = true for a network you trust",
                    admin.listen
                ));
            }
            if admin.due_job_limit.is_zero() {
                problems.push(
                    "admin.due_job_limit must be greater than zero (the console's verdict would \
                     call every due job late)"
                        .to_owned(),
                );
            }
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
        if let LedgerConfig::Sqlite(sqlite) = &self.database {
            if sqlite.busy_timeout.is_zero() {
                problems.push("database.busy_timeout must be greater than zero".to_owned());
            }
        }
        if self.database.max_batch() == 0 {
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

#[cfg(test)]
mod route_tests;
#[cfg(test)]
mod tests;
