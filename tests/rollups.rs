//! The console's last hour across a restart: what a receiver counted is in its charts and their
//! JSON twin after a graceful stop and a start on the same ledger. Real processes: the minutes
//! are counted in the process's memory, and only the ledger carries them to the next one.

mod common;

use std::time::Duration;

use common::service::{signed_delivery, write_config, Service};
use common::*;
use hyper::Method;
use sume_receiver::config::Config;
use sume_receiver::http_client;

const TOKEN: &str = "rollup-console-token";

/// Signs in to the console on `admin_port` (once its listener is up); the session cookie.
async fn sign_in(admin_port: u16) -> String {
    let listening = eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", admin_port)).is_ok()
    });
    assert!(
        listening.await,
        "the console on {admin_port} never listened"
    );
    let origin = format!("http://127.0.0.1:{admin_port}");
    let headers = [
        ("origin", origin.as_str()),
        ("sec-fetch-site", "same-origin"),
        ("content-type", "application/x-www-form-urlencoded"),
    ];
    let url = format!("{origin}/console/sign-in");
    let answer = send_body_to(Method::POST, &url, &headers, &format!("token={TOKEN}")).await;
    assert_eq!(answer.status, 303, "{answer:?}");
    let cookie = answer.headers["set-cookie"].to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}

async fn get(admin_port: u16, cookie: &str, path: &str) -> String {
    let url = format!("http://127.0.0.1:{admin_port}{path}");
    let answer = send_to(Method::GET, &url, &[("cookie", cookie)]).await;
    assert_eq!(answer.status, 200, "{path}: {answer:?}");
    String::from_utf8(answer.body.to_vec()).unwrap()
}

/// A receiver's config in `dir` with the console on and `extra` sections: its file, the config,
/// the port and the console's port.
fn with_console(dir: &std::path::Path, extra: &str) -> (std::path::PathBuf, Config, u16, u16) {
    std::fs::write(dir.join("admin_token"), TOKEN).unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let extra = format!(
        "{extra}\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n"
    );
    let path = write_config(dir, port, "", &extra);
    let config = Config::parse(&std::fs::read_to_string(&path).unwrap(), dir).unwrap();
    (path, config, port, admin_port)
}

/// The per-minute counts of `label` in the overview's JSON twin.
fn minutes_of(overview: &serde_json::Value, label: &str) -> Vec<u64> {
    let series = overview["last_hour"]["series"].as_array().unwrap();
    let (_, counts) = series
        .iter()
        .map(|pair| (pair[0].as_str().unwrap(), &pair[1]))
        .find(|(name, _)| *name == label)
        .unwrap_or_else(|| panic!("no series {label}: {overview}"));
    counts
        .as_array()
        .unwrap()
        .iter()
        .map(|count| count.as_u64().unwrap())
        .collect()
}

on_both_ledgers! {
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_restart_keeps_the_last_hour_in_the_charts_and_their_twin() {
    let dir = tempfile::tempdir().unwrap();
    let (config_path, config, port, admin_port) =
        with_console(dir.path(), "[handler]\ncommand = [\"true\"]\n");

    let service = Service::start(&config_path, port).await;
    let client = http_client::new_client();
    for job in 0..3 {
        let request = signed_delivery(port, SECRET, &job_body(&format!("kept-{job}")));
        let answer = http_client::send(&client, request, Duration::from_secs(10), 4096).await;
        assert_eq!(answer.unwrap().status, 200);
    }
    let cookie = sign_in(admin_port).await;
    let mut before = serde_json::Value::Null;
    for _ in 0..500 {
        before = serde_json::from_str(&get(admin_port, &cookie, "/console/api/").await).unwrap();
        if minutes_of(&before, "done").iter().sum::<u64>() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(minutes_of(&before, "done").iter().sum::<u64>(), 3, "{before}");
    service.stop_cleanly().await;

    let sums = "SELECT CAST(sum(claimed) AS BIGINT), CAST(sum(done) AS BIGINT),
                       CAST(sum(ack_count) AS BIGINT) FROM minute_rollups";
    let kept: Vec<i64> = ledger_rows(&config, sums, &[])[0]
        .iter()
        .map(|sum| sum.as_i64().unwrap())
        .collect();
    assert_eq!(kept, [3, 3, 3], "the stop wrote its minutes");

    let service = Service::start(&config_path, port).await;
    let cookie = sign_in(admin_port).await;
    let after: serde_json::Value =
        serde_json::from_str(&get(admin_port, &cookie, "/console/api/").await).unwrap();
    for label in ["claimed", "done"] {
        let (was, is) = (minutes_of(&before, label), minutes_of(&after, label));
        assert_eq!(is.iter().sum::<u64>(), 3, "{label}: {after}");
        // The same minutes, unless the restart moved the hour on by one.
        let moved = usize::from(after["last_hour"]["until_minute"] != before["last_hour"]["until_minute"]);
        assert_eq!(is[..is.len() - moved], was[moved..], "{label}");
    }
    let page = get(admin_port, &cookie, "/console/").await;
    for count in minutes_of(&after, "claimed").into_iter().filter(|count| *count > 0) {
        assert!(page.contains(&format!("claimed {count}")), "a chart shows the kept minute: {page}");
    }
    service.stop_cleanly().await;
}

/// The minute that ended is written without a stop, soon after its end: a kill -9 after that
/// loses none of it (a crash loses only the minutes not yet written).
#[tokio::test(flavor = "multi_thread")]
async fn a_finished_minute_is_kept_without_a_stop_and_survives_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (config_path, config, port, admin_port) = with_console(dir.path(), "");
    let service = Service::start(&config_path, port).await;
    let request = signed_delivery(port, SECRET, &job_body("crash-kept"));
    let client = http_client::new_client();
    let answer = http_client::send(&client, request, Duration::from_secs(10), 4096).await;
    assert_eq!(answer.unwrap().status, 200);
    let claimed_in = || {
        let sql = "SELECT minute FROM minute_rollups WHERE claimed = 1";
        ledger_rows(&config, sql, &[]).first().map(|row| row[0].as_i64().unwrap())
    };
    // Written about 2 s after its minute ends: within 65 s of the delivery.
    let written = eventually(Duration::from_secs(70), || claimed_in().is_some()).await;
    assert!(written, "the minute of the delivery was never written");
    service.kill_9();

    let service = Service::start(&config_path, port).await;
    let cookie = sign_in(admin_port).await;
    let after: serde_json::Value =
        serde_json::from_str(&get(admin_port, &cookie, "/console/api/").await).unwrap();
    assert_eq!(minutes_of(&after, "claimed").iter().sum::<u64>(), 1, "{after}");
    service.stop_cleanly().await;
}
}
