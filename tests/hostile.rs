//! The admin listener on a hostile network, against the real binary: strangers without a token
//! (slow forms, guessed tokens from another address) and token holders (a reader signing in
//! over and over) must not keep an operator out of the console or the API.
//!
//! Attackers connect from 127.0.0.2, the operator from 127.0.0.1 (the whole of 127/8 is
//! loopback on Linux): the receiver sees two peers, as it would on a network.

mod common;

use std::time::{Duration, Instant};

use common::peers::*;
use common::service::{write_config, Service};
use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A signed-in operator's page load while an attack runs stays under this.
const PAGE_BOUND: Duration = Duration::from_millis(1000);

/// Forms sent one byte every 0.5 s, one after another: each holds its connection as long as
/// the receiver lets it, and the next starts at once.
async fn slow_form(admin_port: u16, path: &'static str) {
    loop {
        let mut stream = connect(ATTACKER, admin_port).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{admin_port}\r\n\
             origin: http://127.0.0.1:{admin_port}\r\nsec-fetch-site: same-origin\r\n\
             content-type: application/x-www-form-urlencoded\r\ncontent-length: 200\r\n\r\n"
        );
        if stream.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        for _ in 0..200 {
            if stream.write_all(b"t").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// 12 strangers sending sign-in forms (and 6 sending action forms without a session) one byte
/// every 0.5 s: a signed-in operator's pages still load, each within [`PAGE_BOUND`].
#[tokio::test(flavor = "multi_thread")]
async fn slow_forms_from_strangers_do_not_deny_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let (status, cookie) = sign_in(OPERATOR, admin_port, OPERATOR_TOKEN).await;
    assert_eq!(status, 303);
    let cookie = cookie.unwrap();
    let mut attack = tokio::task::JoinSet::new();
    for _ in 0..12 {
        attack.spawn(slow_form(admin_port, "/console/sign-in"));
    }
    for _ in 0..6 {
        attack.spawn(slow_form(admin_port, "/console/dispatch/pause"));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut refused, mut slowest) = (0, Duration::ZERO);
    for _ in 0..7 {
        let started = Instant::now();
        if page(admin_port, &cookie, "/console/").await != 200 {
            refused += 1;
        }
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A sign-in goes through too while the strangers hold their connections.
    let (signed_in, _) = sign_in(OPERATOR, admin_port, READ_TOKEN).await;
    eprintln!(
        "slow forms: {refused} of 7 page loads refused, slowest {slowest:?}, sign-in {signed_in}"
    );
    attack.abort_all();
    assert_eq!(refused, 0, "page loads refused during the slow-form attack");
    assert!(slowest < PAGE_BOUND, "slowest page load {slowest:?}");
    assert_eq!(signed_in, 303);
    service.stop_cleanly().await;
}

/// A stranger sending ~20 wrong tokens a second is slowed down and refused; the operator's
/// right token, from another address, gets in every time, and the log sums the refusals up
/// (peer, count).
#[tokio::test(flavor = "multi_thread")]
async fn a_guesser_cannot_lock_the_right_token_out() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let guesser = tokio::spawn(async move {
        let mut statuses = Vec::new();
        let until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < until {
            statuses.push(sign_in(ATTACKER, admin_port, "guess").await.0);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        statuses
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut refused = 0;
    for _ in 0..10 {
        if sign_in(OPERATOR, admin_port, OPERATOR_TOKEN).await.0 != 303 {
            refused += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let statuses = guesser.await.unwrap();
    let throttled = statuses.iter().filter(|status| **status == 429).count();
    eprintln!(
        "lockout: the right token refused {refused} of 10; the guesser's {} tries: {throttled} throttled",
        statuses.len()
    );
    assert_eq!(refused, 0, "the right token was refused during the attack");
    assert!(
        throttled * 2 > statuses.len(),
        "the guesser is throttled: {statuses:?}"
    );
    service.stop_cleanly().await;
    // Every try is in a summary line (the last written at shutdown), not one line per try.
    let (lines, counted) = summaries(dir.path(), "console sign-in");
    assert_eq!(counted, statuses.len(), "{lines:?}");
    assert!(lines.len() <= 3, "a summary, not a line per try: {lines:?}");
    assert!(
        lines.iter().all(|line| line.contains("127.0.0.2")),
        "{lines:?}"
    );
}

/// A token holder guessing at others' tokens, its own right token after every five wrong ones:
/// the right token forgets none of its failures, so the guesses are throttled as if it never
/// came (at the API and at the console's sign-in alike).
#[tokio::test(flavor = "multi_thread")]
async fn a_token_holder_cannot_reset_its_own_throttle() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let (api_throttled, api_took) = guess_between_right_tokens(200, |token| async move {
        api(ATTACKER, admin_port, "GET /v1/dispatch", &token)
            .await
            .0
    })
    .await;
    let (console_throttled, console_took) = guess_between_right_tokens(100, |token| async move {
        sign_in(ATTACKER, admin_port, &token).await.0
    })
    .await;
    eprintln!(
        "resetting: {api_throttled} of 1000 API guesses throttled in {api_took:?}, \
         {console_throttled} of 500 sign-in guesses in {console_took:?}"
    );
    // Five free failures, then a wait that outlasts the loop but for a few retries.
    assert!(api_throttled >= 1000 - 20, "{api_throttled} of 1000");
    assert!(console_throttled >= 500 - 20, "{console_throttled} of 500");
    // Another address is not held by the token holder's failures.
    let (status, _) = api(OPERATOR, admin_port, "GET /v1/dispatch", OPERATOR_TOKEN).await;
    assert_eq!(status, 200);
    service.stop_cleanly().await;
}

/// `rounds` of five wrong tokens and then the right one, each tried by `try_token` (its
/// status): how many of the wrong ones were throttled (`429`), and how long it all took.
async fn guess_between_right_tokens<F, Answer>(rounds: usize, try_token: F) -> (usize, Duration)
where
    F: Fn(String) -> Answer,
    Answer: std::future::Future<Output = u16>,
{
    let started = Instant::now();
    let mut throttled = 0;
    for round in 0..rounds {
        for guess in 0..5 {
            if try_token(format!("guess-{round}-{guess}")).await == 429 {
                throttled += 1;
            }
        }
        try_token(READ_TOKEN.to_owned()).await;
    }
    (throttled, started.elapsed())
}

/// A burst of wrong API tokens is in the log within a minute of its first, with no further
/// try to write it (the line was written by the next try, or at shutdown).
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_refusals_is_summed_up_within_a_minute() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let started = Instant::now();
    for i in 0..999 {
        api(
            ATTACKER,
            admin_port,
            "GET /v1/dispatch",
            &format!("guess-{i}"),
        )
        .await;
    }
    let sent = started.elapsed();
    let mut counted = 0;
    while counted < 999 {
        assert!(
            started.elapsed() < Duration::from_secs(75),
            "{counted} of 999 summed up after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        counted = summaries(dir.path(), "admin API").1;
    }
    eprintln!(
        "summary: 999 refusals sent in {sent:?}, all in the log {:?} after the first",
        started.elapsed()
    );
    service.stop_cleanly().await;
}

/// A reader signing in 300 times pushes out its own oldest sessions, never an operator's.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_holder_cannot_sign_out_another() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let (_, operator) = sign_in(OPERATOR, admin_port, OPERATOR_TOKEN).await;
    let operator = operator.unwrap();
    let (_, first_reader) = sign_in(ATTACKER, admin_port, READ_TOKEN).await;
    for _ in 0..300 {
        assert_eq!(sign_in(ATTACKER, admin_port, READ_TOKEN).await.0, 303);
    }
    assert_eq!(page(admin_port, &operator, "/console/").await, 200);
    assert_eq!(
        page(admin_port, &first_reader.unwrap(), "/console/").await,
        303,
        "the reader's own oldest session was pushed out"
    );
    service.stop_cleanly().await;
}

/// "Sign out everywhere" ends every session of the token it is pressed in, and no other's.
#[tokio::test(flavor = "multi_thread")]
async fn sign_out_everywhere_ends_only_the_tokens_own_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let (_, laptop) = sign_in(OPERATOR, admin_port, ALICE_TOKEN).await;
    let (_, phone) = sign_in(ATTACKER, admin_port, ALICE_TOKEN).await;
    let (_, other) = sign_in(OPERATOR, admin_port, OPERATOR_TOKEN).await;
    let (laptop, phone, other) = (laptop.unwrap(), phone.unwrap(), other.unwrap());
    let cookie = format!("sume_console={laptop}");
    let (status, answer) = exchange(
        OPERATOR,
        admin_port,
        "POST /console/sign-out-everywhere",
        &[("cookie", &cookie)],
        "",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("2 sessions"), "{answer}");
    assert_eq!(page(admin_port, &laptop, "/console/").await, 303);
    assert_eq!(page(admin_port, &phone, "/console/").await, 303);
    assert_eq!(page(admin_port, &other, "/console/").await, 200);
    service.stop_cleanly().await;
}

/// Reached through a TLS proxy named `https://...` in `allowed_hosts`, the cookie is
/// `__Secure-` and `Secure`, under `/console` (other sites may share the proxy's host), and it
/// is the one read back; reached in clear on loopback, it has neither (a browser would not
/// send it back).
#[tokio::test(flavor = "multi_thread")]
async fn the_cookie_is_secure_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start_with(
        dir.path(),
        admin_port,
        "allowed_hosts = [\"https://console.example\"]",
    )
    .await;
    let form = format!("token={OPERATOR_TOKEN}");
    let proxied = [("host", "console.example"), ("x-forwarded-proto", "https")];
    let (status, answer) = exchange(
        OPERATOR,
        admin_port,
        "POST /console/sign-in",
        &proxied,
        &form,
    )
    .await;
    assert_eq!(status, 303, "{answer}");
    let cookie = answer
        .lines()
        .find(|line| line.starts_with("set-cookie:"))
        .unwrap();
    assert!(cookie.ends_with("; Secure"), "{cookie}");
    assert!(
        cookie.starts_with("set-cookie: __Secure-sume_console=")
            && cookie.contains("Path=/console;"),
        "{cookie}"
    );
    let session = cookie
        .trim_start_matches("set-cookie: ")
        .split(';')
        .next()
        .unwrap();
    let signed_in = [("cookie", session), proxied[0], proxied[1]];
    let (status, _) = exchange(OPERATOR, admin_port, "GET /console/", &signed_in, "").await;
    assert_eq!(status, 200, "the __Secure- cookie is read back");
    let (status, answer) =
        exchange(OPERATOR, admin_port, "POST /console/sign-in", &[], &form).await;
    assert_eq!(status, 303);
    assert!(!answer.contains("Secure"), "{answer}");
    assert!(answer.contains("set-cookie: sume_console="), "{answer}");
    service.stop_cleanly().await;
}

/// The admin API takes every token with its role (a named operator's action is recorded as
/// `api:<name>`; a reader only reads); a guesser is throttled, its tries summed up in the log,
/// while the right token from another address still works.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_knows_each_token_and_throttles_a_guesser() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let (status, _) = api(
        OPERATOR,
        admin_port,
        "POST /v1/dispatch/pause?reason=x",
        ALICE_TOKEN,
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = api(OPERATOR, admin_port, "GET /v1/dispatch", BOB_TOKEN).await;
    assert_eq!(status, 200);
    let dispatch: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(dispatch["changed_by"], "api:alice", "{dispatch}");
    assert_eq!(
        api(OPERATOR, admin_port, "GET /v1/dispatch", READ_TOKEN)
            .await
            .0,
        200
    );
    for reader in [BOB_TOKEN, READ_TOKEN] {
        let (status, _) = api(OPERATOR, admin_port, "POST /v1/dispatch/resume", reader).await;
        assert_eq!(status, 403, "a reader's token does not act");
    }
    let guesser = tokio::spawn(async move {
        let mut statuses = Vec::new();
        for i in 0..200 {
            let guess = format!("guess-{i}");
            statuses.push(
                api(ATTACKER, admin_port, "GET /v1/dispatch", &guess)
                    .await
                    .0,
            );
        }
        statuses
    });
    let mut refused = 0;
    for _ in 0..10 {
        if api(OPERATOR, admin_port, "GET /v1/dispatch", OPERATOR_TOKEN)
            .await
            .0
            != 200
        {
            refused += 1;
        }
    }
    let statuses = guesser.await.unwrap();
    let throttled = statuses.iter().filter(|status| **status == 429).count();
    eprintln!(
        "api guessing: {throttled} of 200 throttled; the right token refused {refused} of 10"
    );
    assert_eq!(refused, 0);
    assert!(throttled > 150, "{statuses:?}");
    service.stop_cleanly().await;
    let (lines, counted) = summaries(dir.path(), "admin API");
    assert_eq!(counted, 200, "{lines:?}");
}

/// A canary planted in every credential-bearing key is on no page (as a reader sees it), no
/// JSON twin, no `/metrics`, no log line.
#[tokio::test(flavor = "multi_thread")]
async fn no_credential_reaches_a_page_metrics_or_the_log() {
    const CANARY: &str = "Canary7731Secret";
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let port = free_port();
    let token = format!("{CANARY}-operator-token-0123456789abcdef");
    let reader = format!("{CANARY}-reader-token-0123456789abcdef");
    let named = format!("{CANARY}-carol-token-0123456789abcdef");
    for (file, value) in [
        ("admin_token", &token),
        ("read_token", &reader),
        ("carol_token", &named),
    ] {
        std::fs::write(dir.path().join(file), value).unwrap();
    }
    std::fs::write(dir.path().join("api_key"), format!("{CANARY}-api-key")).unwrap();
    let sume = free_port();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n\
         [signature]\nsecrets = [\"whsec_{CANARY}\"]\n\n\
         [database]\npath = \"ledger.sqlite3\"\n\n\
         [handler]\ncommand = [\"sh\", \"-c\", \"exit 0\", \"PASSWORD={CANARY}\"]\n\n\
         [sume_api]\nbase_url = \"http://user:{CANARY}@127.0.0.1:{sume}/api?key={CANARY}\"\n\
         api_key_file = \"api_key\"\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\
         read_token_file = \"read_token\"\n\n\
         [[admin.tokens]]\nname = \"carol\"\nfile = \"carol_token\"\n"
    );
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let service = Service::start(&config_path, port).await;
    while TcpStream::connect(("127.0.0.1", admin_port)).await.is_err() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, cookie) = sign_in(OPERATOR, admin_port, &reader).await;
    assert_eq!(status, 303);
    let cookie = format!("sume_console={}", cookie.unwrap());
    let mut shown = Vec::new();
    for page in ["", "jobs", "dead", "receipts", "expected", "config"] {
        for prefix in ["/console/", "/console/api/"] {
            let path = format!("{prefix}{page}");
            let (status, answer) = exchange(
                OPERATOR,
                admin_port,
                &format!("GET {path}"),
                &[("cookie", &cookie)],
                "",
            )
            .await;
            assert_eq!(status, 200, "{path}");
            shown.push((path, answer));
        }
    }
    for on in [admin_port, port] {
        let (status, answer) = exchange(OPERATOR, on, "GET /metrics", &[], "").await;
        assert_eq!(status, 200);
        shown.push((format!("{on}/metrics"), answer));
    }
    assert!(
        shown
            .iter()
            .any(|(_, a)| a.contains("shown to operators only")),
        "the Config page says the arguments are hidden"
    );
    service.stop_cleanly().await;
    shown.push(("the log".into(), log(dir.path())));
    for (where_, text) in shown {
        assert!(!text.contains(CANARY), "the canary is in {where_}:\n{text}");
    }
}

