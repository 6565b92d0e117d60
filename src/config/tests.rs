//! The config file's parsing and checks, each rule with a file that breaks it.
use super::*;

fn parse(text: &str) -> anyhow::Result<Config> {
    Config::parse(text, Path::new("/base"))
}

fn error(text: &str) -> String {
    format!("{:#}", parse(text).unwrap_err())
}

const MINIMAL: &str = "[signature]\nsecrets = [\"whsec_a\"]\n";

/// Every problem the checks find is reported at once, not the first alone.
#[test]
fn every_problem_is_reported_at_once() {
    let text = "[signature]\nsecrets = [\"whsec_0123456789abcdef\"]\n\
                [server]\nmax_connections = 0\nmax_body_bytes = 0\n\
                [handler]\ncommand = [\"true\"]\nconcurrency = 0\n";
    let message = error(text);
    for problem in [
        "3 problems",
        "server.max_connections must be at least 1",
        "server.max_body_bytes must be greater than zero",
        "handler.concurrency must be at least 1",
    ] {
        assert!(
            message.contains(problem),
            "{problem:?} missing from {message}"
        );
    }
}

#[test]
fn named_tokens_are_checked_and_their_files_resolved() {
    let tokens = "[admin]\ntoken_file = \"t\"\n\
                  [[admin.tokens]]\nname = \"alice\"\nfile = \"alice\"\nrole = \"operator\"\n\
                  [[admin.tokens]]\nname = \"bob\"\nfile = \"/etc/bob\"\n";
    let config = parse(&format!("{MINIMAL}{tokens}")).unwrap();
    let admin = config.admin.unwrap();
    assert_eq!(admin.tokens[0].file, Path::new("/base/alice"));
    assert_eq!(admin.tokens[0].role, TokenRole::Operator);
    assert_eq!(
        admin.tokens[1].role,
        TokenRole::Reader,
        "the least, by default"
    );
    let twice = format!(
        "{MINIMAL}[admin]\n[[admin.tokens]]\nname = \"a\"\nfile = \"x\"\n\
                         [[admin.tokens]]\nname = \"a\"\nfile = \"y\"\n\
                         [[admin.tokens]]\nname = \"has space\"\nfile = \"z\"\n"
    );
    let message = error(&twice);
    assert!(
        message.contains("the name \"a\" is given twice"),
        "{message}"
    );
    assert!(message.contains("name \"has space\" must be"), "{message}");
    let unreadable = parse(&format!("{MINIMAL}{tokens}")).unwrap().admin.unwrap();
    let e = unreadable.named_tokens().unwrap_err().to_string();
    assert!(
        e.contains("admin.tokens \"alice\": cannot read /base/alice"),
        "{e}"
    );
}

#[test]
fn minimal_config_takes_defaults() {
    let config = parse(MINIMAL).unwrap();
    assert_eq!(config.server.webhook_path, "/sume/webhook");
    assert_eq!(config.signature.tolerance, Duration::from_secs(300));
    let LedgerConfig::Sqlite(sqlite) = &config.database else {
        panic!("not the SQLite ledger: {:?}", config.database);
    };
    assert_eq!(sqlite.synchronous, Synchronous::Full);
    assert!(config.handler.is_none());
}

#[test]
fn relative_database_path_is_taken_from_the_config_dir() {
    let config = parse(&format!("{MINIMAL}[database]\npath = \"ledger.db\"\n")).unwrap();
    assert_eq!(
        config.database.sqlite_path(),
        Some(Path::new("/base/ledger.db"))
    );
}

#[test]
fn refuses_missing_or_empty_secret() {
    assert!(error("[signature]\n").contains("signature.secrets: no secret"));
    let empty = parse("[signature]\nsecrets = [\"a\", \"\"]\n").unwrap();
    let e = empty.signing_secrets().unwrap_err().to_string();
    assert!(e.contains("signature.secrets[1] is empty"), "{e}");
    assert!(error("").contains("signature"));
}

