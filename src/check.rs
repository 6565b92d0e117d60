//! `check-config`: everything `serve` would refuse, found before it starts, plus its warnings.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::config::{
    AdminConfig, AdminTokens, CertificateSource, Config, Credentials, HandlerKind, Secret,
    TlsConfig, Unread,
};
use crate::tls::certificate::Certificate;

/// Admin tokens shorter than this are weak (`openssl rand -hex 32` makes 64 characters).
pub const MIN_TOKEN_CHARS: usize = 32;

/// What the check found: errors stop `serve` (non-zero exit), warnings do not.
#[derive(Debug, Default)]
pub struct Findings {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    /// Facts worth seeing before a start (each listener's certificate).
    pub notes: Vec<String>,
    /// Secrets that are weak or exposed (a private key or secret file open to others or
    /// writable by its group; an admin token short, or one token under two names): warnings,
    /// and errors for `check-config --strict` (`serve` warns only).
    pub weak_secrets: Vec<String>,
    /// Every credential as the check read it, what `serve` then runs with; `None` when one
    /// could not be read (an error, or with [`Unreadable::Warning`] perhaps a warning).
    pub credentials: Option<Credentials>,
}

/// What a credential file this user cannot read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// A warning: the check may run as another user than the service's (an operator, root).
    Warning,
    /// An error: the check runs as the service's user (`serve`, the unit's `check-config
    /// --strict` before a start or a reload), so the service could not read it either.
    Error,
}

/// Checks what parsing cannot: the credential files (read once here, and kept in the findings
/// for `serve`), the ledger's directory (SQLite), the handler.
pub fn check(config: &Config, unreadable: Unreadable) -> Findings {
    let mut findings = Findings {
        warnings: config.warnings(),
        ..Findings::default()
    };
    let (credentials, unread) = Credentials::read_each(config);
    for Unread { key, error } in &unread {
        credential(&mut findings, unreadable, key, error);
    }
    findings.weak_secrets = exposed_files(config);
    if let (Some(admin), Some(tokens)) = (&config.admin, &credentials.admin_tokens) {
        findings.weak_secrets.extend(weak_tokens(admin, tokens));
    }
    findings.credentials = unread.is_empty().then_some(credentials);
    let admin_tls = config.admin.as_ref().and_then(|admin| admin.tls.as_ref());
    let admin_tls = admin_tls.map(TlsConfig::from);
    for (table, tls) in [
        ("server.tls", config.server.tls.as_ref()),
        ("admin.tls", admin_tls.as_ref()),
    ] {
        if let Some(tls) = tls {
            certificate(&mut findings, unreadable, table, tls, config);
        }
    }
    // PostgreSQL's URL is a credential, read above; its server is not connected to here:
    // `serve` says at start if it cannot be reached.
    if let Some(path) = config.database.sqlite_path() {
        if let Err(error) = ledger_directory_writable(path) {
            findings.errors.push(error);
        }
    }
    if let Some(HandlerKind::Command(argv)) = config.handler.as_ref().map(|h| &h.kind) {
        if let Err(error) = executable(&argv[0]) {
            findings.errors.push(format!("handler.command: {error}"));
        }
    }
    // Last: a caveat on everything above.
    // SAFETY: geteuid has no preconditions.
    if unreadable == Unreadable::Warning && unsafe { libc::geteuid() } == 0 {
        findings.warnings.push(
            "checked as root, who may read and write anything: a file or directory the \
             service's user cannot reach passes here. The unit runs `check-config --strict` as \
             that user before each start and reload"
                .to_owned(),
        );
    }
    findings
}

impl Findings {
    /// The errors as one, in the words `check-config` prints them: what `serve` refuses.
    pub fn refuse_errors(&self) -> anyhow::Result<()> {
        if self.errors.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "the configuration has {} error(s): {}",
            self.errors.len(),
            self.errors.join("; ")
        )
    }
}