/// `check-config` warns of a 1-character token in a mode-0666 file and of one token under two
/// names; `--strict` refuses them.
#[test]
fn check_config_strict_refuses_weak_admin_tokens() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin_token");
    std::fs::write(&token, "x").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::write(dir.path().join("twin"), "x").unwrap();
    let config = write_config(
        dir.path(),
        free_port(),
        "",
        "[admin]\ntoken_file = \"admin_token\"\n\n\
         [[admin.tokens]]\nname = \"twin\"\nfile = \"twin\"\n",
    );
    let lenient = common::service::cli(&config, &["check-config"]);
    let out = String::from_utf8_lossy(&lenient.stdout).into_owned();
    assert!(lenient.status.success(), "{out}");
    for said in ["mode 0666", "1 characters", "the same token"] {
        assert!(out.contains(said), "{said}: {out}");
    }
    let strict = common::service::cli(&config, &["check-config", "--strict"]);
    assert!(!strict.status.success(), "--strict refuses weak tokens");
}

/// The small doors: CSP reports are bounded per peer, kept fairly (eight addresses posting
/// their fill do not push out another's) and counted; `/metrics` and the health endpoints
/// answer only the console's Host names; a reason is at most 500 characters.
#[tokio::test(flavor = "multi_thread")]
async fn the_small_doors_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let service = start(dir.path(), admin_port).await;
    let (status, _) = exchange(
        OPERATOR,
        admin_port,
        "POST /console/csp-report",
        &[],
        "operator-report",
    )
    .await;
    assert_eq!(status, 204);
    let attackers: Vec<std::net::IpAddr> = (2..10)
        .map(|last| std::net::Ipv4Addr::new(127, 0, 0, last).into())
        .collect();
    for i in 0..20 {
        for (a, attacker) in attackers.iter().enumerate() {
            let report = format!("{{\"csp-report\":{{\"blocked-uri\":\"attacker-{a}-{i}\"}}}}");
            let (status, _) = exchange(
                *attacker,
                admin_port,
                "POST /console/csp-report",
                &[],
                &report,
            )
            .await;
            assert_eq!(status, 204);
        }
    }
    let (_, cookie) = sign_in(OPERATOR, admin_port, OPERATOR_TOKEN).await;
    let cookie = format!("sume_console={}", cookie.unwrap());
    let (_, answer) = exchange(
        OPERATOR,
        admin_port,
        "GET /console/api/csp-reports",
        &[("cookie", &cookie)],
        "",
    )
    .await;
    for a in 0..attackers.len() {
        let kept = answer.matches(&format!("attacker-{a}-")).count();
        assert!(
            kept <= 8,
            "one peer keeps at most 8: {kept} of attacker {a}"
        );
    }
    assert!(answer.contains("operator-report"), "{answer}");
    let (_, metrics) = exchange(OPERATOR, admin_port, "GET /metrics", &[], "").await;
    assert!(
        metrics.contains("sume_console_csp_reports_total 161"),
        "{metrics}"
    );

    for path in ["/metrics", "/healthz", "/readyz"] {
        let (status, _) = exchange(
            OPERATOR,
            admin_port,
            &format!("GET {path}"),
            &[("host", "evil.example")],
            "",
        )
        .await;
        assert_eq!(status, 421, "{path} under a foreign Host");
        let (status, _) = exchange(OPERATOR, admin_port, &format!("GET {path}"), &[], "").await;
        assert_eq!(status, 200, "{path}");
    }

    let long = "x".repeat(12_000);
    let (status, body) = api(
        OPERATOR,
        admin_port,
        &format!("POST /v1/dispatch/pause?reason={long}"),
        OPERATOR_TOKEN,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("at most 500 characters"), "{body}");
    let said = "y".repeat(500);
    let (status, _) = api(
        OPERATOR,
        admin_port,
        &format!("POST /v1/dispatch/pause?reason={said}"),
        OPERATOR_TOKEN,
    )
    .await;
    assert_eq!(status, 200);
    service.stop_cleanly().await;
}