/// Regression: the secrets file was read by every command, so with a systemd credential
/// (present only while the unit runs) `jobs list` and `vacuum` failed on the host.
#[test]
fn the_secrets_file_is_read_only_by_who_needs_the_secrets() {
    let config = parse("[signature]\nsecrets_file = \"/nonexistent/secrets\"\n").unwrap();
    let e = config.signing_secrets().unwrap_err().to_string();
    assert!(
        e.contains("signature.secrets_file: cannot read /nonexistent/secrets"),
        "{e}"
    );
}

/// Regression: the published example secret was live on any address.
#[test]
fn the_example_secret_is_refused_off_loopback() {
    let on = |listen: &str| {
        parse(&format!(
            "[server]\nlisten = \"{listen}\"\n[signature]\nsecrets = [\"{EXAMPLE_SECRET}\"]\n"
        ))
        .unwrap()
    };
    assert!(on("127.0.0.1:8080").signing_secrets().is_ok());
    assert!(on("127.0.0.1:8080").warnings()[0].contains("example secret"));
    let e = on("0.0.0.0:8080")
        .signing_secrets()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("example secret") && e.contains("0.0.0.0:8080"),
        "{e}"
    );
    assert!(on("[::]:8080").signing_secrets().is_err());
}

#[test]
fn secrets_file_lines_are_secrets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("secrets"),
        "# rotation\nwhsec_new\n\n  whsec_old  \n",
    )
    .unwrap();
    let config = Config::parse(
        "[signature]\nsecrets = [\"whsec_inline\"]\nsecrets_file = \"secrets\"\n",
        dir.path(),
    )
    .unwrap();
    let secrets = config.signing_secrets().unwrap();
    let secrets: Vec<&[u8]> = secrets.iter().map(AsRef::as_ref).collect();
    assert_eq!(
        secrets,
        [
            b"whsec_inline".as_slice(),
            b"whsec_new".as_slice(),
            b"whsec_old".as_slice()
        ]
    );
}

#[test]
fn refuses_unknown_key_naming_it() {
    let e = error(&format!(
        "{MINIMAL}[server]\nlisten_addr = \"127.0.0.1:1\"\n"
    ));
    assert!(e.contains("listen_addr"), "{e}");
    let e = error(&format!("{MINIMAL}[srever]\n"));
    assert!(e.contains("srever"), "{e}");
}

#[test]
fn refuses_bad_duration_naming_the_key() {
    let e = error("[signature]\nsecrets = [\"a\"]\ntolerance = \"5 parsecs\"\n");
    assert!(
        e.contains("tolerance") && e.contains("invalid duration"),
        "{e}"
    );
}

#[test]
fn durations_are_human() {
    let config = parse(&format!(
        "{MINIMAL}[sweeper]\ninterval = \"1m 30s\"\nstale_after = \"30d\"\n"
    ))
    .unwrap();
    assert_eq!(config.sweeper.interval, Duration::from_secs(90));
    assert_eq!(config.sweeper.stale_after, Duration::from_secs(30 * 86400));
}

#[test]
fn handler_needs_exactly_one_target() {
    assert!(error(&format!("{MINIMAL}[handler]\n")).contains("handler: set one of"));
    let both = format!("{MINIMAL}[handler]\ncommand = [\"true\"]\nurl = \"http://127.0.0.1:1/\"\n");
    assert!(error(&both).contains("not both"));
    let ftp = format!("{MINIMAL}[handler]\nurl = \"ftp://example.com/\"\n");
    assert!(error(&ftp).contains("http:// or https:// URL"));
    let https = format!("{MINIMAL}[handler]\nurl = \"https://example.com/\"\n");
    assert!(parse(&https).is_ok());
    let ok = parse(&format!("{MINIMAL}[handler]\ncommand = [\"true\"]\n")).unwrap();
    assert_eq!(
        ok.handler.unwrap().kind,
        HandlerKind::Command(vec!["true".into()])
    );
}

