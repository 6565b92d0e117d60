//! The shipped alert rules and dashboard (packaging/alerts/): promtool checks the rules and runs
//! their unit tests, and every metric they name is one a real receiver serves. (Its own test
//! binary: the metrics are per process.)

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::tls::{https_server, TestCa};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ALERTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/alerts");
const RULES: &str = include_str!("../packaging/alerts/sume-receiver.rules.yml");
const DASHBOARD: &str = include_str!("../packaging/alerts/sume-receiver.dashboard.json");
/// Metrics only a PostgreSQL ledger serves: the SQLite scrape leaves them out, the PostgreSQL
/// test below checks them.
const POSTGRES_ONLY: &[&str] = &["sume_work_side_writable"];
/// Metrics only an HTTPS listener serves: checked on one of their own below.
const TLS_ONLY: &[&str] = &[
    "sume_tls_certificate_present",
    "sume_tls_certificate_expiry_timestamp_seconds",
    "sume_tls_certificate_failures_total",
    "sume_tls_handshakes_refused_total",
];

#[test]
fn promtool_checks_the_rules_and_each_alert_fires_and_stays_silent_as_tested() {
    if Command::new("promtool").arg("--version").output().is_err() {
        skip(
            "promtool_checks_the_rules_and_each_alert_fires_and_stays_silent_as_tested",
            "no promtool (apt-get install prometheus)",
        );
        return;
    }
    for args in [
        ["check", "rules", "sume-receiver.rules.yml"],
        ["test", "rules", "sume-receiver.test.yml"],
    ] {
        let run = Command::new("promtool")
            .args(args)
            .current_dir(ALERTS)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
    }
    // Every alert has its unit test (a rule without one would pass promtool unnoticed).
    let tests = std::fs::read_to_string(Path::new(ALERTS).join("sume-receiver.test.yml")).unwrap();
    let alerts: Vec<&str> = RULES
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 11, "{alerts:?}");
    for alert in alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no promtool test"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_rules_and_the_dashboard_use_is_served_and_says_what_it_should() {
    let server = TestServer::start("[handler]\ncommand = [\"true\"]\n").await;
    // Signed 42 s ago: our clock is 42 s ahead of the sender's.
    let answer = server
        .deliver_signed(&job_body("job-ran"), unix_now() - 42, &[SECRET])
        .await;
    assert_eq!(answer.status, 200);
    let ran = eventually(Duration::from_secs(10), || {
        server.state_of("job-ran").as_deref() == Some("done")
    })
    .await;
    assert!(ran, "the job never ran");
    let text = server.metrics().await;
    let served = Served::new(&text);

    let dashboard: serde_json::Value =
        serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    queries_of(&dashboard, &mut queries);
    assert!(
        queries.len() >= 20,
        "the dashboard has {} queries",
        queries.len()
    );
    let mut used = BTreeSet::new();
    let mut used_by_tls = Vec::new();
    for text in queries.iter().map(String::as_str).chain(rule_exprs(RULES)) {
        for (name, matchers) in selectors(text) {
            used.insert(name);
            if TLS_ONLY.contains(&name) {
                used_by_tls.push((name, matchers, text));
                continue;
            }
            if POSTGRES_ONLY.contains(&name) {
                continue;
            }
            assert!(
                served.has(name, &matchers),
                "{name}{{{matchers:?}}} is used but not served:\n{text}"
            );
        }
    }
    // The facts this issue added to /metrics are among them.
    for name in [
        "sume_ready",
        "sume_ledger_reachable",
        "sume_oldest_due_job_wait_seconds",
        "sume_ledger_filesystem_free_bytes",
        "sume_ledger_filesystem_size_bytes",
        "sume_delivery_clock_skew_seconds",
        "sume_signature_tolerance_seconds",
    ] {
        assert!(used.contains(name), "{name} is used by no rule or panel");
    }

    // And they hold what they say.
    assert_eq!(served.value("sume_ready"), Some(1.0));
    assert_eq!(served.value("sume_ledger_reachable"), Some(1.0));
    // The default tolerance, 5 minutes.
    assert_eq!(
        served.value("sume_signature_tolerance_seconds"),
        Some(300.0)
    );
    let skew = served.value("sume_delivery_clock_skew_seconds").unwrap();
    assert!((42.0..=44.0).contains(&skew), "{skew}");
    assert_eq!(served.value("sume_oldest_due_job_wait_seconds"), Some(0.0));
    let free = served.value("sume_ledger_filesystem_free_bytes").unwrap();
    let size = served.value("sume_ledger_filesystem_size_bytes").unwrap();
    assert!(free > 0.0 && free <= size, "{free} of {size}");

    // No handler: a claimed job is due at once and never started. (In this test, not one of
    // its own: the gauges are the process's, and its delivery would set the skew above.)
    let idle = TestServer::start("").await;
    assert_eq!(idle.deliver(&job_body("job-waits")).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = idle.metrics().await;
    let waited = Served::new(&text)
        .value("sume_oldest_due_job_wait_seconds")
        .unwrap();
    assert!(waited >= 1.0, "{waited}");

    // The TLS metrics, from a receiver with HTTPS that refused a plain HTTP request and a
    // certificate that is not its key's.
    let tls = https_server(&TestCa::new(), "").await;
    let mut plain = tokio::net::TcpStream::connect(tls.addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    plain.read_to_end(&mut Vec::new()).await.unwrap();
    std::fs::write(tls.dir.path().join("cert.pem"), TestCa::new().leaf().cert).unwrap();
    // Both are counted a little later: the refusal once its connection ends, the reload once
    // the changed files have been read twice, a second apart. Within 30 s on a loaded machine.
    let mut text = String::new();
    for _ in 0..600 {
        text = tls.metrics().await;
        if TLS_ONLY
            .iter()
            .all(|name| text.contains(&format!("\n{name}{{")))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = Served::new(&text);
    assert!(!used_by_tls.is_empty());
    for (name, matchers, query) in used_by_tls {
        assert!(
            served.has(name, &matchers),
            "{name}{{{matchers:?}}} is used but not served over HTTPS:\n{query}\n{text}"
        );
    }
}

/// `SumeLedgerUnreachable`'s fact: with PostgreSQL refusing every connection, `/metrics` still
/// answers (it answered 503, which Prometheus counts as the receiver down) and says so.
#[tokio::test(flavor = "multi_thread")]
async fn on_postgresql_an_unreachable_ledger_is_a_metric_not_a_failed_scrape() {
    let test = "on_postgresql_an_unreachable_ledger_is_a_metric_not_a_failed_scrape";
    Backend::Postgres
        .run(test, async {
            let server = TestServer::start("").await;
            let text = server.metrics().await;
            let served = Served::new(&text);
            assert_eq!(served.value("sume_ledger_reachable"), Some(1.0));
            assert_eq!(served.value("sume_ready"), Some(1.0));
            for name in POSTGRES_ONLY {
                assert_eq!(served.value(name), Some(1.0), "{name}:\n{text}");
            }

            let url = postgres_url_of(server.dir.path());
            let name = url.rsplit('/').next().unwrap().to_owned();
            let admin = std::env::var("SUME_TEST_POSTGRES_URL").unwrap();
            let allow = |allowed: bool| {
                with_postgres(&admin, |client| {
                    client
                        .batch_execute(&format!(
                            "ALTER DATABASE {name} ALLOW_CONNECTIONS {allowed};
                             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                              WHERE datname = '{name}'"
                        ))
                        .unwrap()
                })
            };
            tokio::task::block_in_place(|| allow(false));
            let text = server.metrics().await;
            assert_eq!(
                Served::new(&text).value("sume_ledger_reachable"),
                Some(0.0),
                "{text}"
            );
            tokio::task::block_in_place(|| allow(true));
            let reachable_again = async {
                loop {
                    let text = server.metrics().await;
                    if Served::new(&text).value("sume_ledger_reachable") == Some(1.0) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(20), reachable_again)
                .await
                .expect("the ledger never read as reachable again");
        })
        .await;
}

/// The samples of one scrape: `(name, labels, value)`.
struct Served<'a>(Vec<(&'a str, &'a str, f64)>);

impl<'a> Served<'a> {
    fn new(text: &'a str) -> Self {
        Served(
            text.lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(|line| {
                    let (series, value) = line.rsplit_once(' ')?;
                    let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
                    Some((name, labels.strip_suffix('}')?, value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// Whether a sample of `name` carries every `label="value"` of `matchers`.
    fn has(&self, name: &str, matchers: &[String]) -> bool {
        self.0.iter().any(|(served, labels, _)| {
            *served == name
                && matchers
                    .iter()
                    .all(|matcher| labels.split(',').any(|label| label == matcher.as_str()))
        })
    }

    fn value(&self, name: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|(served, _, _)| *served == name)
            .map(|(_, _, value)| *value)
    }
}

/// Every metric of ours a PromQL text names (`sume_*`, `process_*`), with the exact-match
/// label matchers of its selector (`outcome="unauthorized"`); regex matchers (the dashboard's
/// `instance=~"$instance"`) match anything.
fn selectors(text: &str) -> Vec<(&str, Vec<String>)> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| is_name(c)) {
        let word_end = rest[start..]
            .find(|c: char| !is_name(c))
            .map_or(rest.len(), |end| start + end);
        let word = &rest[start..word_end];
        let after = &rest[word_end..];
        if word.starts_with("sume_") || word.starts_with("process_") {
            let matchers = match after.strip_prefix('{') {
                Some(inside) => inside[..inside.find('}').unwrap()]
                    .split(',')
                    .map(|matcher| matcher.trim().to_owned())
                    .filter(|matcher| matcher.contains("=\"") && !matcher.contains("=~"))
                    .collect(),
                None => Vec::new(),
            };
            found.push((word, matchers));
        }
        rest = after;
    }
    found
}

/// The PromQL of a dashboard: its panels' `expr`, its variables' `query` and `definition`.
fn queries_of(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Array(items) => items.iter().for_each(|item| queries_of(item, out)),
        serde_json::Value::Object(fields) => {
            for (key, item) in fields {
                match item {
                    serde_json::Value::String(query)
                        if ["expr", "query", "definition"].contains(&key.as_str()) =>
                    {
                        out.push(query.clone())
                    }
                    _ => queries_of(item, out),
                }
            }
        }
        _ => {}
    }
}

/// The `expr:` of each rule: on its line, or the block (`expr: |`) indented under it.
fn rule_exprs(rules: &str) -> Vec<&str> {
    let lines: Vec<&str> = rules.lines().collect();
    let mut exprs = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let Some(expr) = line.trim_start().strip_prefix("expr: ") else {
            continue;
        };
        if expr != "|" {
            exprs.push(expr);
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        exprs.extend(
            lines[at + 1..]
                .iter()
                .take_while(|next| next.len() - next.trim_start().len() > indent)
                .copied(),
        );
    }
    exprs
}
