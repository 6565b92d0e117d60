//! `[admin]`: the admin listener (the actions API, expected jobs, the console) and its tokens.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::parsing::duration;
use super::secret::{read_secret_file, Secret};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// The bearer token clients of the admin listener must send, and the console's operator
    /// sign-in; no file, no listener. Read when the service starts.
    pub token_file: Option<PathBuf>,
    /// A second token that signs in to the console to look only (no actions).
    pub read_token_file: Option<PathBuf>,
    /// Whether the console offers actions (retry, run now, cancel, pause) to a session signed
    /// in with the operator token. Off: the console only shows.
    #[serde(default)]
    pub console_actions: bool,
    /// Host names the console answers to, besides the listen address, `localhost`,
    /// `127.0.0.1` and `[::1]` (a page asked for under any other Host is refused: DNS
    /// rebinding).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Named console sign-ins (`[[admin.tokens]]`): each token signs in as its name, and the
    /// jobs' history records its actions as `console:<name>`.
    #[serde(default)]
    pub tokens: Vec<NamedToken>,
    /// The console's verdict is `failing` while the oldest due job has waited longer than
    /// this to start (the shipped alert `SumeDueJobsWaiting` has its own threshold).
    #[serde(default = "default_due_job_limit", deserialize_with = "duration")]
    pub due_job_limit: Duration,
    /// `[admin.tls]`: the console and the admin API over HTTPS (and the console's cookie
    /// `Secure`).
    #[serde(default, deserialize_with = "super::tls::admin_tls")]
    pub tls: Option<super::TlsConfig>,
    /// Serve the admin listener in clear on an address that is not loopback (a network of
    /// its own, a VPN). Off: such a listener is refused, as its tokens and cookie would cross
    /// the network readable.
    #[serde(default)]
    pub allow_plain_http: bool,
}

/// One `[[admin.tokens]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedToken {
    pub name: String,
    pub file: PathBuf,
    /// What its sessions may do; a reader only looks (the least, when left out).
    #[serde(default)]
    pub role: TokenRole,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenRole {
    #[default]
    Reader,
    Operator,
}

impl AdminConfig {
    /// Whether the admin listener speaks TLS itself (`[admin.tls]`): its cookies are then
    /// `Secure`, and it may listen off loopback.
    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The token from `token_file`, if one is configured.
    pub fn token(&self) -> anyhow::Result<Option<Secret>> {
        self.token_file
            .as_deref()
            .map(|file| read_secret_file("admin.token_file", file))
            .transpose()
    }

    /// The named tokens, each read from its file.
    pub fn named_tokens(&self) -> anyhow::Result<Vec<(String, TokenRole, Secret)>> {
        self.tokens
            .iter()
            .map(|token| {
                let key = format!("admin.tokens {:?}", token.name);
                Ok((
                    token.name.clone(),
                    token.role,
                    read_secret_file(&key, &token.file)?,
                ))
            })
            .collect()
    }

    /// What is wrong with the named tokens' names: empty, not a plain name, or twice.
    pub fn token_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (index, token) in self.tokens.iter().enumerate() {
            let plain = !token.name.is_empty()
                && token.name.len() <= 64
                && token
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b));
            if !plain {
                problems.push(format!(
                    "admin.tokens: name {:?} must be 1 to 64 letters, digits, '.', '_', '-' or '@'",
                    token.name
                ));
            }
            if self.tokens[..index].iter().any(|t| t.name == token.name) {
                problems.push(format!(
                    "admin.tokens: the name {:?} is given twice",
                    token.name
                ));
            }
        }
        problems
    }

    /// The token from `read_token_file`, if one is configured.
    pub fn read_token(&self) -> anyhow::Result<Option<Secret>> {
        self.read_token_file
            .as_deref()
            .map(|file| read_secret_file("admin.read_token_file", file))
            .transpose()
    }
}

/// `[admin] due_job_limit` when left out.
pub const DEFAULT_DUE_JOB_LIMIT: Duration = Duration::from_secs(10 * 60);

fn default_due_job_limit() -> Duration {
    DEFAULT_DUE_JOB_LIMIT
}

fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8081))
}
