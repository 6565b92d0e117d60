//! `[server.tls]` and `[admin.tls]`: HTTPS on a listener, from PEM files or from an ACME CA.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::parsing::duration;

/// Let's Encrypt's production directory: the default CA.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, leaf first (certbot's `fullchain.pem`).
    pub cert_file: Option<PathBuf>,
    /// Its private key (PKCS#8, PKCS#1 or SEC1), readable by the service's user only.
    pub key_file: Option<PathBuf>,
    /// How often the two files are looked at for a change (a renewal by certbot, a secret
    /// swapped by cert-manager); SIGHUP (`systemctl reload`) reads them at once.
    #[serde(default = "default_watch_interval", deserialize_with = "duration")]
    pub watch_interval: Duration,
    /// `[server.tls.acme]`: certificates ordered and renewed by the receiver itself.
    pub acme: Option<AcmeConfig>,
}

/// `[admin.tls]`: certificate files only (a CA validates the public port, not this one).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminTlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    #[serde(default = "default_watch_interval", deserialize_with = "duration")]
    pub watch_interval: Duration,
}

impl From<&AdminTlsConfig> for TlsConfig {
    fn from(admin: &AdminTlsConfig) -> TlsConfig {
        TlsConfig {
            cert_file: Some(admin.cert_file.clone()),
            key_file: Some(admin.key_file.clone()),
            watch_interval: admin.watch_interval,
            acme: None,
        }
    }
}

/// Where a listener's certificate comes from, as [`TlsConfig`] says once validated.
pub enum CertificateSource<'a> {
    Files { cert: &'a Path, key: &'a Path },
    Acme(&'a AcmeConfig),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The names the certificate is for; each must resolve to this receiver (no wildcards:
    /// neither challenge can prove one).
    pub domains: Vec<String>,
    /// Where the CA may write about expiry and problems, as `mailto:` URLs.
    #[serde(default)]
    pub contact: Vec<String>,
    /// The CA's ACME directory (RFC 8555).
    #[serde(default = "default_directory")]
    pub directory: String,
    /// CA certificates (PEM) the directory's own HTTPS may be signed by, besides the system's.
    pub directory_ca_file: Option<PathBuf>,
    /// The account key and the certificates, kept across restarts (mode 0700).
    #[serde(default = "default_cache_dir")]
    pub cache_dir: PathBuf,
    /// `tls-alpn-01` (on this HTTPS port itself) or `http-01` (on `http_listen`).
    #[serde(default)]
    pub challenge: AcmeChallenge,
    /// Where the http-01 challenge is answered: port 80 of the names.
    #[serde(default = "default_http_listen")]
    pub http_listen: SocketAddr,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum AcmeChallenge {
    #[default]
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    #[serde(rename = "http-01")]
    Http01,
}

fn default_watch_interval() -> Duration {
    Duration::from_secs(10)
}

fn default_directory() -> String {
    LETS_ENCRYPT.to_owned()
}

fn default_cache_dir() -> PathBuf {
    PathBuf::from("/var/lib/sume-receiver/acme")
}

fn default_http_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 80))
}

/// Names a certificate is ordered for, at most: Let's Encrypt's limit.
const MAX_DOMAINS: usize = 100;

impl TlsConfig {
    /// The certificate's source; only called on a validated config.
    pub fn source(&self) -> CertificateSource<'_> {
        match (&self.acme, &self.cert_file, &self.key_file) {
            (Some(acme), _, _) => CertificateSource::Acme(acme),
            (None, Some(cert), Some(key)) => CertificateSource::Files { cert, key },
            _ => unreachable!("validated: files or acme"),
        }
    }

    pub(super) fn resolve_paths(&mut self, base_dir: &Path) {
        let acme = self.acme.as_mut();
        let acme_files = acme
            .into_iter()
            .flat_map(|acme| [Some(&mut acme.cache_dir), acme.directory_ca_file.as_mut()]);
        let files = [self.cert_file.as_mut(), self.key_file.as_mut()];
        for file in files.into_iter().chain(acme_files).flatten() {
            *file = base_dir.join(&*file);
        }
    }

    pub(super) fn validate(&self, table: &str, problems: &mut Vec<String>) {
        if self.watch_interval < Duration::from_millis(100) {
            problems.push(format!("{table}.watch_interval must be at least 100ms"));
        }
        match (&self.acme, &self.cert_file, &self.key_file) {
            (Some(acme), None, None) => acme.validate(table, problems),
            (None, Some(_), Some(_)) => {}
            (Some(_), _, _) => problems.push(format!(
                "{table}: set either cert_file and key_file, or [{table}.acme], not both"
            )),
            (None, _, _) => problems.push(format!(
                "{table}: set cert_file and key_file (PEM files), or [{table}.acme] for \
                 certificates the receiver orders itself"
            )),
        }
    }
}

impl AcmeConfig {
    fn validate(&self, table: &str, problems: &mut Vec<String>) {
        if self.domains.is_empty() || self.domains.len() > MAX_DOMAINS {
            problems.push(format!(
                "{table}.acme.domains: give 1 to {MAX_DOMAINS} names the certificate is for"
            ));
        }
        for domain in &self.domains {
            if !is_dns_name(domain) {
                problems.push(format!(
                    "{table}.acme.domains: {domain:?} is not a DNS name (letters, digits and \
                     '-' in dot-separated labels; no wildcard, no IP address)"
                ));
            }
        }
        if !self.directory.starts_with("https://") {
            problems.push(format!(
                "{table}.acme.directory must be an https:// URL, got {:?}",
                self.directory
            ));
        }
        for contact in &self.contact {
            if !contact.starts_with("mailto:") || contact.contains([',', ' ']) {
                problems.push(format!(
                    "{table}.acme.contact: {contact:?} must be one mailto: URL, like \
                     \"mailto:ops@example.com\""
                ));
            }
        }
    }
}

/// A host name a CA can validate: dot-separated labels of letters, digits and inner hyphens.
fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.contains('.')
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_a_ca_can_validate_are_domains() {
        for good in ["hooks.example.com", "a-b.example.co.uk", "x1.test"] {
            assert!(is_dns_name(good), "{good}");
        }
        for bad in [
            "localhost",
            "*.example.com",
            "-a.example.com",
            "a..b",
            "127.0.0.1",
            "exa mple.com",
            "",
        ] {
            assert!(!is_dns_name(bad), "{bad}");
        }
    }
}