/// A credential file this user cannot read is, with [`Unreadable::Warning`], a warning: it may
/// be readable by the service's user only, or be a systemd credential that exists only while
/// the unit runs. Anything else wrong with it is an error.
fn credential(findings: &mut Findings, unreadable: Unreadable, what: &str, error: &anyhow::Error) {
    let cannot_read = error
        .root_cause()
        .downcast_ref::<std::io::Error>()
        .is_some();
    if cannot_read && unreadable == Unreadable::Warning {
        findings.warnings.push(format!(
            "{error:#} (not checked here: it may be readable by the service's user only, or be \
             a systemd credential that exists only while the unit runs; `serve` reads it)"
        ));
    } else {
        findings.errors.push(format!("{what}: {error:#}"));
    }
}

/// A certificate left with less than this before it expires is worth a warning (the shipped
/// alert `SumeCertificateExpiringSoon` says the same).
const CERTIFICATE_WARNING: Duration = Duration::from_secs(14 * 86_400);

/// A listener's certificate and key: readable, a pair, fit to serve now, far enough from its
/// expiry, and (on the admin listener) covering the host names the console answers to. An
/// ACME listener: its cache directory writable, its directory's CA file readable.
fn certificate(
    findings: &mut Findings,
    unreadable: Unreadable,
    table: &str,
    tls: &TlsConfig,
    config: &Config,
) {
    let (cert_file, key_file) = match tls.source() {
        CertificateSource::Files { cert, key } => (cert, key),
        CertificateSource::Acme(acme) => {
            if let Err(error) = directory_writable(&acme.cache_dir) {
                findings
                    .errors
                    .push(format!("{table}.acme.cache_dir: {error}"));
            }
            if let Some(ca_file) = &acme.directory_ca_file {
                let read = std::fs::read(ca_file)
                    .with_context(|| format!("cannot read {}", ca_file.display()));
                if let Err(error) = read {
                    let what = format!("{table}.acme.directory_ca_file");
                    credential(findings, unreadable, &what, &error);
                }
            }
            findings.notes.push(format!(
                "{table}: certificates for {} from the ACME directory {} ({:?}), kept in {}",
                acme.domains.join(", "),
                acme.directory,
                acme.challenge,
                acme.cache_dir.display()
            ));
            return;
        }
    };
    let about = match Certificate::from_files(cert_file, key_file) {
        Ok(loaded) => loaded.about,
        Err(error) => return credential(findings, unreadable, table, &error),
    };
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
    if table == "admin.tls" {
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
        "{table}: a certificate for {} issued by {}, valid until {} ({} days left)",
        if about.names.is_empty() {
            "no name".to_owned()
        } else {
            about.names.join(", ")
        },
        about.issuer,
        humantime::format_rfc3339_seconds(about.not_after),
        about.remaining(now).as_secs() / 86_400
    ));
}

/// A directory this user can write in, or the nearest existing ancestor it would be made in.
fn directory_writable(dir: &Path) -> Result<(), String> {
    let existing = nearest_existing(dir.to_owned());
    if accessible(&existing, libc::W_OK | libc::X_OK) {
        Ok(())
    } else {
        Err(format!(
            "{} is not writable by this user",
            existing.display()
        ))
    }
}

/// Each file holding a secret that others may read or write, or its group write. The install
/// makes them root's, readable by the service's group (0640): group read is how the service
/// reads them; anything more is too much.
fn exposed_files(config: &Config) -> Vec<String> {
    let mut exposed = Vec::new();
    for (key, file) in config.secret_files() {
        let Ok(metadata) = std::fs::metadata(file) else {
            continue; // Unreadable: said by the credential or certificate check.
        };
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o027 != 0 {
            exposed.push(format!(
                "{key}: {} is open to others or writable by its group (mode {mode:04o}): \
                 chmod 0640 (owner root, group the service's) or 0600",
                file.display()
            ));
        }
    }
    exposed
}

