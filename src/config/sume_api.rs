//! `[sume_api]`: reconciliation by polling Sume for expected jobs whose webhook never came.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::parsing::{duration, DAY_SECS};
use super::secret::{read_secret_file, Secret};

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

impl SumeApiConfig {
    /// The API key from `api_key_file`.
    pub fn api_key(&self) -> anyhow::Result<Secret> {
        read_secret_file("sume_api.api_key_file", &self.api_key_file)
    }

    pub(super) fn validate(&self, problems: &mut Vec<String>) {
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
}
