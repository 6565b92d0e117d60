//! `[handler]`: read as the file has it, resolved once into what runs a job and its limits.

use std::time::Duration;

use serde::Deserialize;

use super::parsing::duration;

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

impl HandlerKind {
    /// A command handler: `argv[0]` must name a program.
    pub fn command(argv: Vec<String>) -> Result<HandlerKind, String> {
        if argv.first().is_none_or(|program| program.is_empty()) {
            return Err("handler.command must name a program".into());
        }
        Ok(HandlerKind::Command(argv))
    }

    /// An HTTP handler: an http:// URL with a host.
    pub fn url(url: String) -> Result<HandlerKind, String> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|error| format!("handler.url: invalid URL {url:?}: {error}"))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(format!(
                "handler.url must be an http:// URL with a host, got {url:?}"
            ));
        }
        Ok(HandlerKind::Url(url))
    }

    /// For people: the program, or the URL without any user:password.
    pub fn describe(&self) -> String {
        match self {
            HandlerKind::Command(argv) => format!("command {}", argv.join(" ")),
            HandlerKind::Url(url) => match url.parse::<hyper::Uri>() {
                Ok(uri) => format!(
                    "url http://{}{}{}",
                    uri.host().unwrap_or("?"),
                    uri.port().map(|p| format!(":{p}")).unwrap_or_default(),
                    uri.path()
                ),
                Err(_) => "url (unparsable)".into(),
            },
        }
    }
}

impl TryFrom<RawHandlerConfig> for HandlerConfig {
    type Error = String;

    fn try_from(raw: RawHandlerConfig) -> Result<Self, String> {
        let kind = match (raw.command, raw.url) {
            (Some(_), Some(_)) => {
                return Err("handler: set exactly one of `command` and `url`, not both".into())
            }
            (None, None) => return Err("handler: set one of `command` or `url`".into()),
            (Some(command), None) => HandlerKind::command(command)?,
            (None, Some(url)) => HandlerKind::url(url)?,
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

impl HandlerConfig {
    pub(super) fn validate(&self, problems: &mut Vec<String>) {
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
