//! `[handler]`: read as the file has it, resolved once into what runs a job and its limits.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::parsing::duration;
use super::Secret;

/// `[handler]`, resolved: what runs a job, and its limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawHandlerConfig")]
pub struct HandlerConfig {
    pub kind: HandlerKind,
    /// CA certificates (PEM) an https handler URL may be signed by, besides the system's.
    pub ca_file: Option<PathBuf>,
    pub timeout: Duration,
    pub concurrency: usize,
    pub max_attempts: u32,
    /// Delay before the first retry; doubles each attempt, with jitter, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// When the handler's downstream looks down, and how work resumes after it (the hold).
    pub hold: HoldConfig,
}

/// `[handler]`'s keys for the hold (`src/hold/`): when to stop starting attempts because the
/// handler's downstream is down, how to probe it, and how fast to start again.
#[derive(Debug, Clone, PartialEq)]
pub struct HoldConfig {
    /// Different jobs failing in a row, with no success between, that open a hold; 0: never hold.
    pub hold_after: u32,
    /// The first wait before a probe; doubles per failed probe up to `max_probe_interval`.
    pub probe_interval: Duration,
    pub max_probe_interval: Duration,
    /// After a hold, the slots open one, then double every `ramp` up to `concurrency`.
    pub ramp: Duration,
    /// Attempts started per second at most, in normal times too; `None`: no limit.
    pub max_per_second: Option<f64>,
    /// A command's exit statuses that blame the job, not the downstream: never count toward a hold.
    pub content_exit_statuses: Vec<i32>,
}

impl Default for HoldConfig {
    fn default() -> Self {
        HoldConfig {
            hold_after: default_hold_after(),
            probe_interval: default_probe_interval(),
            max_probe_interval: default_max_probe_interval(),
            ramp: default_ramp(),
            max_per_second: None,
            content_exit_statuses: default_content_exit_statuses(),
        }
    }
}

/// `[handler]` as the file has it: exactly one of `command` and `url`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHandlerConfig {
    /// Program and arguments, run directly (no shell) with the stored body on stdin.
    command: Option<Vec<String>>,
    /// An `http://` or `https://` URL the stored body is POSTed to.
    url: Option<String>,
    /// CA certificates (PEM) an https `url` may be signed by, besides the system's.
    ca_file: Option<PathBuf>,
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
    #[serde(default = "default_hold_after")]
    hold_after: u32,
    #[serde(default = "default_probe_interval", deserialize_with = "duration")]
    probe_interval: Duration,
    #[serde(default = "default_max_probe_interval", deserialize_with = "duration")]
    max_probe_interval: Duration,
    #[serde(default = "default_ramp", deserialize_with = "duration")]
    ramp: Duration,
    max_per_second: Option<f64>,
    #[serde(default = "default_content_exit_statuses")]
    content_exit_statuses: Vec<i32>,
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
fn default_hold_after() -> u32 {
    5
}
fn default_probe_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_max_probe_interval() -> Duration {
    Duration::from_secs(300)
}
fn default_ramp() -> Duration {
    Duration::from_secs(5)
}
/// EX_DATAERR (sysexits.h): "the input data was incorrect".
fn default_content_exit_statuses() -> Vec<i32> {
    vec![65]
}

/// What a handler does with a job, once validated.
#[derive(Clone, PartialEq, Eq)]
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

    /// An HTTP handler: an http:// or https:// URL with a host; a `user:password@` in it is
    /// sent as Basic credentials (see [`HandlerUrl`]).
    pub fn url(url: String) -> Result<HandlerKind, String> {
        HandlerUrl::parse(&url)?;
        Ok(HandlerKind::Url(url))
    }

    /// For people: the program, or the URL without any user:password or query.
    pub fn describe(&self) -> String {
        match self {
            HandlerKind::Command(argv) => format!("command {}", argv.join(" ")),
            HandlerKind::Url(url) => match HandlerUrl::parse(url) {
                Ok(target) => format!(
                    "url {}://{}{}",
                    target.uri.scheme_str().unwrap_or("http"),
                    target.uri.authority().map_or("?", |a| a.as_str()),
                    target.uri.path()
                ),
                Err(_) => "url (unparsable)".into(),
            },
        }
    }
}

/// As [`HandlerKind::describe`]: a URL's password never reaches a debug print.
impl std::fmt::Debug for HandlerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A handler URL as it is sent: the address without its userinfo, which becomes an
/// `Authorization: Basic` header (a client would otherwise drop it without a word).
pub struct HandlerUrl {
    pub uri: hyper::Uri,
    /// User and password, percent-decoded.
    pub basic_auth: Option<(String, Secret)>,
}