/// A handler URL's userinfo becomes Basic credentials, taken off the address; it never shows
/// in a debug print or the description; a CA file goes with https only.
#[test]
fn a_handler_urls_password_is_sent_as_basic_and_shown_nowhere() {
    let text = format!(
        "{MINIMAL}[handler]\nurl = \"https://hook%40user:s3cr%3At@example.com:8443/in?x=1\"\n"
    );
    let config = parse(&text).unwrap();
    let handler = config.handler.clone().unwrap();
    let HandlerKind::Url(url) = &handler.kind else {
        panic!("a url handler")
    };
    let target = HandlerUrl::parse(url).unwrap();
    assert_eq!(target.uri.to_string(), "https://example.com:8443/in?x=1");
    let (user, password) = target.basic_auth.unwrap();
    assert_eq!((user.as_str(), password.expose()), ("hook@user", "s3cr:t"));
    assert_eq!(handler.kind.describe(), "url https://example.com:8443/in");
    assert!(!format!("{config:?}").contains("s3cr"), "{config:?}");
    let plain = format!("{MINIMAL}[handler]\nurl = \"http://u:p@example.com/\"\n");
    assert!(parse(&plain)
        .unwrap()
        .warnings()
        .iter()
        .any(|w| w.contains("plain")));
    let ca_with_command =
        format!("{MINIMAL}[handler]\ncommand = [\"true\"]\nca_file = \"ca.pem\"\n");
    assert!(error(&ca_with_command).contains("https:// handler.url only"));
}

#[test]
fn secrets_never_show_in_debug_output() {
    let config = parse(MINIMAL).unwrap();
    assert!(!format!("{config:?}").contains("whsec_a"));
}

#[test]
fn dedupe_ttl_must_cover_ttl_and_short_ones_warn() {
    let e = error(&format!(
        "{MINIMAL}[retention]\nttl = \"30d\"\ndedupe_ttl = \"1d\"\n"
    ));
    assert!(
        e.contains("retention.dedupe_ttl (1day) must be at least retention.ttl"),
        "{e}"
    );
    let config = parse(&format!(
        "{MINIMAL}[retention]\nttl = \"1d\"\ndedupe_ttl = \"2d\"\n"
    ))
    .unwrap();
    assert!(config.warnings()[0].contains("retention.dedupe_ttl is 2days"));
    assert!(parse(MINIMAL).unwrap().warnings().is_empty());
}

#[test]
fn sume_api_reads_its_key_file_and_checks_the_url() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key"), "sk_live_123\n").unwrap();
    let section =
        |url: &str| format!("{MINIMAL}[sume_api]\nbase_url = \"{url}\"\napi_key_file = \"key\"\n");
    let config = Config::parse(&section("https://api.sume.example/"), dir.path()).unwrap();
    let api = config.sume_api.unwrap();
    assert_eq!(api.api_key().unwrap().expose(), "sk_live_123");
    let e = format!(
        "{:#}",
        Config::parse(&section("ftp://x"), dir.path()).unwrap_err()
    );
    assert!(e.contains("sume_api.base_url"), "{e}");
    std::fs::write(dir.path().join("key"), "  \n").unwrap();
    let config = Config::parse(&section("https://x"), dir.path()).unwrap();
    let e = format!("{:#}", config.sume_api.unwrap().api_key().unwrap_err());
    assert!(
        e.contains("sume_api.api_key_file") && e.contains("is empty"),
        "{e}"
    );
}

#[test]
fn absurd_durations_and_limits_are_refused() {
    for (section, key) in [
        ("sweeper", "stale_after = \"0s\""),
        ("sweeper", "interval = \"0s\""),
        ("database", "busy_timeout = \"0s\""),
        ("server", "max_connections = 0"),
        ("server", "max_inflight_body_bytes = 1000"),
        (
            "server",
            "max_body_bytes = 100000000\nmax_inflight_body_bytes = 200000000",
        ),
    ] {
        let e = error(&format!("{MINIMAL}[{section}]\n{key}\n"));
        let name = key.split(' ').next().unwrap();
        assert!(e.contains(name), "{key}: {e}");
    }
    let e = error(&format!(
        "{MINIMAL}[sweeper]\ninterval = \"1000000years\"\n"
    ));
    assert!(e.contains("longer than 100 years"), "{e}");
    assert!(e.contains("line 4") && e.contains("`interval`"), "{e}");
}

