//! `check-config`: everything `serve` would refuse, found before it starts, plus its warnings.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::config::{
    AdminConfig, AdminTokens, Config, Credentials, HandlerKind, Routes, Secret, TracingConfig,
    Unmatched, Unread,
};

mod tls;

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
    tls::check(&mut findings, unreadable, config, &credentials);
    if let Some(tracing) = &config.tracing {
        traces(&mut findings, tracing, &credentials.trace_headers);
    }
    findings.credentials = unread.is_empty().then_some(credentials);
    // PostgreSQL's URL is a credential, read above; its server is not connected to here:
    // `serve` says at start if it cannot be reached.
    if let Some(path) = config.database.sqlite_path() {
        if let Err(error) = ledger_directory_writable(path) {
            findings.errors.push(error);
        }
    }
    findings.notes.extend(route_notes(&config.routes));
    findings.errors.extend(route_errors(config));
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

/// The routes' commands that cannot run: what a start refuses, and a reload too.
pub fn route_errors(config: &Config) -> Vec<String> {
    let mut errors = Vec::new();
    for route in config.routes.list() {
        if let HandlerKind::Command(argv) = &route.handler.kind {
            if let Err(error) = executable(&argv[0]) {
                let key = route.handler_key("command");
                errors.push(format!("{key}: {error}"));
            }
        }
    }
    errors
}

/// Where the spans go (the endpoint's form was checked with the file), and a token that would
/// cross the network in clear.
fn traces(findings: &mut Findings, tracing: &TracingConfig, headers: &[(String, Secret)]) {
    let endpoint = &tracing.endpoint;
    findings.notes.push(format!(
        "tracing: spans to {} (OTLP/HTTP, protobuf) as {:?}, sample ratio {}",
        crate::config::redact_url(&endpoint.to_string()),
        tracing.service_name,
        tracing.sample_ratio
    ));
    let loopback = endpoint.host().is_some_and(|host| {
        host == "localhost"
            || host
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    if !headers.is_empty() && endpoint.scheme_str() == Some("http") && !loopback {
        findings.warnings.push(
            "tracing.endpoint speaks plain http to another host, and headers (a token) are sent              with each export: they cross the network readable. Use https"
                .to_owned(),
        );
    }
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

/// With `[[route]]`s, each as the service reads it (what it takes, and where it sends it) and
/// what becomes of an event none takes: a route misread is seen before it misroutes.
fn route_notes(routes: &Routes) -> Vec<String> {
    if routes.list().iter().all(|route| route.line.is_none()) {
        return Vec::new(); // `[handler]` alone takes everything, as it always has.
    }
    let mut notes: Vec<String> = routes
        .list()
        .iter()
        .map(|route| {
            let types: Vec<String> = route
                .matcher
                .event_types
                .iter()
                .map(|t| t.to_string())
                .collect();
            let mut takes = format!("event_types {}", types.join(", "));
            for condition in &route.matcher.fields {
                takes.push_str(&format!("; {} in {:?}", condition.name, condition.values));
            }
            if route.fan_out {
                takes.push_str("; continue");
            }
            format!(
                "{}: {takes} -> {}",
                route.describe(),
                route.handler.kind.describe()
            )
        })
        .collect();
    notes.push(match routes.unmatched() {
        Unmatched::Dead => "routing.unmatched: an event no route takes is dead, its error naming \
                            its type"
            .to_owned(),
        Unmatched::Done => {
            "routing.unmatched: an event no route takes is done with no work".to_owned()
        }
        Unmatched::Route(name) => format!(
            "routing.unmatched: route {:?} takes an event no other route takes",
            name.as_str()
        ),
    });
    notes
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

    pub(super) fn config(dir: &Path, extra: &str) -> Config {
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

    /// The check says where spans go; a token over plain http to another host is a warning,
    /// a headers file it cannot read an error, its lines never shown.
    #[test]
    fn tracing_is_noted_and_a_token_in_clear_warned() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("otlp-headers"),
            "Authorization: Bearer s3cret\n",
        )
        .unwrap();
        let traced = |endpoint: &str, headers: &str| {
            let extra = format!("[tracing]\nendpoint = \"{endpoint}\"\n{headers}");
            check(&config(dir.path(), &extra), Unreadable::Error)
        };
        let local = traced("http://127.0.0.1:4318", "headers_file = \"otlp-headers\"");
        assert!(local.warnings.is_empty(), "{local:?}");
        assert!(
            local.notes[0].contains("tracing: spans to http://127.0.0.1:4318/v1/traces"),
            "{local:?}"
        );
        let remote = traced(
            "http://collector.example:4318",
            "headers_file = \"otlp-headers\"",
        );
        assert!(
            remote.warnings[0].contains("tracing.endpoint speaks plain http"),
            "{remote:?}"
        );
        assert!(traced(
            "https://collector.example",
            "headers_file = \"otlp-headers\""
        )
        .warnings
        .is_empty());
        let missing = traced("http://127.0.0.1:4318", "headers_file = \"nowhere\"");
        assert!(
            missing.errors[0].starts_with("tracing.headers_file"),
            "{missing:?}"
        );
        assert!(!format!("{local:?}{remote:?}").contains("s3cret"));
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

    /// Each route's program is checked, and named by its route's line.
    #[test]
    fn a_route_with_a_missing_program_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let routes = "[[route]]\nname = \"pager\"\nevent_types = [\"job.failed\"]\n\
                      [route.handler]\ncommand = [\"true\"]\n\
                      [[route]]\nname = \"archive\"\nevent_types = [\"*\"]\n\
                      [route.handler]\ncommand = [\"no-such-archiver\"]\n";
        let findings = check(&config(dir.path(), routes), Unreadable::Error);
        assert_eq!(
            findings.errors,
            [
                "route \"archive\" (line 10): handler.command: \"no-such-archiver\" is not an \
              executable file (or not found in PATH)"
            ],
            "{findings:?}"
        );
        assert_eq!(
            findings.notes,
            [
                "route \"pager\" (line 5): event_types job.failed -> command true",
                "route \"archive\" (line 10): event_types * -> command no-such-archiver",
                "routing.unmatched: an event no route takes is dead, its error naming its type",
            ]
        );
        let legacy = check(
            &config(dir.path(), "[handler]\ncommand = [\"true\"]\n"),
            Unreadable::Error,
        );
        assert!(legacy.notes.is_empty(), "{legacy:?}");
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