/// A job_id with a right-to-left override and a zero-width space is shown escaped
/// (`\u{202e}`) in the console, not reversing the text after it: in the list, and on the
/// job's page, in its title and in its payload pane.
#[tokio::test(flavor = "multi_thread")]
async fn format_characters_in_ids_are_shown_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    std::fs::write(dir.path().join("admin_token"), OPERATOR_TOKEN).unwrap();
    let config =
        format!("[admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n");
    let server = TestServer::start_in(dir, &config).await;
    assert_eq!(
        server
            .deliver(&job_body("invoice\u{202e}fdp.exe\u{200b}"))
            .await
            .status,
        200
    );
    let (_, cookie) = sign_in(OPERATOR, admin_port, OPERATOR_TOKEN).await;
    let cookie = cookie.unwrap();
    let (status, page) = page_text(admin_port, &cookie, "/console/jobs").await;
    assert_eq!(status, 200);
    assert!(page.contains("invoice\\u{202e}fdp.exe\\u{200b}"), "{page}");
    assert!(
        !page.contains('\u{202e}') && !page.contains('\u{200b}'),
        "{page}"
    );
    let href = page
        .split("href=\"")
        .map(|rest| rest.split('"').next().unwrap())
        .find(|href| href.starts_with("/console/jobs/invoice"))
        .expect("a link to the job");
    let (status, page) = page_text(admin_port, &cookie, href).await;
    assert_eq!(status, 200);
    let payload = page
        .split("class=\"payload\"")
        .nth(1)
        .expect("a payload pane");
    assert!(
        payload.contains("invoice\\u{202e}fdp.exe\\u{200b}"),
        "{page}"
    );
    assert!(
        !page.contains('\u{202e}') && !page.contains('\u{200b}'),
        "{page}"
    );
    server.stop().await.0.unwrap();
}