/// Regression: `toml` quotes the offending line, and the journal kept it: a typo on the
/// secrets line published the secret.
#[test]
fn toml_errors_never_echo_a_secret() {
    for text in [
        "[signature]\nsecrets = [\"whsec_live_abc123\" \"whsec_live_def456\"]\n",
        "[signature]\nsecrets = \"whsec_live_abc123\"\n",
        "[signature]\nsecrets = [\"whsec_live_abc123\",\n  whsec_live_def456]\n",
    ] {
        let e = error(text);
        assert!(!e.contains("whsec_live"), "{e}");
        assert!(e.contains("line "), "{e}");
    }
    // Outside [signature] the message keeps its detail.
    let e = error(&format!(
        "{MINIMAL}[database]\nsynchronous = \"sometimes\"\n"
    ));
    assert!(
        e.contains("sometimes") && e.contains("`synchronous`"),
        "{e}"
    );
}

#[test]
fn example_config_is_valid() {
    let text = include_str!("../../config.example.toml");
    Config::parse(text, Path::new("/base")).unwrap();
}

/// `[admin] due_job_limit`: 10 minutes unless set, a human duration, never zero.
#[test]
fn the_due_job_limit_defaults_to_ten_minutes_and_is_never_zero() {
    let admin = |extra: &str| format!("{MINIMAL}[admin]\ntoken_file = \"t\"\n{extra}");
    let limit = |text: &str| parse(text).unwrap().admin.unwrap().due_job_limit;
    assert_eq!(limit(&admin("")), Duration::from_secs(600));
    assert_eq!(
        limit(&admin("due_job_limit = \"90s\"\n")),
        Duration::from_secs(90)
    );
    let zero = error(&admin("due_job_limit = \"0s\"\n"));
    assert!(
        zero.contains("admin.due_job_limit must be greater than zero"),
        "{zero}"
    );
    let nonsense = error(&admin("due_job_limit = \"soon\"\n"));
    assert!(nonsense.contains("due_job_limit"), "{nonsense}");
}

#[test]
fn a_plain_admin_listener_off_loopback_needs_an_explicit_key() {
    let dir = tempfile::tempdir().unwrap();
    let text = |extra: &str| {
        format!(
            "[signature]\nsecrets = [\"whsec_a\"]\n[admin]\nlisten = \"0.0.0.0:8081\"\n\
             token_file = \"t\"\n{extra}"
        )
    };
    let refused = Config::parse(&text(""), dir.path())
        .unwrap_err()
        .to_string();
    assert!(refused.contains("admin.allow_plain_http"), "{refused}");
    let allowed = Config::parse(&text("allow_plain_http = true\n"), dir.path()).unwrap();
    assert!(
        allowed.warnings().iter().any(|w| w.contains("plain HTTP")),
        "{:?}",
        allowed.warnings()
    );
    let loopback = Config::parse(
        "[signature]\nsecrets = [\"whsec_a\"]\n[admin]\ntoken_file = \"t\"\n",
        dir.path(),
    );
    assert!(loopback.is_ok());
}

/// Regression: `/metrics` was served to the internet by default, with no word of it.
#[test]
fn metrics_served_off_loopback_are_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let warnings = |text: &str| {
        Config::parse(
            &format!("[signature]\nsecrets = [\"whsec_a\"]\n{text}"),
            dir.path(),
        )
        .unwrap()
        .warnings()
    };
    let said = |warnings: &[String]| warnings.iter().any(|w| w.contains("/metrics"));
    assert!(said(&warnings("[server]\nlisten = \"0.0.0.0:8080\"\n")));
    assert!(!said(&warnings(
        "[server]\nlisten = \"0.0.0.0:8080\"\nexpose_metrics = false\n"
    )));
    assert!(!said(&warnings("[server]\nlisten = \"127.0.0.1:8080\"\n")));
    let admin = |listen: &str| {
        warnings(&format!(
            "[admin]\nlisten = \"{listen}\"\ntoken_file = \"t\"\nallow_plain_http = true\n"
        ))
    };
    assert!(said(&admin("0.0.0.0:8081")));
    assert!(!said(&admin("127.0.0.1:8081")));
}
