//! The console over plain HTTP, as a script (or a browser with JavaScript off) sees it: the
//! Host allowlist, sign-in and its limit, read-only sessions, same-origin POSTs, escaping of
//! everything a stranger or a handler wrote, and the actions.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::{Method, Request};
use sume_receiver::http_client::{self, Answer};

const OPERATOR_TOKEN: &str = "console-operator-token";
const READ_TOKEN: &str = "console-read-token";
/// `[[admin.tokens]]`: alice, an operator by name.
const ALICE_TOKEN: &str = "console-alice-token";
/// Written by a handler on stderr, and sent as an event type and in a payload: none of it may
/// ever reach a page unescaped.
const CANARY: &str = "<img src=x onerror=\"window.__xss=1\">";

/// A failing handler whose stderr is the canary; an admin listener with the console.
fn console_config(dir: &std::path::Path, admin_port: u16, actions: bool) -> String {
    std::fs::write(dir.join("admin_token"), OPERATOR_TOKEN).unwrap();
    std::fs::write(dir.join("read_token"), READ_TOKEN).unwrap();
    std::fs::write(dir.join("alice_token"), ALICE_TOKEN).unwrap();
    let script = format!("echo '{CANARY}' >&2; exit 4");
    format!(
        "[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nmax_attempts = 1\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\
         read_token_file = \"read_token\"\nconsole_actions = {actions}\n\n\
         [[admin.tokens]]\nname = \"alice\"\nfile = \"alice_token\"\nrole = \"operator\"\n"
    )
}

struct Console {
    port: u16,
    cookie: Option<String>,
}

impl Console {
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("http://127.0.0.1:{}{path}", self.port));
        if let Some(cookie) = &self.cookie {
            builder = builder.header("cookie", format!("sume_console={cookie}"));
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        http_client::send(
            &http_client::new_client(),
            request,
            Duration::from_secs(10),
            1 << 20,
        )
        .await
        .unwrap()
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, &[], "").await
    }

    /// A form POST as a browser sends it from the console's own page.
    async fn post(&self, path: &str, form: &str) -> Answer {
        let origin = format!("http://127.0.0.1:{}", self.port);
        let headers = [
            ("origin", origin.as_str()),
            ("sec-fetch-site", "same-origin"),
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        self.send(Method::POST, path, &headers, form).await
    }

    async fn sign_in(port: u16, token: &str) -> Console {
        let anonymous = Console { port, cookie: None };
        let answer = anonymous
            .post("/console/sign-in", &format!("token={token}"))
            .await;
        assert_eq!(answer.status, 303, "{answer:?}");
        let cookie = answer.headers["set-cookie"].to_str().unwrap().to_owned();
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age="] {
            assert!(cookie.contains(attribute), "{cookie}");
        }
        let value = cookie
            .split(';')
            .next()
            .unwrap()
            .strip_prefix("sume_console=")
            .unwrap();
        Console {
            port,
            cookie: Some(value.to_owned()),
        }
    }
}

fn html(answer: &Answer) -> String {
    String::from_utf8_lossy(&answer.body).into_owned()
}