/// What is weak in the admin tokens: a token shorter than [`MIN_TOKEN_CHARS`], one token under
/// two keys (the first match would win, silently). The tokens are those read (`tokens`), never
/// shown.
fn weak_tokens(admin: &AdminConfig, tokens: &AdminTokens) -> Vec<String> {
    let mut held: Vec<(String, Option<&Secret>)> = vec![
        ("admin.token_file".into(), tokens.operator.as_ref()),
        ("admin.read_token_file".into(), tokens.read.as_ref()),
    ];
    for (index, named) in admin.tokens.iter().enumerate() {
        let token = tokens.named.get(index).map(|(_, _, token)| token);
        held.push((format!("admin.tokens {:?}", named.name), token));
    }
    let mut weak = Vec::new();
    let mut seen: Vec<(String, &str)> = Vec::new();
    for (key, token) in held {
        let Some(token) = token.map(Secret::expose) else {
            continue;
        };
        let chars = token.chars().count();
        if chars > 0 && chars < MIN_TOKEN_CHARS {
            weak.push(format!(
                "{key}: the token is {chars} characters; use at least {MIN_TOKEN_CHARS} \
                 (`openssl rand -hex 32`)"
            ));
        }
        if let Some((first, _)) = seen.iter().find(|(_, held)| *held == token) {
            weak.push(format!(
                "{key} holds the same token as {first}: the first to match would win, \
                 silently; give each its own"
            ));
        }
        seen.push((key, token));
    }
    weak
}

/// The ledger file (if it exists) and its directory (or the nearest existing ancestor, which
/// `serve` would create it in) must be writable by this user.
fn ledger_directory_writable(ledger: &Path) -> Result<(), String> {
    if ledger.exists() && !accessible(ledger, libc::W_OK) {
        return Err(format!(
            "database.path: {} is not writable by this user",
            ledger.display()
        ));
    }
    let mut dir = ledger.parent().map_or(PathBuf::from("."), Path::to_owned);
    if dir.as_os_str().is_empty() {
        dir = PathBuf::from(".");
    }
    let dir = nearest_existing(dir);
    if !accessible(&dir, libc::W_OK | libc::X_OK) {
        return Err(format!(
            "database.path: cannot create the ledger or its WAL in {}: not writable by this user",
            dir.display()
        ));
    }
    Ok(())
}

/// `dir`, or the nearest of its ancestors that exists (where `serve` would create it).
fn nearest_existing(mut dir: PathBuf) -> PathBuf {
    while !dir.exists() {
        match dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => dir = parent.to_owned(),
            // A bare name is in the working directory.
            Some(_) => return PathBuf::from("."),
            None => break,
        }
    }
    dir
}

/// The program a handler names: a path, or a name looked up in PATH like the service does.
fn executable(program: &str) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(program))
            .collect()
    };
    candidates
        .into_iter()
        .find(|path| path.is_file() && accessible(path, libc::X_OK))
        .ok_or_else(|| format!("{program:?} is not an executable file (or not found in PATH)"))
}

