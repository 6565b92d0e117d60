//! A certificate chain and its key read from PEM files, checked to belong together, and what an
//! operator needs to know of it: the names it covers, its issuer, when it expires.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use x509_cert::der::oid::AssociatedOid;
use x509_cert::der::Decode;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;

/// A PEM file larger than this is no certificate or key (a chain is a few KiB).
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// A certificate chain with its private key, ready to serve.
#[derive(Debug, Clone)]
pub struct Certificate {
    pub key: Arc<CertifiedKey>,
    pub about: About,
}

/// What the console, `check-config` and the log say of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct About {
    /// The DNS names and IP addresses of its subjectAltName, as written there (`*.` kept).
    pub names: Vec<String>,
    pub issuer: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Certificate {
    /// Reads the chain from `cert_file` and the key from `key_file` (they may be one file) and
    /// checks that the key is the certificate's. The error names the file and what is wrong.
    pub fn from_files(cert_file: &Path, key_file: &Path) -> anyhow::Result<Certificate> {
        let chain_pem = read_pem(cert_file)?;
        let chain = CertificateDer::pem_slice_iter(&chain_pem)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{}: not a PEM certificate chain", cert_file.display()))?;
        let Some(leaf) = chain.first() else {
            bail!("{}: no certificate in it", cert_file.display());
        };
        let about = About::of(leaf)
            .with_context(|| format!("{}: cannot read its certificate", cert_file.display()))?;
        let key_pem = read_pem(key_file)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| {
            anyhow::anyhow!("{}: no private key in it ({error})", key_file.display())
        })?;
        let provider = rustls::crypto::ring::default_provider();
        let key = CertifiedKey::from_der(chain, key, &provider).map_err(|error| {
            anyhow::anyhow!(
                "{} and {} do not make a pair: {error}",
                cert_file.display(),
                key_file.display()
            )
        })?;
        Ok(Certificate {
            key: Arc::new(key),
            about,
        })
    }
}

/// Adds the CA certificates of `ca_file` (PEM) to `roots`: the CA files a client trusts
/// besides the system's (`handler.ca_file`, `database.ca_file`, the ACME directory's). A file
/// with no certificate, or one that is no CA certificate, is refused.
pub fn add_ca_file(roots: &mut rustls::RootCertStore, ca_file: &Path) -> anyhow::Result<()> {
    let pem = read_pem(ca_file)?;
    let mut added = 0;
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        let certificate =
            certificate.with_context(|| format!("{}: not a PEM certificate", ca_file.display()))?;
        roots
            .add(certificate)
            .with_context(|| format!("{}: not a CA certificate", ca_file.display()))?;
        added += 1;
    }
    if added == 0 {
        bail!("{}: no certificate in it", ca_file.display());
    }
    Ok(())
}

fn read_pem(file: &Path) -> anyhow::Result<Vec<u8>> {
    let mut text = Vec::new();
    std::fs::File::open(file)
        .and_then(|opened| opened.take(MAX_PEM_BYTES + 1).read_to_end(&mut text))
        .with_context(|| format!("cannot read {}", file.display()))?;
    if text.len() as u64 > MAX_PEM_BYTES {
        bail!(
            "{}: larger than 1 MiB, not a certificate or key",
            file.display()
        );
    }
    Ok(text)
}

impl About {
    fn of(leaf: &CertificateDer<'_>) -> anyhow::Result<About> {
        let certificate = x509_cert::Certificate::from_der(leaf)?;
        let tbs = &certificate.tbs_certificate;
        let mut names = Vec::new();
        for extension in tbs.extensions.iter().flatten() {
            if extension.extn_id != SubjectAltName::OID {
                continue;
            }
            let alt_names = SubjectAltName::from_der(extension.extn_value.as_bytes())?;
            for name in alt_names.0 {
                match name {
                    GeneralName::DnsName(dns) => names.push(dns.as_str().to_ascii_lowercase()),
                    GeneralName::IpAddress(octets) => {
                        if let Some(ip) = ip_address(octets.as_bytes()) {
                            names.push(ip.to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(About {
            names,
            issuer: tbs.issuer.to_string(),
            not_before: tbs.validity.not_before.to_system_time(),
            not_after: tbs.validity.not_after.to_system_time(),
        })
    }

    /// Whether a client asking for `name` (its SNI: a DNS name, lowercase) is served by this
    /// certificate: an exact name, or a wildcard for exactly one label.
    pub fn covers(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.names
            .iter()
            .any(|covered| match covered.strip_prefix("*.") {
                Some(parent) => name
                    .split_once('.')
                    .is_some_and(|(label, rest)| !label.is_empty() && rest == parent),
                None => *covered == name,
            })
    }

    /// The names `previous` covers that this certificate does not.
    pub fn dropped_names<'a>(&self, previous: &'a About) -> Vec<&'a str> {
        previous
            .names
            .iter()
            .map(String::as_str)
            .filter(|name| !self.covers(name))
            .collect()
    }

    /// Time left before it expires at `now`; zero once it has.
    pub fn remaining(&self, now: SystemTime) -> Duration {
        self.not_after.duration_since(now).unwrap_or_default()
    }

    /// What makes it unfit to serve at `now`, if anything.
    pub fn unfit(&self, now: SystemTime) -> Option<String> {
        if now >= self.not_after {
            return Some(format!(
                "it expired at {}",
                humantime::format_rfc3339_seconds(self.not_after)
            ));
        }
        if now < self.not_before {
            return Some(format!(
                "it is not valid before {}",
                humantime::format_rfc3339_seconds(self.not_before)
            ));
        }
        None
    }

    pub fn not_after_unix(&self) -> i64 {
        self.not_after
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs().try_into().unwrap_or(i64::MAX))
    }
}

fn ip_address(octets: &[u8]) -> Option<std::net::IpAddr> {
    Some(match octets.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(octets).ok()?),
        16 => std::net::IpAddr::from(<[u8; 16]>::try_from(octets).ok()?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn about(names: &[&str]) -> About {
        About {
            names: names.iter().map(|name| (*name).to_owned()).collect(),
            issuer: "CN=test".into(),
            not_before: SystemTime::UNIX_EPOCH,
            not_after: SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        }
    }

    #[test]
    fn a_name_is_covered_exactly_or_by_a_wildcard_of_one_label() {
        let certificate = about(&["hooks.example.com", "*.eu.example.com"]);
        assert!(certificate.covers("hooks.example.com"));
        assert!(certificate.covers("HOOKS.example.com."));
        assert!(certificate.covers("a.eu.example.com"));
        assert!(!certificate.covers("eu.example.com"));
        assert!(!certificate.covers("a.b.eu.example.com"));
        assert!(!certificate.covers("example.com"));
        assert!(!certificate.covers("hooks.example.com.evil"));
    }

    #[test]
    fn expired_and_not_yet_valid_certificates_are_unfit() {
        let certificate = about(&["a"]);
        let at = |seconds| SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
        assert_eq!(certificate.unfit(at(10)), None);
        assert!(certificate.unfit(at(1000)).unwrap().contains("expired"));
        assert_eq!(certificate.remaining(at(400)), Duration::from_secs(600));
        assert_eq!(certificate.remaining(at(4000)), Duration::ZERO);
    }
}
