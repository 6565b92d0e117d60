//! `[server.tls]` and `[admin.tls]`: HTTPS on a listener, from a certificate and key in PEM files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::parsing::duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, leaf first (certbot's `fullchain.pem`).
    pub cert_file: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1), readable by the service's user only.
    pub key_file: PathBuf,
    /// How often the two files are looked at for a change (a renewal by certbot, a secret
    /// swapped by cert-manager); SIGHUP (`systemctl reload`) reads them at once.
    #[serde(default = "default_watch_interval", deserialize_with = "duration")]
    pub watch_interval: Duration,
}

fn default_watch_interval() -> Duration {
    Duration::from_secs(10)
}

impl TlsConfig {
    pub(super) fn resolve_paths(&mut self, base_dir: &Path) {
        self.cert_file = base_dir.join(&self.cert_file);
        self.key_file = base_dir.join(&self.key_file);
    }

    pub(super) fn validate(&self, table: &str, problems: &mut Vec<String>) {
        if self.watch_interval < Duration::from_millis(100) {
            problems.push(format!("{table}.watch_interval must be at least 100ms"));
        }
    }
}
