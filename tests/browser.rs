//! The console in a real browser: Debian's chromium, driven by its chromedriver over WebDriver.
//! No page breaks the Content-Security-Policy (and a canary page proves that breaches are
//! reported); no canary an attacker could plant runs; a form on another site changes nothing;
//! a foreign Host name is refused; the main flows work by clicking.
//!
//! SUME_SCREENSHOTS=<dir> saves the main pages as PNG files there (the README's pictures:
//! `SUME_SCREENSHOTS=docs/screenshots cargo test --test browser`).

mod common;

use std::convert::Infallible;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const OPERATOR_TOKEN: &str = "browser-operator-token";
const READ_TOKEN: &str = "browser-read-token";
/// Each sets `window.__xss` if it ever runs.
const CANARY_IMG: &str = "<img src=x onerror=\"window.__xss=1\">";
const CANARY_SCRIPT: &str = "<script>window.__xss=2</script>";

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_browser() -> (Driver, Client) {
    let port = free_port();
    let driver = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver(driver);
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900",
                // A name that resolves to this machine: the DNS-rebinding case, without DNS.
                "--host-resolver-rules=MAP evil.test 127.0.0.1",
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        let client = ClientBuilder::new(connector.clone())
            .capabilities(capabilities.clone())
            .connect(&url)
            .await;
        if let Ok(client) = client {
            return (driver, client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver never took a session on {url}");
}

/// A site of its own (another origin) whose page posts a form to the console at once.
async fn attacker_site(target: String) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let target = target.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_| {
                    let page = format!(
                        "<form method=post action=\"{target}\"></form>\
                         <script>document.forms[0].submit()</script>"
                    );
                    async move {
                        let mut response = Response::new(Full::new(Bytes::from(page)));
                        response
                            .headers_mut()
                            .insert("content-type", "text/html".parse().unwrap());
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

async fn text_of(client: &Client) -> String {
    client
        .find(Locator::Css("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Nothing planted ran on this page.
async fn no_canary_ran(client: &Client, page: &str) {
    let ran = client
        .execute("return window.__xss === undefined;", vec![])
        .await
        .unwrap();
    assert_eq!(ran, serde_json::json!(true), "a canary ran on {page}");
}

async fn sign_in(client: &Client, base: &str, token: &str) {
    client.goto(&format!("{base}/console/")).await.unwrap();
    assert!(client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/sign-in"));
    client
        .find(Locator::Css("input[name=token]"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    click(client, Locator::Css("form button")).await;
    // The navigation exists only once signed in (the sign-in page has an h1 too).
    wait_for(client, Locator::Css("header nav")).await;
}

/// The CSP reports the console received so far (as the signed-in browser reads them).
async fn csp_reports(client: &Client, base: &str) -> Vec<serde_json::Value> {
    client
        .goto(&format!("{base}/console/api/csp-reports"))
        .await
        .unwrap();
    let text = text_of(client).await;
    serde_json::from_str::<Vec<serde_json::Value>>(&text).unwrap_or_else(|_| panic!("{text}"))
}

async fn click(client: &Client, target: Locator<'_>) {
    client.find(target).await.unwrap().click().await.unwrap();
}

async fn wait_for(client: &Client, target: Locator<'_>) -> fantoccini::elements::Element {
    client.wait().for_element(target).await.unwrap()
}

/// Clicks the button labelled `label`, accepts the question it asks, waits for the answer.
async fn click_and_confirm(client: &Client, label: &str) {
    let xpath = format!("//button[text()='{label}']");
    click(client, Locator::XPath(&xpath)).await;
    client.accept_alert().await.unwrap();
    wait_for(client, Locator::Css("p#done")).await;
}

async fn screenshot(client: &Client, name: &str) {
    if let Ok(dir) = std::env::var("SUME_SCREENSHOTS") {
        let png = client.screenshot().await.unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_works_in_a_real_browser_and_keeps_its_guard() {
    if !std::path::Path::new(CHROMEDRIVER).exists() {
        skip(
            "the_console_works_in_a_real_browser_and_keeps_its_guard",
            "no /usr/bin/chromedriver (apt-get install chromium chromium-driver)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    std::fs::write(dir.path().join("admin_token"), OPERATOR_TOKEN).unwrap();
    std::fs::write(dir.path().join("read_token"), READ_TOKEN).unwrap();
    let script = format!("echo '{CANARY_IMG}' >&2; exit 4");
    let config = format!(
        "[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nmax_attempts = 1\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\
         read_token_file = \"read_token\"\nconsole_actions = true\n"
    );
    let server = TestServer::start_in(dir, &config).await;
    let job_id = format!("job{CANARY_IMG}");
    let body = serde_json::json!({
        "job_id": job_id,
        "type": format!("job.completed{CANARY_SCRIPT}"),
        "result": { "note": CANARY_SCRIPT },
    });
    assert_eq!(server.deliver(&body.to_string()).await.status, 200);
    for n in 0..3 {
        assert_eq!(
            server
                .deliver(&job_body(&format!("same-failure-{n}")))
                .await
                .status,
            200
        );
    }
    server.deliver_signed("{}", unix_now(), &["forged"]).await;
    let dead = eventually(Duration::from_secs(10), || {
        server.value("SELECT count(*) FROM jobs WHERE state = 'dead'", &[]) == 4
    })
    .await;
    assert!(dead);

    let (_driver, client) = start_browser().await;
    let base = format!("http://127.0.0.1:{admin_port}");
    sign_in(&client, &base, OPERATOR_TOKEN).await;
    let overview = text_of(&client).await;
    assert!(overview.contains("Is anything wrong?"));
    // The verdict answers it: red, with its evidence one click away.
    assert!(
        overview.contains("Failing: something is wrong now."),
        "{overview}"
    );
    let reason = wait_for(&client, Locator::Css("section.verdict li a")).await;
    assert_eq!(
        reason.text().await.unwrap(),
        "4 jobs went dead in the last hour"
    );
    assert_eq!(
        reason.attr("href").await.unwrap().as_deref(),
        Some("/console/dead")
    );
    // The charts fill the page's width, with their times on the axis.
    let chart = wait_for(&client, Locator::Css("svg.chart")).await;
    let (_, _, width, _) = chart.rectangle().await.unwrap();
    let (_, _, page_width, _) = wait_for(&client, Locator::Css("main"))
        .await
        .rectangle()
        .await
        .unwrap();
    assert!(width > page_width * 0.9, "{width} of {page_width}");
    assert!(wait_for(&client, Locator::Css("svg.chart text.time"))
        .await
        .text()
        .await
        .unwrap()
        .contains(':'));
    // Every scale label drawn in full inside its chart, as the browser lays it out ("129 ms"
    // once showed as ".29 ms": its first digit left of the drawing's edge).
    let lefts = client
        .execute(
            "return [...document.querySelectorAll('svg.chart text.scale')]
                 .map(t => [t.textContent, t.getBBox().x]);",
            vec![],
        )
        .await
        .unwrap();
    let lefts = lefts.as_array().unwrap();
    assert!(lefts.len() >= 6, "{lefts:?}");
    for label in lefts {
        assert!(label[1].as_f64().unwrap() >= 0.0, "cut off: {label:?}");
    }
    screenshot(&client, "overview").await;

    // Every page: rendered, nothing planted runs, and (below) not one CSP report.
    for page in [
        "/console/",
        "/console/jobs",
        "/console/jobs?state=dead",
        "/console/dead",
        "/console/receipts",
        "/console/expected",
        "/console/config",
    ] {
        client.goto(&format!("{base}{page}")).await.unwrap();
        wait_for(&client, Locator::Css("main h1")).await;
        no_canary_ran(&client, page).await;
    }

    // The main flow by clicking: the dead letters, the job's timeline, a retry of its group.
    client.goto(&format!("{base}/console/")).await.unwrap();
    click(&client, Locator::LinkText("Dead letters")).await;
    wait_for(&client, Locator::Css("td.mono a")).await;
    screenshot(&client, "dead-letters").await;
    click(&client, Locator::Css("td.mono a")).await;
    wait_for(&client, Locator::Css("ol.timeline")).await;
    no_canary_ran(&client, "the job").await;
    let timeline = text_of(&client).await;
    assert!(timeline.contains("attempt 1 (first): dead"), "{timeline}");
    assert!(
        timeline.contains(CANARY_IMG),
        "the canary is shown as text\n{timeline}"
    );
    screenshot(&client, "job").await;
    client.back().await.unwrap();
    wait_for(&client, Locator::Css("td form button")).await;
    click(&client, Locator::Css("td form button")).await;
    // The confirmation's form is main's own (the dead letters' are in the table).
    let confirm = wait_for(&client, Locator::Css("main > form > button")).await;
    assert_eq!(confirm.text().await.unwrap(), "Retry 4 jobs");
    confirm.click().await.unwrap();
    client.accept_alert().await.unwrap();
    wait_for(&client, Locator::Css("p#done")).await;
    assert!(text_of(&client)
        .await
        .contains("4 jobs of the group \"exited with status 4: "));
    let ran_again = eventually(Duration::from_secs(10), || {
        server.value(
            "SELECT count(*) FROM job_attempts WHERE job_id = ?1",
            &[&job_id],
        ) == 2
    })
    .await;
    assert!(ran_again, "the retried group did not run");

    // Pause and resume by clicking (each asks first).
    client.goto(&format!("{base}/console/")).await.unwrap();
    click_and_confirm(&client, "Pause dispatch").await;
    assert_eq!(server.value("SELECT paused FROM dispatch", &[]), 1);
    client.goto(&format!("{base}/console/")).await.unwrap();
    assert!(text_of(&client).await.contains("Dispatch is paused"));
    click_and_confirm(&client, "Resume dispatch").await;
    assert_eq!(server.value("SELECT paused FROM dispatch", &[]), 0);

    // An HTTP handler's answer is attacker-influenced too (a forward to a service that echoes
    // what it was sent): the attempt that recorded one shows it as text, and it never runs.
    let answer = "the handler answered HTTP 502: <script>window.__xss=3</script>";
    server.execute(
        "INSERT INTO jobs (job_id, state, body, received_at, attempts, finished_at, last_error, \
         updated_at) VALUES ('http-answer', 'dead', '{}', 1, 1, 2, ?1, 2)",
        &[answer],
    );
    server.execute(
        "INSERT INTO job_attempts (job_id, number, cause, started_at, ended_at, outcome, \
         http_status, error) VALUES ('http-answer', 1, 'first', 1, 2, 'dead', 502, ?1)",
        &[answer],
    );
    client
        .goto(&format!("{base}/console/jobs/http-answer"))
        .await
        .unwrap();
    wait_for(&client, Locator::Css("ol.timeline")).await;
    no_canary_ran(&client, "an HTTP handler's answer").await;
    let shown = text_of(&client).await;
    assert!(shown.contains("<script>window.__xss=3</script>"), "{shown}");
    assert!(shown.contains("HTTP 502"), "{shown}");

    // A page on another origin posts a form to the console: refused; nothing changes.
    let attacker = attacker_site(format!("{base}/console/dispatch/pause")).await;
    client
        .goto(&format!("http://localhost:{attacker}/"))
        .await
        .unwrap();
    let mut refused = false;
    for _ in 0..50 {
        refused = text_of(&client).await.contains("another site");
        if refused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "{}", text_of(&client).await);
    assert_eq!(server.value("SELECT paused FROM dispatch", &[]), 0);

    // DNS rebinding: the same listener under another name is not answered.
    client
        .goto(&format!("http://evil.test:{admin_port}/console/"))
        .await
        .unwrap();
    assert!(text_of(&client)
        .await
        .contains("does not answer to that Host name"));

    // Not one CSP violation so far; the canary page then proves that violations are reported.
    assert_eq!(
        csp_reports(&client, &base).await,
        Vec::<serde_json::Value>::new()
    );
    client
        .goto(&format!("{base}/console/csp-canary"))
        .await
        .unwrap();
    assert_ne!(
        client.title().await.unwrap(),
        "canary ran",
        "the inline script ran"
    );
    let mut reported = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        reported = !csp_reports(&client, &base).await.is_empty();
        if reported {
            break;
        }
    }
    assert!(reported, "the canary's violations were never reported");

    // A reader sees the same pages without a single button that acts.
    client.goto(&format!("{base}/console/")).await.unwrap();
    click(&client, Locator::XPath("//button[text()='Sign out']")).await;
    sign_in(&client, &base, READ_TOKEN).await;
    let buttons = client.find_all(Locator::Css("main button")).await.unwrap();
    assert!(
        buttons.is_empty(),
        "a reader's overview has {} buttons",
        buttons.len()
    );
    assert!(text_of(&client).await.contains("(read-only)"));

    client.close().await.unwrap();
    server.stop().await.0.unwrap();
}
