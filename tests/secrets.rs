//! Secrets the receiver is given, against the real binary: `check-config --strict` refuses each
//! file holding one that others may read or write, whichever key names it, and says what `serve`
//! itself would do; a URL with a user, password or query is logged without them.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::free_port;
use common::peers::OPERATOR_TOKEN;
use common::service::cli;
use common::service::{write_config, Service};
use common::tls::TestCa;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A private key at 0644 (both listeners'), and a signing secrets file, Sume's API key and
/// PostgreSQL's URL open to everyone: each is named, and `--strict` refuses; an admin token at
/// the install's 0640 passes. Made 0600, they pass.
#[test]
fn check_config_strict_refuses_every_exposed_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    TestCa::new().leaf().install(dir.path());
    let files = [
        ("key.pem", None, 0o644),
        ("secrets", Some("whsec_exposed"), 0o666),
        ("api_key", Some("exposed-api-key"), 0o602),
        ("database_url", Some("postgres://u:p@127.0.0.1:1/db"), 0o604),
        ("admin_token", Some(OPERATOR_TOKEN), 0o640),
    ];
    for (name, text, mode) in files {
        if let Some(text) = text {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        chmod(&dir.path().join(name), mode);
    }
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\n\n\
             [server.tls]\ncert_file = \"cert.pem\"\nkey_file = \"key.pem\"\n\n\
             [signature]\nsecrets_file = \"secrets\"\n\n\
             [database]\nurl_file = \"database_url\"\n\n\
             [sume_api]\nbase_url = \"http://127.0.0.1:1/api\"\napi_key_file = \"api_key\"\n\n\
             [admin]\nlisten = \"127.0.0.1:{}\"\ntoken_file = \"admin_token\"\n\n\
             [admin.tls]\ncert_file = \"cert.pem\"\nkey_file = \"key.pem\"\n",
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let strict = cli(&config, &["check-config", "--strict"]);
    let out = String::from_utf8_lossy(&strict.stdout).into_owned();
    let err = String::from_utf8_lossy(&strict.stderr).into_owned();
    assert!(!strict.status.success(), "{out}");
    for (key, mode) in [
        ("server.tls.key_file", "0644"),
        ("admin.tls.key_file", "0644"),
        ("signature.secrets_file", "0666"),
        ("sume_api.api_key_file", "0602"),
        ("database.url_file", "0604"),
    ] {
        assert!(
            out.lines()
                .any(|line| line.starts_with(&format!("error: {key}:")) && line.contains(mode)),
            "{key}: {out}"
        );
    }
    assert!(
        !out.contains("admin.token_file"),
        "0640 is the install's: {out}"
    );
    // `serve` would start (it warns): the refusal is said as --strict's own.
    assert!(err.contains("--strict refuses 5"), "{err}");
    assert!(!err.contains("`serve` would refuse it"), "{err}");

    let lenient = cli(&config, &["check-config"]);
    assert!(lenient.status.success());
    let out = String::from_utf8_lossy(&lenient.stdout);
    let exposed = out
        .lines()
        .filter(|line| line.contains("is open to others"));
    assert_eq!(exposed.count(), 5, "warnings without --strict: {out}");

    for (name, _, _) in files {
        chmod(&dir.path().join(name), 0o600);
    }
    let strict = cli(&config, &["check-config", "--strict"]);
    assert!(
        strict.status.success(),
        "{}",
        String::from_utf8_lossy(&strict.stdout)
    );
}

/// Regression: the ACME directory's URL was logged whole, `user:password@` and query with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_directory_url_is_logged_without_its_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Nothing listens there: the order fails at once, and its failure is logged.
    let directory = format!(
        "https://acme-user:Hunter2Pass@127.0.0.1:{}/dir?key=Hunter2Query",
        free_port()
    );
    let acme = format!(
        "[server.tls.acme]\ndomains = [\"receiver.sume.test\"]\ndirectory = \"{directory}\"\n\
         cache_dir = \"acme\"\n"
    );
    let config = write_config(dir.path(), port, "", &acme);
    let service = Service::start(&config, port).await;
    let log_path = dir.path().join("service.log");
    let started = std::time::Instant::now();
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("TLS certificate order failed") {
            break log;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "no failed order logged:\n{log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    service.stop_cleanly().await;
    assert!(log.contains("https://127.0.0.1:"), "{log}");
    for secret in ["Hunter2", "acme-user"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}