impl HandlerUrl {
    pub fn parse(url: &str) -> Result<HandlerUrl, String> {
        // Never the URL itself in a message: it may hold a password.
        let uri: hyper::Uri = url
            .parse()
            .map_err(|error| format!("handler.url: not a valid URL: {error}"))?;
        let (Some(scheme @ ("http" | "https")), Some(authority)) =
            (uri.scheme_str(), uri.authority())
        else {
            return Err("handler.url must be an http:// or https:// URL with a host".to_owned());
        };
        let Some((userinfo, host)) = authority.as_str().rsplit_once('@') else {
            return Ok(HandlerUrl {
                uri,
                basic_auth: None,
            });
        };
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        let decode = |part: &str| {
            percent_encoding::percent_decode_str(part)
                .decode_utf8()
                .map(|text| text.into_owned())
                .map_err(|_| {
                    "handler.url: its user:password@ is not UTF-8 once percent-decoded".to_owned()
                })
        };
        let (user, password) = (decode(user)?, decode(password)?);
        if user.contains(':') {
            return Err(
                "handler.url: a user name may not hold ':' (Basic credentials cannot carry it)"
                    .to_owned(),
            );
        }
        let path = uri.path_and_query().map_or("/", |path| path.as_str());
        let uri = format!("{scheme}://{host}{path}")
            .parse()
            .map_err(|error| format!("handler.url: not a valid URL: {error}"))?;
        Ok(HandlerUrl {
            uri,
            basic_auth: Some((user, Secret::new(password))),
        })
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
        if raw.ca_file.is_some()
            && !matches!(&kind, HandlerKind::Url(url) if url.starts_with("https:"))
        {
            return Err("handler.ca_file is for an https:// handler.url only".into());
        }
        Ok(HandlerConfig {
            kind,
            ca_file: raw.ca_file,
            timeout: raw.timeout,
            concurrency: raw.concurrency,
            max_attempts: raw.max_attempts,
            backoff: raw.backoff,
            max_backoff: raw.max_backoff,
            hold: HoldConfig {
                hold_after: raw.hold_after,
                probe_interval: raw.probe_interval,
                max_probe_interval: raw.max_probe_interval,
                ramp: raw.ramp,
                max_per_second: raw.max_per_second,
                content_exit_statuses: raw.content_exit_statuses,
            },
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
        let hold = &self.hold;
        if hold.probe_interval.is_zero() || hold.max_probe_interval < hold.probe_interval {
            problems.push(
                "handler.probe_interval must be greater than zero and no more than handler.max_probe_interval"
                    .to_owned(),
            );
        }
        if let Some(rate) = hold.max_per_second {
            if !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0) {
                problems.push(format!(
                    "handler.max_per_second must be a number above 0 and at most 1000000 (leave it out for no limit), got {rate}"
                ));
            }
        }
        if let Some(status) = hold
            .content_exit_statuses
            .iter()
            .find(|status| !(1..=255).contains(*status))
        {
            problems.push(format!(
                "handler.content_exit_statuses: {status} is not an exit status (1 to 255)"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(extra: &str) -> Vec<String> {
        let config: HandlerConfig =
            toml::from_str(&format!("command = [\"true\"]\n{extra}")).expect("parses");
        let mut problems = Vec::new();
        config.validate(&mut problems);
        problems
    }

    #[test]
    fn hold_keys_have_defaults_that_are_on() {
        let config: HandlerConfig = toml::from_str("command = [\"true\"]").unwrap();
        assert_eq!(config.hold, HoldConfig::default());
        assert_eq!(config.hold.hold_after, 5);
        assert_eq!(config.hold.max_per_second, None);
        assert!(problems("").is_empty());
    }

    #[test]
    fn hold_keys_are_validated() {
        let bad = problems("probe_interval = \"10m\"\nmax_probe_interval = \"1m\"\n");
        assert!(bad[0].contains("handler.probe_interval"), "{bad:?}");
        let bad = problems("max_per_second = 0.0\n");
        assert!(bad[0].contains("handler.max_per_second"), "{bad:?}");
        let bad = problems("content_exit_statuses = [65, 0]\n");
        assert!(bad[0].contains("0 is not an exit status"), "{bad:?}");
        assert!(problems("max_per_second = 2.5\nhold_after = 0\nramp = \"0s\"\n").is_empty());
    }
}
