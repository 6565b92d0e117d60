//! What `check-config` and `serve` check of TLS: certificates, the ACME cache, CA files.

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::{credential, directory_writable, Findings, Unreadable};
use crate::config::{
    redact_url, AcmeChallenge, AcmeConfig, CertificateSource, Config, Credentials, Listener,
};
use crate::tls::certificate::{add_ca_file, About};

/// Each TLS listener's certificate (a pair that could not be read is among the unread
/// credentials, reported already) and every CA file `serve` reads.
pub(super) fn check(
    findings: &mut Findings,
    unreadable: Unreadable,
    config: &Config,
    credentials: &Credentials,
) {
    for (listener, tls) in config.tls_listeners() {
        match &tls.source {
            CertificateSource::Files { cert, .. } => {
                let read = credentials
                    .certificates
                    .iter()
                    .find(|(of, _)| *of == listener);
                if let Some((_, certificate)) = read {
                    files_certificate(findings, listener, cert, &certificate.about, config);
                }
            }
            CertificateSource::Acme(acme) => {
                acme_certificate(findings, unreadable, acme, config);
            }
        }
    }
    let handlers = config.routes.list().iter().map(|route| {
        let file = route.handler.ca_file.as_deref();
        (route.handler_key("ca_file"), file)
    });
    let database = ("database.ca_file".to_owned(), config.database.ca_file());
    for (key, file) in handlers.chain([database]) {
        if let Some(file) = file {
            ca_file(findings, unreadable, &key, file);
        }
    }
}

/// A certificate left with less than this before it expires is worth a warning (the shipped
/// alert `SumeCertificateExpiringSoon` says the same).
const CERTIFICATE_WARNING: Duration = Duration::from_secs(14 * 86_400);

/// A listener's certificate as read from its files (by [`Credentials::read_each`]): fit to
/// serve now, far enough from its expiry, and (on the admin listener) covering the host names
/// the console answers to; the names it serves said.
fn files_certificate(
    findings: &mut Findings,
    listener: Listener,
    cert_file: &Path,
    about: &About,
    config: &Config,
) {
    let table = listener.table();
    let now = SystemTime::now();
    if let Some(problem) = about.unfit(now) {
        findings
            .errors
            .push(format!("{table}: {}: {problem}", cert_file.display()));
    } else if about.remaining(now) < CERTIFICATE_WARNING {
        findings.warnings.push(format!(
            "{table}: the certificate expires in {} days ({}): renew it",
            about.remaining(now).as_secs() / 86_400,
            humantime::format_rfc3339_seconds(about.not_after)
        ));
    }
    if listener == Listener::Admin {
        for host in config.admin.iter().flat_map(|admin| &admin.allowed_hosts) {
            if !about.covers(host) {
                findings.warnings.push(format!(
                    "{table}: the certificate does not cover {host:?} (admin.allowed_hosts): a \
                     browser asking for it is refused"
                ));
            }
        }
    }
    findings.notes.push(format!(
        "{table}: serves {}: a certificate issued by {}, valid until {} ({} days left)",
        served_names(about),
        about.issuer,
        humantime::format_rfc3339_seconds(about.not_after),
        about.remaining(now).as_secs() / 86_400
    ));
}

/// The names a client may ask for, as a note says them.
fn served_names(about: &About) -> String {
    if about.names.is_empty() {
        "no name (clients that send none)".to_owned()
    } else {
        about.names.join(", ")
    }
}

/// An ACME listener: its cache directory writable, its directory's CA file a CA file, the
/// certificate a start would serve at once (or none yet), and TLS-ALPN-01 where the CA cannot
/// reach it.
fn acme_certificate(
    findings: &mut Findings,
    unreadable: Unreadable,
    acme: &AcmeConfig,
    config: &Config,
) {
    let table = Listener::Webhook.table();
    if let Err(error) = directory_writable(&acme.cache_dir) {
        findings
            .errors
            .push(format!("{table}.acme.cache_dir: {error}"));
    }
    if let Some(directory_ca) = &acme.directory_ca_file {
        ca_file(
            findings,
            unreadable,
            "server.tls.acme.directory_ca_file",
            directory_ca,
        );
    }
    let port = config.server.listen.port();
    if acme.challenge == AcmeChallenge::TlsAlpn01 && port != 443 {
        findings.warnings.push(format!(
            "{table}.acme.challenge is tls-alpn-01, which the CA validates on port 443 of each \
             name, but server.listen is on port {port}: validation fails unless port 443 is \
             forwarded to it (or use http-01)"
        ));
    }
    findings.notes.push(format!(
        "{table}: certificates for {} from the ACME directory {} (challenge {}), kept in {}",
        acme.domains.join(", "),
        redact_url(&acme.directory),
        acme.challenge.as_str(),
        acme.cache_dir.display()
    ));
    let now = SystemTime::now();
    match crate::tls::cached_certificate(acme) {
        Ok(Some(cached)) => findings.notes.push(format!(
            "{table}: serves {} at start: the cached certificate issued by {}, valid until {} \
             ({} days left)",
            served_names(&cached.about),
            cached.about.issuer,
            humantime::format_rfc3339_seconds(cached.about.not_after),
            cached.about.remaining(now).as_secs() / 86_400
        )),
        Ok(None) => findings.notes.push(format!(
            "{table}: no certificate cached yet: the first start orders one, and refuses every \
             handshake (and is not ready) until it comes"
        )),
        Err(error) => findings.warnings.push(format!(
            "{table}: the cached certificate cannot be served ({error:#}): the next start \
             orders a new one"
        )),
    }
}