/// Every page the console has, for one dead job.
fn pages(job_href: &str) -> Vec<String> {
    [
        "/console/",
        "/console/jobs",
        "/console/jobs?state=dead",
        job_href,
        "/console/dead",
        "/console/receipts",
        "/console/expected",
        "/console/config",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A dead job whose id, event type, payload and error are all canaries; its console path.
async fn dead_canary_job(server: &TestServer) -> String {
    let job_id = format!("job{CANARY}");
    let body = serde_json::json!({
        "job_id": job_id,
        "type": format!("job.completed{}", "<script>window.__xss=1</script>"),
        "result": { "note": CANARY },
    })
    .to_string();
    assert_eq!(server.deliver(&body).await.status, 200);
    let dead = eventually(Duration::from_secs(10), || {
        server.state_of(&job_id).as_deref() == Some("dead")
    })
    .await;
    assert!(dead);
    format!("/console/jobs/{}", percent(&job_id))
}

/// `text` percent-encoded but for unreserved characters: a path segment, or a form value.
fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_answers_only_its_own_host_and_signed_in_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = console_config(dir.path(), admin_port, false);
    let server = TestServer::start_in(dir, &config).await;
    let anonymous = Console {
        port: admin_port,
        cookie: None,
    };
    for host in [
        "evil.example",
        "evil.example:80",
        &format!("attacker.test:{admin_port}"),
    ] {
        let answer = anonymous
            .send(Method::GET, "/console/sign-in", &[("host", host)], "")
            .await;
        assert_eq!(answer.status, 421, "Host {host}");
    }
    let answer = anonymous.get("/console/").await;
    assert_eq!(answer.status, 303);
    assert_eq!(answer.headers["location"], "/console/sign-in");
    let sign_in = anonymous.get("/console/sign-in").await;
    assert_eq!(sign_in.status, 200);
    let csp = sign_in.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(sign_in.headers["x-frame-options"], "DENY");
    assert_eq!(
        anonymous.get("/console/jobs").await.status,
        303,
        "no page without a session"
    );
    assert_eq!(anonymous.get("/console/api/jobs").await.status, 303);

    // A sign-in posted from another site is refused before the token is even looked at.
    let cross_site = [
        ("sec-fetch-site", "cross-site"),
        ("content-type", "application/x-www-form-urlencoded"),
    ];
    let form = format!("token={OPERATOR_TOKEN}");
    let answer = anonymous
        .send(Method::POST, "/console/sign-in", &cross_site, &form)
        .await;
    assert_eq!(answer.status, 403);
    let foreign_origin = [("origin", "http://evil.example")];
    let answer = anonymous
        .send(Method::POST, "/console/sign-in", &foreign_origin, &form)
        .await;
    assert_eq!(answer.status, 403);

    // A forged cookie is no session.
    let forged = Console {
        port: admin_port,
        cookie: Some("00".repeat(32)),
    };
    assert_eq!(forged.get("/console/").await.status, 303);

    // Wrong tokens: refused, then this peer waits longer after each (for the right token
    // too: the wait is the peer's); another peer is not held (tests/hostile.rs).
    for _ in 0..6 {
        assert_eq!(
            anonymous
                .post("/console/sign-in", "token=guess")
                .await
                .status,
            401
        );
    }
    let throttled = anonymous.post("/console/sign-in", "token=guess").await;
    assert_eq!(throttled.status, 429);
    assert_eq!(throttled.headers["retry-after"], "1");
    assert_eq!(anonymous.post("/console/sign-in", &form).await.status, 429);
    server.stop().await.0.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reader_sees_every_page_escaped_and_can_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = console_config(dir.path(), admin_port, true);
    let server = TestServer::start_in(dir, &config).await;
    let job_href = dead_canary_job(&server).await;
    server
        .deliver_signed("{}", unix_now(), &["forged-secret"])
        .await;

    let reader = Console::sign_in(admin_port, READ_TOKEN).await;
    for path in pages(&job_href) {
        let answer = reader.get(&path).await;
        assert_eq!(answer.status, 200, "{path}");
        assert!(
            answer.headers.contains_key("content-security-policy"),
            "{path}"
        );
        let page = html(&answer);
        assert!(
            !page.contains("<img src=x"),
            "{path}: unescaped canary\n{page}"
        );
        assert!(
            !page.contains("<script>window"),
            "{path}: unescaped canary\n{page}"
        );
        assert!(
            !page.contains("method=\"post\" action=\"/console/jobs"),
            "{path}: an action for a reader"
        );
        assert!(
            !page.contains("/console/dispatch/"),
            "{path}: an action for a reader"
        );
        assert!(
            page.contains("reader") && page.contains("(read-only)"),
            "{path}"
        );
    }
    let detail = html(&reader.get(&job_href).await);
    assert!(
        detail.contains("&lt;img src=x onerror="),
        "the canary, escaped, is shown\n{detail}"
    );
    assert!(detail.contains("exit status 4"), "{detail}");
    let receipts = html(&reader.get("/console/receipts").await);
    assert!(
        receipts.contains("no signature entry matches"),
        "{receipts}"
    );
    // The counts are the process's (tests share it): at least this test's delivery.
    assert!(receipts.contains(" by the newest secret, "), "{receipts}");
    assert!(
        !receipts.contains("<p>0 by the newest secret"),
        "{receipts}"
    );
    // The overview's counts are the ledger's; its latencies timed this test's delivery and
    // the attempts (the rollup is the process's, shared by the tests: at least these).
    let overview = json(&reader.get("/console/api/").await);
    assert!(
        overview["jobs"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(["dead", 1])),
        "{overview}"
    );
    for timing in [0, 1] {
        let (label, minutes) = (
            &overview["last_hour"]["timings"][timing][0],
            overview["last_hour"]["timings"][timing][1]
                .as_array()
                .unwrap(),
        );
        let timed: u64 = minutes.iter().map(|m| m["count"].as_u64().unwrap()).sum();
        assert!(timed >= 1, "{label}: {overview}");
        assert!(
            minutes.iter().any(|m| m["max_ms"].as_f64().unwrap() > 0.0),
            "{label}"
        );
    }
    let page = html(&reader.get("/console/").await);
    assert!(page.contains("Acknowledgement latency") && page.contains("Run latency"));
    let dead = html(&reader.get("/console/dead").await);
    assert!(
        dead.contains("exited with status 4"),
        "the group's signature\n{dead}"
    );
    assert!(!dead.contains("Retry this group"), "{dead}");

    // The JSON twins hold the same data.
    let twin = reader.get("/console/api/jobs?state=dead").await;
    assert_eq!(twin.headers["content-type"], "application/json");
    let jobs = json(&twin);
    assert_eq!(jobs["jobs"][0]["job_id"], format!("job{CANARY}"));
    // Filters are GET parameters: the event type (exact), and the time as durations ago.
    let found = |query: &'static str| {
        let reader = &reader;
        async move {
            let page = json(&reader.get(&format!("/console/api/jobs?{query}")).await);
            page["jobs"].as_array().unwrap().len()
        }
    };
    assert_eq!(found("since=1h").await, 1);
    assert_eq!(found("before=1h").await, 0);
    assert_eq!(
        found("event_type=job.completed%3Cscript%3Ewindow.__xss%3D1%3C%2Fscript%3E").await,
        1
    );
    assert_eq!(found("event_type=job.failed").await, 0);
    let bad = reader.get("/console/jobs?since=soon").await;
    assert_eq!(bad.status, 400);
    assert!(
        html(&bad).contains("since: \"soon\" is not a duration"),
        "{}",
        html(&bad)
    );
    let page = html(
        &reader
            .get("/console/jobs?state=dead&since=1h&event_type=x")
            .await,
    );
    assert!(
        page.contains("value=\"1h\"") && page.contains("value=\"x\""),
        "the form keeps them"
    );
    let body = reader.get(&format!("{job_href}/body")).await;
    assert_eq!(body.headers["content-type"], "application/octet-stream");
    assert!(body.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));

    // A reader's POST is refused and changes nothing.
    let answer = reader.post(&format!("{job_href}/retry"), "").await;
    assert_eq!(answer.status, 403);
    assert_eq!(reader.post("/console/dispatch/pause", "").await.status, 403);
    assert_eq!(
        server.state_of(&format!("job{CANARY}")).as_deref(),
        Some("dead")
    );
    server.stop().await.0.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_acts_only_from_the_console_itself() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = console_config(dir.path(), admin_port, true);
    let server = TestServer::start_in(dir, &config).await;
    let job_href = dead_canary_job(&server).await;
    let job_id = format!("job{CANARY}");
    let operator = Console::sign_in(admin_port, OPERATOR_TOKEN).await;
    let detail = html(&operator.get(&job_href).await);
    assert!(
        detail.contains(&format!("action=\"{job_href}/retry\"")),
        "{detail}"
    );

    // Cross-site, and with no browser header at all: refused, nothing changed.
    let cross = [("sec-fetch-site", "cross-site")];
    assert_eq!(
        operator
            .send(Method::POST, &format!("{job_href}/retry"), &cross, "")
            .await
            .status,
        403
    );
    assert_eq!(
        operator
            .send(Method::POST, &format!("{job_href}/retry"), &[], "")
            .await
            .status,
        403
    );
    assert_eq!(server.state_of(&job_id).as_deref(), Some("dead"));

    // Refused as the admin API refuses (one implementation of the actions behind both).
    for (path, form, status, said) in [
        (
            "/run-now",
            "",
            409,
            "the job is dead; run-now applies to a retrying job",
        ),
        (
            "/cancel",
            "reason=late",
            409,
            "the job is dead; cancel applies to a claimed or retrying job",
        ),
        ("/cancel", "reason=+", 400, "a cancel needs a reason"),
    ] {
        let answer = operator.post(&format!("{job_href}{path}"), form).await;
        assert_eq!(
            (answer.status.as_u16(), html(&answer).as_str()),
            (status, said)
        );
    }
    let unknown = operator.post("/console/jobs/nobody/run-now", "").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(html(&unknown), "no such job in the ledger");

    // The dead-letter group, by what failed (the handler's stderr is part of it): counted,
    // then retried by alice, who signed in with her own token.
    let alice = Console::sign_in(admin_port, ALICE_TOKEN).await;
    let groups: serde_json::Value =
        serde_json::from_slice(&alice.get("/console/api/dead").await.body).unwrap();
    let signature = groups[0]["signature"].as_str().unwrap().to_owned();
    assert_eq!(signature, format!("exited with status 4: {CANARY}"));
    let dead = html(&alice.get("/console/dead").await);
    assert!(dead.contains("Retry this group"), "{dead}");
    let encoded = percent(&signature);
    let confirm = html(
        &alice
            .get(&format!("/console/dead/retry?signature={encoded}"))
            .await,
    );
    // One job is "1 dead job", not "1 dead jobs".
    assert!(
        confirm.contains("holds <strong>1 dead job</strong>;"),
        "{confirm}"
    );
    assert!(confirm.contains(">Retry 1 job</button>"), "{confirm}");
    let retried = alice
        .post("/console/dead/retry", &format!("signature={encoded}"))
        .await;
    assert_eq!(retried.status, 200, "{}", html(&retried));
    // The message names the group (escaped, as everything a handler wrote).
    assert!(
        html(&retried).contains("1 job of the group &quot;exited with status 4: &lt;img"),
        "{}",
        html(&retried)
    );
    let ran = eventually(Duration::from_secs(10), || {
        server.value(
            "SELECT count(*) FROM job_attempts WHERE job_id = ?1",
            &[&job_id],
        ) == 2
    })
    .await;
    assert!(ran, "the group's job did not run again");
    let actor = server.value(
        "SELECT actor FROM job_actions WHERE job_id = ?1",
        &[&job_id],
    );
    assert_eq!(actor, "console:alice");

    // Pause and resume, with the shared operator token: it knows only the address.
    assert_eq!(
        operator.post("/console/dispatch/pause", "").await.status,
        200
    );
    let overview = html(&operator.get("/console/").await);
    assert!(overview.contains("Dispatch is paused"), "{overview}");
    assert!(
        overview.contains("Dispatch is paused by console:127.0.0.1"),
        "{overview}"
    );
    assert!(overview.contains("Resume dispatch"), "{overview}");
    assert_eq!(
        operator.post("/console/dispatch/resume", "").await.status,
        200
    );
    assert!(!html(&operator.get("/console/").await).contains("Dispatch is paused"));

    // Signed out, the cookie is worth nothing.
    assert_eq!(operator.post("/console/sign-out", "").await.status, 303);
    assert_eq!(operator.get("/console/").await.status, 303);
    server.stop().await.0.unwrap();
}