/// A dead-letter group of 3,000 is retried 500 at a time: one request stays short, and its
/// answer says how many are left.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_group_is_retried_in_short_batches() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    std::fs::write(dir.path().join("admin_token"), OPERATOR_TOKEN).unwrap();
    let config = format!(
        "[admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n\
         console_actions = true\n"
    );
    let server = TestServer::start_in(dir, &config).await;
    insert_jobs(
        &server.config,
        (0..3000).map(|i| {
            (
                format!("dead-{i}"),
                "dead",
                job_body(&format!("dead-{i}")),
                Some(1),
            )
        }),
    );
    let (_, cookie) = sign_in(OPERATOR, admin_port, OPERATOR_TOKEN).await;
    let cookie = format!("sume_console={}", cookie.unwrap());
    let (_, answer) = exchange(
        OPERATOR,
        admin_port,
        "GET /console/api/dead",
        &[("cookie", &cookie)],
        "",
    )
    .await;
    let groups: serde_json::Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let signature = groups[0]["signature"].as_str().unwrap().to_owned();
    let form = format!(
        "signature={}",
        percent_encoding::utf8_percent_encode(&signature, percent_encoding::NON_ALPHANUMERIC)
    );
    let started = Instant::now();
    let (status, answer) = exchange(
        OPERATOR,
        admin_port,
        "POST /console/dead/retry",
        &[("cookie", &cookie)],
        &form,
    )
    .await;
    let took = started.elapsed();
    eprintln!("group retry: one request of {took:?}");
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("500 jobs of the group"), "{answer}");
    assert!(answer.contains("2500 more are left"), "{answer}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    server.stop().await.0.unwrap();
}
