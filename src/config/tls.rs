//! `[server.tls]` and `[admin.tls]`: HTTPS on a listener, from PEM files or from an ACME CA.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::time::Duration;

use serde::Deserialize;

use super::parsing::duration;

/// Let's Encrypt's production directory: the default CA.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// The listener a TLS table serves: the label of its metrics and log lines, and its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Listener {
    /// `[server]`: Sume's deliveries.
    Webhook,
    /// `[admin]`: the console and the admin API.
    Admin,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Webhook => "webhook",
            Listener::Admin => "admin",
        }
    }

    /// The config table of its TLS.
    pub fn table(self) -> &'static str {
        match self {
            Listener::Webhook => "server.tls",
            Listener::Admin => "admin.tls",
        }
    }
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A listener's TLS, resolved at load from `[server.tls]` or `[admin.tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawServerTls")]
pub struct TlsConfig {
    pub source: CertificateSource,
    /// How often certificate files are looked at for a change (a renewal by certbot, a secret
    /// swapped by cert-manager); SIGHUP (`systemctl reload`) reads them at once.
    pub watch_interval: Duration,
}

/// Where a listener's certificate comes from.
#[derive(Debug, Clone)]
pub enum CertificateSource {
    /// The certificate chain, leaf first (certbot's `fullchain.pem`), and its private key
    /// (PKCS#8, PKCS#1 or SEC1), readable by the service's user only.
    Files { cert: PathBuf, key: PathBuf },
    /// `[server.tls.acme]`: certificates ordered and renewed by the receiver itself.
    Acme(AcmeConfig),
}

/// `[server.tls]` as the file has it: certificate files, or `[server.tls.acme]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerTls {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default = "default_watch_interval", deserialize_with = "duration")]
    watch_interval: Duration,
    acme: Option<AcmeConfig>,
}

/// `[admin.tls]` as the file has it: certificate files only (a CA validates the public port,
/// not this one).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdminTls {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default = "default_watch_interval", deserialize_with = "duration")]
    watch_interval: Duration,
}

impl TryFrom<RawServerTls> for TlsConfig {
    type Error = String;

    fn try_from(raw: RawServerTls) -> Result<TlsConfig, String> {
        let table = Listener::Webhook.table();
        let source = match (raw.acme, raw.cert_file, raw.key_file) {
            (Some(acme), None, None) => CertificateSource::Acme(acme.validated(table)?),
            (None, Some(cert), Some(key)) => CertificateSource::Files { cert, key },
            (Some(_), _, _) => {
                return Err(format!(
                    "{table}: set either cert_file and key_file, or [{table}.acme], not both"
                ))
            }
            (None, _, _) => {
                return Err(format!(
                    "{table}: set cert_file and key_file (PEM files), or [{table}.acme] for \
                     certificates the receiver orders itself"
                ))
            }
        };
        TlsConfig::new(source, raw.watch_interval, Listener::Webhook)
    }
}

/// `[admin.tls]`, resolved into the form every listener's TLS has.
pub(super) fn admin_tls<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<TlsConfig>, D::Error> {
    let Some(raw) = Option::<RawAdminTls>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let source = CertificateSource::Files {
        cert: raw.cert_file,
        key: raw.key_file,
    };
    TlsConfig::new(source, raw.watch_interval, Listener::Admin)
        .map(Some)
        .map_err(serde::de::Error::custom)
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

impl AcmeChallenge {
    /// As the config file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
            AcmeChallenge::Http01 => "http-01",
        }
    }
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
    fn new(
        source: CertificateSource,
        watch_interval: Duration,
        listener: Listener,
    ) -> Result<TlsConfig, String> {
        if watch_interval < Duration::from_millis(100) {
            return Err(format!(
                "{}.watch_interval must be at least 100ms",
                listener.table()
            ));
        }
        Ok(TlsConfig {
            source,
            watch_interval,
        })
    }

    pub(super) fn resolve_paths(&mut self, base_dir: &Path) {
        let files = match &mut self.source {
            CertificateSource::Files { cert, key } => [Some(cert), Some(key)],
            CertificateSource::Acme(acme) => {
                [Some(&mut acme.cache_dir), acme.directory_ca_file.as_mut()]
            }
        };
        for file in files.into_iter().flatten() {
            *file = base_dir.join(&*file);
        }
    }
}

impl AcmeConfig {
    /// Itself, or every problem it has.
    fn validated(self, table: &str) -> Result<AcmeConfig, String> {
        let mut problems = Vec::new();
        self.validate(table, &mut problems);
        match problems.is_empty() {
            true => Ok(self),
            false => Err(problems.join("; ")),
        }
    }

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
                super::redact_url(&self.directory)
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