/// A CA file `serve` reads: readable, and holding at least one CA certificate.
fn ca_file(findings: &mut Findings, unreadable: Unreadable, key: &str, file: &Path) {
    let mut roots = rustls::RootCertStore::empty();
    if let Err(error) = add_ca_file(&mut roots, file) {
        credential(findings, unreadable, key, &error);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::check;
    use super::super::tests::config;
    use super::*;

    /// A certificate for `names` from a CA made here, valid from `from` to `until` seconds
    /// from now, written as `<name>.crt` and `<name>.key` in `dir`.
    fn certificate_files(dir: &Path, name: &str, names: &[&str], (from, until): (i64, i64)) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .unwrap();
        let now = std::time::SystemTime::now();
        let at = |seconds: i64| {
            let offset = Duration::from_secs(seconds.unsigned_abs());
            let when = if seconds < 0 {
                now - offset
            } else {
                now + offset
            };
            when.into()
        };
        params.not_before = at(from);
        params.not_after = at(until);
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), certificate.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }

    fn tls(cert: &str, key: &str) -> String {
        format!("[server.tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n")
    }

    #[test]
    fn check_config_reads_each_certificate_as_the_service_would() {
        let dir = tempfile::tempdir().unwrap();
        let day = 86_400;
        certificate_files(dir.path(), "good", &["hooks.example.com"], (-day, 60 * day));
        certificate_files(dir.path(), "soon", &["hooks.example.com"], (-day, 5 * day));
        certificate_files(
            dir.path(),
            "expired",
            &["hooks.example.com"],
            (-3 * day, -day),
        );
        let check_of = |extra: &str| check(&config(dir.path(), extra), Unreadable::Error);

        let good = check_of(&tls("good.crt", "good.key"));
        assert!(
            good.errors.is_empty() && good.warnings.is_empty(),
            "{good:?}"
        );
        assert!(
            good.notes[0]
                .starts_with("server.tls: serves hooks.example.com: a certificate issued by")
                && good.notes[0].contains("(59 days left)"),
            "{good:?}"
        );
        let soon = check_of(&tls("soon.crt", "soon.key"));
        assert!(soon.warnings[0].contains("expires in 4 days"), "{soon:?}");
        let expired = check_of(&tls("expired.crt", "expired.key"));
        assert!(expired.errors[0].contains("it expired at"), "{expired:?}");
        let mismatched = check_of(&tls("good.crt", "soon.key"));
        assert!(
            mismatched.errors[0].contains("do not make a pair"),
            "{mismatched:?}"
        );
        let missing = check_of(&tls("none.crt", "none.key"));
        assert!(missing.errors[0].contains("cannot read"), "{missing:?}");
        // The admin listener's certificate must cover the names the console answers to.
        let admin = check_of(
            "[admin]\nallowed_hosts = [\"console.example.com\"]\n\
             [admin.tls]\ncert_file = \"good.crt\"\nkey_file = \"good.key\"\n",
        );
        assert!(
            admin
                .warnings
                .iter()
                .any(|w| w.contains("does not cover \"console.example.com\"")),
            "{admin:?}"
        );
        // Off loopback without TLS, the webhook's deliveries cross the network in clear.
        let clear = check_of("[server]\nlisten = \"0.0.0.0:8080\"\n");
        assert!(
            clear.warnings.iter().any(|w| w.contains("in clear")),
            "{clear:?}"
        );
    }

    /// Regression: `check-config --strict` passed a `handler.ca_file` that was missing or held
    /// only a key, which `serve` then refused.
    #[test]
    fn check_config_reads_every_ca_file_as_the_service_would() {
        let dir = tempfile::tempdir().unwrap();
        certificate_files(dir.path(), "ca", &["ca.example.com"], (-86_400, 86_400));
        let handler = |ca_file: &str| {
            let extra = format!(
                "[handler]\nurl = \"https://hooks.example.com/\"\nca_file = \"{ca_file}\"\n"
            );
            check(&config(dir.path(), &extra), Unreadable::Error)
        };
        let good = handler("ca.crt");
        assert!(good.errors.is_empty(), "{good:?}");
        let key_only = handler("ca.key");
        assert!(
            key_only.errors[0].starts_with("handler.ca_file: ")
                && key_only.errors[0].contains("no certificate in it"),
            "{key_only:?}"
        );
        let missing = handler("missing.pem");
        assert!(missing.errors[0].contains("cannot read"), "{missing:?}");
    }

    #[test]
    fn check_config_says_what_an_acme_listener_serves_and_where_validation_cannot_reach() {
        let dir = tempfile::tempdir().unwrap();
        let acme = |challenge: &str| {
            let extra = format!(
                "[server]\nlisten = \"0.0.0.0:8443\"\n[server.tls.acme]\n\
                 domains = [\"hooks.example.com\"]\ncache_dir = \"acme\"\n\
                 challenge = \"{challenge}\"\n"
            );
            check(&config(dir.path(), &extra), Unreadable::Error)
        };
        let alpn = acme("tls-alpn-01");
        assert!(alpn.errors.is_empty(), "{alpn:?}");
        assert!(
            alpn.notes
                .iter()
                .any(|note| note.contains("(challenge tls-alpn-01)")),
            "settings as the file spells them: {alpn:?}"
        );
        assert!(
            alpn.notes
                .iter()
                .any(|note| note.contains("no certificate cached yet")),
            "{alpn:?}"
        );
        assert!(
            alpn.warnings
                .iter()
                .any(|w| w.contains("validates on port 443") && w.contains("port 8443")),
            "{alpn:?}"
        );
        let http = acme("http-01");
        assert!(
            !http.warnings.iter().any(|w| w.contains("port 443")),
            "http-01 is validated on http_listen: {http:?}"
        );
    }
}