/// An HTTP handler's answer is shown escaped too; the search box opens a job by its id.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_handlers_answer_is_escaped_and_a_job_found_by_id() {
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    let handler = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let handler_port = handler.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (stream, _) = handler.accept().await.unwrap();
            tokio::spawn(async move {
                let service = service_fn(|_| async {
                    let mut answer = hyper::Response::new(Full::new(Bytes::from_static(
                        b"<script>window.__xss=3</script>",
                    )));
                    *answer.status_mut() = hyper::StatusCode::BAD_GATEWAY;
                    Ok::<_, std::convert::Infallible>(answer)
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    std::fs::write(dir.path().join("admin_token"), OPERATOR_TOKEN).unwrap();
    let config = format!(
        "[handler]\nurl = \"http://127.0.0.1:{handler_port}/hook\"\nmax_attempts = 1\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n"
    );
    let server = TestServer::start_in(dir, &config).await;
    assert_eq!(server.deliver(&job_body("answered")).await.status, 200);
    let dead = eventually(Duration::from_secs(10), || {
        server.state_of("answered").as_deref() == Some("dead")
    })
    .await;
    assert!(dead);
    let operator = Console::sign_in(admin_port, OPERATOR_TOKEN).await;
    let found = operator.get("/console/jobs?job_id=answered").await;
    assert_eq!(found.status, 303);
    assert_eq!(found.headers["location"], "/console/jobs/answered");
    let page = html(&operator.get("/console/jobs/answered").await);
    assert!(page.contains("HTTP 502"), "{page}");
    assert!(page.contains("&lt;script&gt;window.__xss=3"), "{page}");
    assert!(!page.contains("<script>window.__xss=3"), "{page}");
    server.stop().await.0.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_actions_off_an_operator_only_looks() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = console_config(dir.path(), admin_port, false);
    let server = TestServer::start_in(dir, &config).await;
    let job_href = dead_canary_job(&server).await;
    let operator = Console::sign_in(admin_port, OPERATOR_TOKEN).await;
    let detail = html(&operator.get(&job_href).await);
    assert!(!detail.contains("/retry\""), "{detail}");
    assert_eq!(
        operator.post(&format!("{job_href}/retry"), "").await.status,
        403
    );
    assert_eq!(
        operator.post("/console/dispatch/pause", "").await.status,
        403
    );
    server.stop().await.0.unwrap();
}

/// A pause stays in the timelines of the jobs it delayed after the resume, with who and why,
/// on the console's page, in its JSON and in `jobs show`; a job received after the resume
/// shows none.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_stays_in_the_timelines_of_the_jobs_it_delayed() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = console_config(dir.path(), admin_port, true);
    let server = TestServer::start_in(dir, &config).await;
    let alice = Console::sign_in(admin_port, ALICE_TOKEN).await;
    let pause = alice
        .post("/console/dispatch/pause", "reason=deploy+of+billing")
        .await;
    assert_eq!(pause.status, 200);
    assert_eq!(server.deliver(&job_body("delayed")).await.status, 200);
    assert_eq!(alice.post("/console/dispatch/resume", "").await.status, 200);
    assert_eq!(server.deliver(&job_body("later")).await.status, 200);
    let ran = eventually(Duration::from_secs(10), || {
        ["delayed", "later"].map(|id| server.state_of(id))
            == [Some("dead".into()), Some("dead".into())]
    })
    .await;
    assert!(ran);

    let said = "dispatch paused by console:alice";
    let page = html(&alice.get("/console/jobs/delayed").await);
    assert!(page.contains(said), "{page}");
    assert!(
        page.contains("(deploy of billing), resumed by console:alice"),
        "{page}"
    );
    let later = html(&alice.get("/console/jobs/later").await);
    assert!(!later.contains("dispatch paused"), "{later}");
    let json: serde_json::Value =
        serde_json::from_slice(&alice.get("/console/api/jobs/delayed").await.body).unwrap();
    assert_eq!(json["delayed_by"][0]["kind"], "pause", "{json}");
    assert_eq!(
        json["delayed_by"][0]["reason"], "deploy of billing",
        "{json}"
    );

    // The verdict's due-job limit is a setting the Config page shows (10 minutes unless set).
    let settings = html(&alice.get("/console/config").await);
    assert!(settings.contains("admin.due_job_limit"), "{settings}");
    assert!(settings.contains("10m"), "{settings}");
    // Durations as the file writes them (365d was "11months 30days 3h 50m 24s"), and the
    // hold's settings with the handler's.
    assert!(settings.contains("365d"), "{settings}");
    assert!(!settings.contains("months"), "{settings}");
    for key in [
        "handler.hold_after",
        "handler.probe_interval",
        "handler.ramp",
    ] {
        assert!(settings.contains(key), "{key}: {settings}");
    }
    // A named token's session is shown by its name, with its role.
    assert!(
        settings.contains("<span class=\"who\">alice (operator)"),
        "{settings}"
    );

    let cli_config = common::service::write_config(server.dir.path(), free_port(), "", "");
    // `jobs show` with the words of `args`.
    let show = |args: &str| {
        let args: Vec<&str> = ["jobs", "show"]
            .into_iter()
            .chain(args.split(' '))
            .collect();
        let output = common::service::cli(&cli_config, &args);
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let delayed = show("delayed");
    assert!(delayed.contains(said), "{delayed}");
    assert!(delayed.contains("(deploy of billing)"), "{delayed}");
    assert!(!show("later").contains("dispatch paused"));
    let json: serde_json::Value = serde_json::from_str(&show("delayed --json")).unwrap();
    let pause = &json["delayed_by"][0];
    assert_eq!(pause["reason"], "deploy of billing", "{json}");
    assert!(pause["ended_at_utc"].as_str().is_some(), "{json}");
    server.stop().await.0.unwrap();
}

/// The overview answers "is anything wrong?" from facts: ok on a calm receiver, attention
/// while dispatch is paused (naming who paused it), failing once a job went dead; the JSON
/// twin carries the same verdict.
#[tokio::test(flavor = "multi_thread")]
async fn the_verdict_follows_the_facts() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = console_config(dir.path(), admin_port, true);
    let server = TestServer::start_in(dir, &config).await;
    let alice = Console::sign_in(admin_port, ALICE_TOKEN).await;
    let verdict = || async {
        let answer = alice.get("/console/api/").await;
        let overview: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        overview["verdict"].clone()
    };
    let calm = verdict().await;
    assert_eq!(calm["level"], "ok", "{calm}");
    assert_eq!(calm["reasons"], serde_json::json!([]));
    let page = html(&alice.get("/console/").await);
    assert!(page.contains("data-level=\"ok\""), "{page}");

    assert_eq!(alice.post("/console/dispatch/pause", "").await.status, 200);
    let paused = verdict().await;
    assert_eq!(paused["level"], "attention", "{paused}");
    assert_eq!(
        paused["reasons"][0],
        "Dispatch is paused by console:alice: no job runs"
    );
    assert_eq!(alice.post("/console/dispatch/resume", "").await.status, 200);

    dead_canary_job(&server).await;
    // The ledger's facts are kept a few seconds: the dead job shows within them.
    let mut failing = serde_json::Value::Null;
    for _ in 0..40 {
        failing = verdict().await;
        if failing["level"] == "failing" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(failing["level"], "failing", "{failing}");
    assert_eq!(failing["reasons"][0], "1 job went dead in the last hour");
    assert_eq!(failing["evidence"][0]["href"], "/console/dead");
    let page = html(&alice.get("/console/").await);
    assert!(
        page.contains("<a href=\"/console/dead\">1 job went dead in the last hour</a>"),
        "{page}"
    );

    // A cancel is an operator's decision, not a failure; every cancel is one group.
    let body = r#"{"job_id":"unwanted","type":"job.completed","result":{}}"#;
    assert_eq!(alice.post("/console/dispatch/pause", "").await.status, 200);
    assert_eq!(server.deliver(body).await.status, 200);
    let cancelled = alice
        .post("/console/jobs/unwanted/cancel", "reason=a+test+order")
        .await;
    assert_eq!(cancelled.status, 200, "{}", html(&cancelled));
    assert!(html(&cancelled).contains("Cancelled: the job is dead"));
    let job = html(&alice.get("/console/jobs/unwanted").await);
    assert!(
        job.contains("<strong>cancel</strong> by console:alice: a test order"),
        "the cancel entry repeats itself: {job}"
    );
    // An unknown job: a page of the console, with its navigation.
    let unknown = alice.get("/console/jobs/never-sent").await;
    assert_eq!(unknown.status, 404);
    assert!(html(&unknown).contains("<nav>"), "{}", html(&unknown));
    let groups: serde_json::Value =
        serde_json::from_slice(&alice.get("/console/api/dead").await.body).unwrap();
    let signatures: Vec<&str> = groups
        .as_array()
        .unwrap()
        .iter()
        .map(|group| group["signature"].as_str().unwrap())
        .collect();
    assert!(signatures.contains(&"cancelled by an operator"), "{groups}");
    server.stop().await.0.unwrap();
}

/// An outage hold is one of the verdict's facts: a command exiting 75 (EX_TEMPFAIL) holds the
/// work at once, and the overview says so (attention, with the hold's reason and next probe),
/// with no dead job.
#[tokio::test(flavor = "multi_thread")]
async fn the_verdict_says_when_an_outage_holds_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let config = console_config(dir.path(), admin_port, false)
        .replace("exit 4", "exit 75")
        .replace(
            "max_attempts = 1\n",
            "max_attempts = 5\nprobe_interval = \"1m\"\n",
        );
    let server = TestServer::start_in(dir, &config).await;
    let reader = Console::sign_in(admin_port, READ_TOKEN).await;
    assert_eq!(server.deliver(&job_body("held-1")).await.status, 200);
    let mut held = serde_json::Value::Null;
    for _ in 0..40 {
        let answer = reader.get("/console/api/").await;
        let overview: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        held = overview["verdict"].clone();
        if held["level"] != "ok" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(held["level"], "attention", "{held}");
    let reason = held["reasons"][0].as_str().unwrap();
    assert!(
        reason.starts_with("Dispatch is held: since ") && reason.contains("the next probe at"),
        "{reason}"
    );
    // The worker writes the hold before the attempt's end (other receivers stop first), so
    // the verdict can show the hold a moment before the job reads `retrying`.
    assert!(
        eventually(Duration::from_secs(5), || server
            .state_of("held-1")
            .as_deref()
            == Some("retrying"))
        .await,
        "{:?}",
        server.state_of("held-1")
    );
    // Once it ends the verdict is ok again; the overview keeps the hold's end for an hour.
    let cli_config = common::service::write_config(server.dir.path(), free_port(), "", "");
    let resumed = common::service::cli(&cli_config, &["jobs", "resume"]);
    assert!(resumed.status.success(), "{resumed:?}");
    let overview = html(&reader.get("/console/").await);
    assert!(overview.contains("The last hold ended "), "{overview}");
    assert!(overview.contains("(ended by cli:"), "{overview}");
    let answer = reader.get("/console/api/").await;
    let json: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(json["last_hold_ended"]["kind"], "hold", "{json}");
    server.stop().await.0.unwrap();
}

/// The overview shows each route: a held one with its hold, a running one, and one no longer in
/// the config with the work it keeps.
#[tokio::test(flavor = "multi_thread")]
async fn the_overview_shows_each_routes_dispatch_and_work() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let held = "[[route]]\nname = \"held\"\nevent_types = [\"job.failed\"]\n\
                [route.handler]\ncommand = [\"sh\", \"-c\", \"exit 75\"]\nprobe_interval = \"1m\"\n";
    let quick =
        "[[route]]\nname = \"quick\"\nevent_types = [\"*\"]\n[route.handler]\ncommand = [\"true\"]\n";
    let config = console_config(dir.path(), admin_port, false);
    let admin = &config[config.find("[admin]").unwrap()..];
    let server = TestServer::start_in(dir, &format!("{held}{quick}{admin}")).await;
    let reader = Console::sign_in(admin_port, READ_TOKEN).await;
    let failed = r#"{"job_id":"routed-1","type":"job.failed"}"#;
    assert_eq!(server.deliver(failed).await.status, 200);
    assert_eq!(server.deliver(&job_body("routed-2")).await.status, 200);
    // Work written for a route since taken out of the config.
    server.execute(
        "INSERT INTO job_routes (job, route, state, next_attempt_at, updated_at) \
         SELECT id, 'archive', 'claimed', received_at, received_at FROM jobs WHERE job_id = 'routed-2'",
        &[],
    );
    let mut routes = serde_json::Value::Null;
    for _ in 0..40 {
        let overview = json(&reader.get("/console/api/").await);
        routes = overview["routes"].clone();
        if routes[0]["dispatch"] == "held" && routes.as_array().unwrap().len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let row = |at: usize| {
        (
            routes[at]["route"].as_str().unwrap_or_default().to_owned(),
            routes[at]["dispatch"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            routes[at]["waiting"].as_u64().unwrap_or_default(),
        )
    };
    assert_eq!(row(0), ("held".into(), "held".into(), 1), "{routes}");
    assert!(routes[0]["held_since"].is_i64(), "{routes}");
    assert_eq!(row(1), ("quick".into(), "running".into(), 0), "{routes}");
    assert_eq!(
        row(2),
        ("archive".into(), "not in the config".into(), 1),
        "{routes}"
    );
    let page = html(&reader.get("/console/").await);
    assert!(
        page.contains("<h2>Routes</h2>") && page.contains("not in the config"),
        "{page}"
    );
    server.stop().await.0.unwrap();
}