/// access(2): whether this process's user may read/write/execute `path` as `mode` says.
fn accessible(path: &Path, mode: libc::c_int) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access reads the NUL-terminated path we pass and nothing else.
    unsafe { libc::access(path.as_ptr(), mode) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, extra: &str) -> Config {
        Config::parse(
            &format!("[signature]\nsecrets = [\"whsec_a\"]\n[database]\npath = \"sub/ledger.db\"\n{extra}"),
            dir,
        )
        .unwrap()
    }

    #[test]
    fn a_good_config_has_no_findings() {
        let dir = tempfile::tempdir().unwrap();
        let findings = check(
            &config(dir.path(), "[handler]\ncommand = [\"true\"]\n"),
            Unreadable::Error,
        );
        assert!(findings.errors.is_empty(), "{findings:?}");
        assert!(findings.warnings.is_empty(), "{findings:?}");
    }

    /// Regression: check-config passed configs that `serve` then rejected.
    #[test]
    fn a_missing_handler_program_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let not_executable = dir.path().join("handler.sh");
        std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
        let not_executable = not_executable.display().to_string();
        for program in [
            "no-such-program-here",
            "/nonexistent/handler",
            &not_executable,
        ] {
            let findings = check(
                &config(
                    dir.path(),
                    &format!("[handler]\ncommand = [\"{program}\"]\n"),
                ),
                Unreadable::Warning,
            );
            assert!(
                findings.errors[0].contains("handler.command")
                    && findings.errors[0].contains(program),
                "{findings:?}"
            );
        }
    }

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
            good.notes[0].starts_with("server.tls: a certificate for hooks.example.com issued by")
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

    #[test]
    fn weak_or_exposed_admin_tokens_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let strong = "s".repeat(MIN_TOKEN_CHARS);
        for (file, token, mode) in [
            ("operator", "x", 0o666),
            ("alice", strong.as_str(), 0o600),
            ("bob", strong.as_str(), 0o600),
        ] {
            let path = dir.path().join(file);
            std::fs::write(&path, token).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let findings = check(
            &config(
                dir.path(),
                "[admin]\ntoken_file = \"operator\"\n\
                 [[admin.tokens]]\nname = \"alice\"\nfile = \"alice\"\n\
                 [[admin.tokens]]\nname = \"bob\"\nfile = \"bob\"\nrole = \"operator\"\n",
            ),
            Unreadable::Error,
        );
        let weak = findings.weak_secrets.join("\n");
        assert!(
            weak.contains("admin.token_file") && weak.contains("mode 0666"),
            "{weak}"
        );
        assert!(weak.contains("1 characters"), "{weak}");
        assert!(
            weak.contains("admin.tokens \"bob\" holds the same token as admin.tokens \"alice\""),
            "{weak}"
        );
        assert_eq!(findings.weak_secrets.len(), 3, "{weak}");
        assert!(!weak.contains(&strong), "never the token itself");
    }

    /// `serve` runs with what its check read: a file changed after the check changes nothing.
    #[test]
    fn the_check_keeps_the_credentials_it_read() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse(
            "[signature]\nsecrets_file = \"secrets\"\n[admin]\ntoken_file = \"operator\"\n",
            dir.path(),
        )
        .unwrap();
        let operator = "o".repeat(MIN_TOKEN_CHARS);
        std::fs::write(dir.path().join("secrets"), "whsec_checked\n").unwrap();
        std::fs::write(dir.path().join("operator"), &operator).unwrap();
        let findings = check(&config, Unreadable::Error);
        std::fs::write(dir.path().join("secrets"), "whsec_later\n").unwrap();
        std::fs::remove_file(dir.path().join("operator")).unwrap();

        let credentials = findings.credentials.expect("every credential was read");
        let secrets: Vec<&str> = credentials
            .signing_secrets
            .iter()
            .map(Secret::expose)
            .collect();
        assert_eq!(secrets, ["whsec_checked"]);
        let tokens = credentials.admin_tokens.expect("[admin] is set");
        assert_eq!(
            tokens.operator.as_ref().map(Secret::expose),
            Some(operator.as_str())
        );
        // One that cannot be read: nothing to run with.
        assert!(check(&config, Unreadable::Warning).credentials.is_none());
    }

    #[test]
    fn an_unreadable_credential_is_a_warning_and_a_bad_one_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Config::parse(
            "[signature]\nsecrets_file = \"/run/credentials/x/secrets\"\n",
            dir.path(),
        )
        .unwrap();
        let findings = check(&missing, Unreadable::Warning);
        assert!(findings.errors.is_empty(), "{findings:?}");
        assert!(
            findings.warnings[0].contains("systemd credential"),
            "{findings:?}"
        );
        // Run as the service's user (`check-config --strict`, `serve`): the service could not
        // read it either.
        let findings = check(&missing, Unreadable::Error);
        assert!(
            findings.errors[0].contains("/run/credentials/x/secrets"),
            "{findings:?}"
        );

        std::fs::write(dir.path().join("secrets"), "whsec_ok\n").unwrap();
        let example = Config::parse(
            "[server]\nlisten = \"0.0.0.0:8080\"\n[signature]\nsecrets = [\"whsec_change_me\"]\n",
            dir.path(),
        )
        .unwrap();
        let findings = check(&example, Unreadable::Warning);
        assert!(
            findings.errors[0].contains("example secret"),
            "{findings:?}"
        );
    }
}
