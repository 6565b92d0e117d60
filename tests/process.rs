//! The real binary as a child process: kill -9 at random moments, SIGTERM, and the CLI.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::service::*;
use common::*;

/// How many of the `acknowledged` jobs the handler (which appends the job_id to `runs_log` and
/// never fails) ran more than once. Each run beyond the first needs an attempt of its own:
/// one interrupted by a kill; a run without such an attempt would be a double run.
fn jobs_run_twice(
    runs_log: &Path,
    rows: &HashMap<String, (String, i64)>,
    acknowledged: &HashSet<String>,
) -> usize {
    let mut runs: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(runs_log).unwrap().lines() {
        *runs.entry(line.to_owned()).or_default() += 1;
    }
    let mut reran = 0;
    for job_id in acknowledged {
        let count = runs.get(job_id).copied().unwrap_or(0);
        let attempts = rows[job_id].1;
        assert!(count >= 1, "{job_id} is done but its handler never ran");
        assert!(
            count as i64 <= attempts,
            "{job_id} ran {count} times in {attempts} attempts"
        );
        if count > 1 {
            reran += 1;
        }
    }
    reran
}

/// job_id -> (state, attempts) in the ledger of the service configured in `dir`.
fn job_rows(dir: &Path) -> HashMap<String, (String, i64)> {
    let config = sume_receiver::config::Config::parse(&config_text(dir, ""), dir).unwrap();
    ledger_rows(&config, "SELECT job_id, state, attempts FROM jobs", &[])
        .into_iter()
        .map(|row| {
            (
                row[0].as_str().unwrap().to_owned(),
                (
                    row[1].as_str().unwrap().to_owned(),
                    row[2].as_i64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Regression: the packaged bash completion completed the first word only (`sume-receiver jobs
/// <TAB>` offered nothing): clap_complete named the cases of a hyphenated binary apart from
/// the states it moves to.
#[test]
fn bash_completes_below_the_first_word() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sume-receiver.bash");
    let generated = Command::new(BINARY)
        .args(["generate", "completions", "bash"])
        .output()
        .unwrap();
    assert!(generated.status.success());
    std::fs::write(&script, generated.stdout).unwrap();
    let complete = |words: &str| {
        // What bash does on <TAB>: the words so far, the index of the one being completed.
        let program = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _sume__receiver sume-receiver \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD - 1]}}\"; \
             echo \"${{COMPREPLY[*]}}\"",
            script.display()
        );
        let output = Command::new("bash")
            .args(["-c", &program])
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap()
    };
    assert!(complete("sume-receiver j").contains("jobs"));
    let jobs = complete("sume-receiver jobs ''");
    for subcommand in ["list", "show", "retry", "run-now", "stats"] {
        assert!(
            jobs.split_whitespace().any(|word| word == subcommand),
            "{jobs}"
        );
    }
    assert!(complete("sume-receiver jobs list --st").contains("--state"));
}

/// Regression: the man page pointed at a page per subcommand that nobody ships, and had no
/// FILES, SIGNALS, EXIT STATUS or EXAMPLES.
#[test]
fn the_man_page_holds_every_command_and_the_operator_sections() {
    let output = Command::new(BINARY)
        .args(["generate", "man"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let page = String::from_utf8(output.stdout).unwrap();
    for section in [
        ".SH COMMANDS",
        ".SH FILES",
        ".SH SIGNALS",
        ".SH \"EXIT STATUS\"",
        ".SH EXAMPLES",
    ] {
        assert!(page.contains(section), "{section} missing");
    }
    assert!(page.contains("sume\\-receiver jobs run\\-now"), "{page}");
    assert!(
        !page.contains("(1)\n.TP") && !page.contains("jobs(1)"),
        "{page}"
    );
}

/// Regression: as root, check-config passed paths the service's user could not write, and said
/// nothing of whose access it had checked with.
#[test]
fn check_config_as_root_says_whose_access_it_checked() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip(
            "check_config_as_root_says_whose_access_it_checked",
            "needs root",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), free_port(), "", "");
    let output = cli(&config, &["check-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("checked as root"),
        "{stdout}{stderr}"
    );
    // As the unit runs it, as the service's user: no such warning.
    let strict = cli(&config, &["check-config", "--strict"]);
    assert!(!String::from_utf8_lossy(&strict.stderr).contains("checked as root"));
    assert!(!String::from_utf8_lossy(&strict.stdout).contains("checked as root"));
}

#[test]
fn check_config_names_the_bad_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[signature]\nsecrets = [\"a\"]\ntolerance = \"soon\"\n",
    )
    .unwrap();
    let output = cli(&config, &["check-config"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("tolerance") && stderr.contains("invalid duration"),
        "{stderr}"
    );

    std::fs::write(&config, "[signature]\nsecrets = [\"a\"]\n").unwrap();
    let output = cli(&config, &["check-config"]);
    assert!(output.status.success(), "{output:?}");

    // The console's limit on a due job's wait: a zero would call every due job late.
    let admin = "[signature]\nsecrets = [\"a\"]\n[admin]\ndue_job_limit = ";
    std::fs::write(&config, format!("{admin}\"0s\"\n")).unwrap();
    let output = cli(&config, &["check-config"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("admin.due_job_limit must be greater than zero"),
        "{stderr}"
    );
    std::fs::write(&config, format!("{admin}\"2m\"\n")).unwrap();
    assert!(cli(&config, &["check-config"]).status.success());
}

/// Routes (issue 51): check-config names the line of each bad route, every one at once, and
/// passes good ones.
#[test]
fn check_config_names_the_line_of_a_bad_route() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let route = |name: &str, matcher: &str| {
        format!("[[route]]\nname = \"{name}\"\n{matcher}[route.handler]\ncommand = [\"true\"]\n")
    };
    let head = "[signature]\nsecrets = [\"a\"]\n[database]\npath = \"ledger.db\"\n";
    let good = format!(
        "{head}{}{}[routing]\nunmatched = \"done\"\n",
        route("pager", "event_types = [\"job.failed\"]\ncontinue = true\n"),
        route("archive", "event_types = [\"*\"]\n"),
    );
    std::fs::write(&config, &good).unwrap();
    let output = cli(&config, &["check-config"]);
    assert!(output.status.success(), "{output:?}");

    let bad = format!(
        "{head}{}{}{}[routing]\nunmatched = \"nowhere\"\n",
        route("all", "event_types = [\"*\"]\n"),
        route("all", "event_types = [\"job.completed\"]\n"),
        route("empty", ""),
    );
    std::fs::write(&config, &bad).unwrap();
    let output = cli(&config, &["check-config"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for wanted in [
        "route \"all\" (line 10): the name \"all\" is given twice (first on line 5)",
        "route \"all\" (line 10) is never reached: route \"all\" (line 5)",
        "route \"empty\" (line 15) has no match",
        "routing.unmatched (line 20) is \"nowhere\"",
    ] {
        assert!(stderr.contains(wanted), "{wanted:?} missing from {stderr}");
    }

    let unknown = good.replace("continue = true", "contine = true");
    std::fs::write(&config, unknown).unwrap();
    let output = cli(&config, &["check-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && stderr.contains("line 8")
            && stderr.contains("unknown field `contine`"),
        "{stderr}"
    );
}

/// Regression: the unit's `check-config` passed, with a warning, a secrets file the service
/// could not read, and `serve` then failed (a restart loop); `systemctl reload` reported
/// success for a reload that failed. `--strict`, which the unit runs as the service's user
/// before a start and a reload, refuses it.
#[test]
fn check_config_strict_refuses_an_unreadable_secrets_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let secrets = dir.path().join("secrets");
    std::fs::write(
        &config,
        format!("[signature]\nsecrets_file = \"{}\"\n", secrets.display()),
    )
    .unwrap();
    let lenient = cli(&config, &["check-config"]);
    assert!(lenient.status.success(), "{lenient:?}");
    assert!(String::from_utf8_lossy(&lenient.stdout).contains("warning"));
    let strict = cli(&config, &["check-config", "--strict"]);
    assert!(!strict.status.success(), "{strict:?}");
    let said = String::from_utf8_lossy(&strict.stdout);
    assert!(said.contains("error") && said.contains("secrets"), "{said}");
    std::fs::write(&secrets, "whsec_rotated_0123456789\n").unwrap();
    // Readable by the service's user only: others reading it is refused too.
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    let strict = cli(&config, &["check-config", "--strict"]);
    assert!(strict.status.success(), "{strict:?}");
}

/// Regression: the SIGTERM handler used to be installed only after startup, so a stop right
/// after the port opened killed the process with the default action (exit by signal).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_right_after_the_port_opens_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "[handler]\ncommand = [\"true\"]\n");
    for _ in 0..3 {
        let service = Service::start(&config, port).await;
        service.stop_cleanly().await;
    }
}

/// `serve --listen ADDR` listens there, not on the config's `server.listen`: nothing on the
/// command line could override it before.
#[tokio::test(flavor = "multi_thread")]
async fn serve_listen_overrides_the_configs_address() {
    let dir = tempfile::tempdir().unwrap();
    let (configured, given) = (free_port(), free_port());
    let config = write_config(dir.path(), configured, "", "");
    let listen = format!("127.0.0.1:{given}");
    let service = Service::start_with_args(&config, given, &["--listen", &listen]).await;
    assert!(std::net::TcpStream::connect(("127.0.0.1", configured)).is_err());
    let sender = Balancer::new(&[given]);
    sender.deliver_until_acknowledged("on-the-given-port").await;
    service.stop_cleanly().await;
}

/// Regression: `jobs redeliver ''`, `'.'` and `'..'` sent `POST /v1/jobs//webhook/redeliver` and
/// `/v1/jobs/../webhook/redeliver` to Sume with the API key; ids with control characters were
/// taken too. Every command refuses them with a usage error (exit 2) before doing anything.
#[tokio::test(flavor = "multi_thread")]
async fn cli_refuses_invalid_job_ids_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), free_port(), "", "");
    for command in ["show", "retry", "expect", "redeliver"] {
        for (job_id, reason) in [
            ("", "job_id is empty"),
            (".", "`.` or `..`"),
            ("..", "`.` or `..`"),
            ("a\nb", "control character"),
            ("a\u{1b}[2J", "control character"),
        ] {
            let output = cli(&config, &["jobs", command, job_id]);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{command} {job_id:?}: {stderr}"
            );
            assert!(stderr.contains(reason), "{command} {job_id:?}: {stderr}");
        }
    }
}

/// What the ledger holds is shown, never played to the terminal: a row from before ids were
/// checked, and a handler error with escape sequences.
#[tokio::test(flavor = "multi_thread")]
async fn cli_tables_escape_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "");
    let service = Service::start(&config, port).await;
    service.stop_cleanly().await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.sqlite3")).unwrap();
    db.execute(
        "INSERT INTO jobs (job_id, state, body, received_at, updated_at, last_error)
         VALUES (?1, 'dead', '{}', 0, 0, ?2)",
        ["legacy\u{1b}[31m\nid", "boom\u{1b}]0;owned\u{7}\r\nnext"],
    )
    .unwrap();
    drop(db);
    for args in [&["jobs", "list"][..], &["jobs", "list", "--state", "dead"]] {
        let output = cli(&config, args);
        assert!(output.status.success(), "{output:?}");
        let table = String::from_utf8(output.stdout).unwrap();
        assert!(
            !table.chars().any(|c| c.is_control() && c != '\n'),
            "{table:?}"
        );
        assert!(table.contains("legacy\\u{1b}[31m\\nid"), "{table}");
        assert_eq!(table.lines().count(), 2, "{table:?}");
    }
}

/// Regression: `loadgen` signs with the configured secrets, so pointed at a production config its
/// fake jobs ran the real handler.
#[test]
fn loadgen_refuses_a_config_with_a_handler_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        free_port(),
        "",
        "[handler]\ncommand = [\"true\"]\n",
    );
    let output = cli(&config, &["loadgen", "--requests", "1", "--no-check"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--allow-handler"), "{stderr}");
}

/// One signed delivery with `secret`; the status it got.
async fn deliver_once(port: u16, secret: &str, job_id: &str) -> u16 {
    let request = signed_delivery(port, secret, &job_body(job_id));
    let client = sume_receiver::http_client::new_client();
    sume_receiver::http_client::send(&client, request, Duration::from_secs(10), 4096)
        .await
        .unwrap()
        .status
        .as_u16()
}

fn send_signal(service: &Service, signal: i32) {
    // SAFETY: sending a signal to our own child has no memory-safety preconditions.
    unsafe { libc::kill(service.child.id() as i32, signal) };
}

/// A config whose secrets come from a file only (as with a systemd credential).
fn write_file_secrets_config(dir: &Path, port: u16, secrets_file: &Path) -> PathBuf {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n[signature]\nsecrets_file = \"{}\"\n\
         [database]\npath = \"{}\"\n",
        secrets_file.display(),
        dir.join("ledger.sqlite3").display()
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Regression: SIGHUP ended the service at once (status 129). Now it reloads the secrets without
/// dropping a delivery; a bad new file keeps the old secrets.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_secrets_and_a_bad_file_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let secrets = dir.path().join("secrets");
    std::fs::write(&secrets, "whsec_old\n").unwrap();
    let config = write_file_secrets_config(dir.path(), port, &secrets);
    let service = Service::start(&config, port).await;
    assert_eq!(deliver_once(port, "whsec_old", "job-1").await, 200);
    assert_eq!(deliver_once(port, "whsec_new", "job-2").await, 401);

    // Rotation: new secret first, old kept, one reload.
    std::fs::write(&secrets, "whsec_new\nwhsec_old\n").unwrap();
    send_signal(&service, libc::SIGHUP);
    let log = dir.path().join("service.log");
    let reloaded = eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|log| log.contains("live=2"))
    })
    .await;
    assert!(reloaded, "{}", std::fs::read_to_string(&log).unwrap());
    assert_eq!(deliver_once(port, "whsec_new", "job-3").await, 200);
    assert_eq!(deliver_once(port, "whsec_old", "job-4").await, 200);

    // A broken file: the error is logged, the two secrets stay live.
    std::fs::write(&secrets, "# nothing\n").unwrap();
    send_signal(&service, libc::SIGHUP);
    let refused = eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|log| log.contains("reload failed"))
    })
    .await;
    assert!(refused, "{}", std::fs::read_to_string(&log).unwrap());
    assert_eq!(deliver_once(port, "whsec_new", "job-5").await, 200);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log_text.contains("whsec_"),
        "a secret reached the log:\n{log_text}"
    );
    service.stop_cleanly().await;
}

/// Regression: with `secrets_file` pointing at a systemd credential (absent outside the unit),
/// `jobs list`, `vacuum` and `check-config` failed on the host.
#[tokio::test(flavor = "multi_thread")]
async fn commands_that_need_no_secret_do_not_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let secrets = dir.path().join("secrets");
    std::fs::write(&secrets, "whsec_only_while_running\n").unwrap();
    let config = write_file_secrets_config(dir.path(), port, &secrets);
    Service::start(&config, port).await.stop_cleanly().await;
    std::fs::remove_file(&secrets).unwrap();

    for args in [&["jobs", "list"][..], &["vacuum"], &["check-config"]] {
        let output = cli(&config, args);
        assert!(output.status.success(), "{args:?}: {output:?}");
    }
    let check = String::from_utf8(cli(&config, &["check-config"]).stdout).unwrap();
    assert!(
        check.contains("warning: signature.secrets_file: cannot read"),
        "{check}"
    );
    let serve = cli(&config, &["serve"]);
    assert!(!serve.status.success());
    assert!(String::from_utf8_lossy(&serve.stderr).contains("secrets_file"));
}

/// Regression: the example config's secret stayed live on a public address, and check-config
/// called the config valid.
#[test]
fn the_example_secret_is_refused_on_a_public_address() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[server]\nlisten = \"0.0.0.0:{}\"\n[signature]\nsecrets = [\"{}\"]\n[database]\npath = \"{}\"\n",
        free_port(),
        sume_receiver::config::EXAMPLE_SECRET,
        dir.path().join("ledger.sqlite3").display()
    );
    let config = dir.path().join("config.toml");
    std::fs::write(&config, text).unwrap();
    let serve = cli(&config, &["serve"]);
    assert!(!serve.status.success());
    assert!(
        String::from_utf8_lossy(&serve.stderr).contains("example secret"),
        "{serve:?}"
    );
    let check = cli(&config, &["check-config"]);
    assert!(!check.status.success());
    assert!(
        String::from_utf8_lossy(&check.stdout)
            .contains("error: signing secrets: signature: the example secret"),
        "{check:?}"
    );
}

/// `Type=notify`: READY=1 once serving, watchdog pings (with a status line) while the ledger
/// writer answers, STOPPING=1 at shutdown. Handlers do not inherit the notify socket.
#[tokio::test(flavor = "multi_thread")]
async fn systemd_hears_ready_watchdog_pings_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let env_file = dir.path().join("handler.env");
    let script = format!("env > {}", env_file.display());
    let config = write_config(
        dir.path(),
        port,
        "",
        &format!("[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\n"),
    );
    let socket_path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let receive = || {
        let mut buffer = [0u8; 4096];
        let read = socket.recv(&mut buffer).expect("a notification");
        String::from_utf8_lossy(&buffer[..read]).into_owned()
    };
    let service = Service::start_with_env(
        &config,
        port,
        &[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "600000"),
        ],
    )
    .await;
    let ready = receive();
    assert!(ready.contains("READY=1"), "{ready}");
    Balancer::new(&[port])
        .deliver_until_acknowledged("job-notify")
        .await;
    let ping = receive();
    assert!(ping.contains("WATCHDOG=1"), "{ping}");
    assert!(ping.contains("STATUS=serving"), "{ping}");
    assert!(
        eventually(Duration::from_secs(5), || env_file.exists()).await,
        "the handler ran"
    );
    let handler_env = std::fs::read_to_string(&env_file).unwrap();
    assert!(!handler_env.contains("NOTIFY_SOCKET"), "{handler_env}");
    assert!(!handler_env.contains("WATCHDOG_"), "{handler_env}");
    service.terminate();
    let stopping = loop {
        let message = receive();
        if !message.contains("WATCHDOG=1") {
            break message;
        }
    };
    assert!(stopping.contains("STOPPING=1"), "{stopping}");
    assert!(service.wait_exit(Duration::from_secs(10)).await.success());
}

/// send-test and sign, against the real service: a signed test delivery is acknowledged (then a
/// duplicate), sign's headers verify, and a receiver with another secret makes send-test fail.
#[tokio::test(flavor = "multi_thread")]
async fn send_test_and_sign_make_deliveries_the_receiver_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "");
    let service = Service::start(&config, port).await;

    let first = cli(&config, &["send-test", "--job-id", "job-send-test"]);
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(first.status.success(), "{first:?}");
    assert!(
        stdout.starts_with("200 OK in ") && stdout.contains(r#""duplicate":false"#),
        "{stdout}"
    );
    let again = cli(&config, &["send-test", "--job-id", "job-send-test"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains(r#""duplicate":true"#));

    let body_file = dir.path().join("body.json");
    std::fs::write(&body_file, job_body("job-signed-by-hand")).unwrap();
    let signed = cli(&config, &["sign", "--body", body_file.to_str().unwrap()]);
    assert!(signed.status.success(), "{signed:?}");
    let printed = String::from_utf8(signed.stdout).unwrap();
    let header = |name: &str| -> String {
        printed
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {printed}"))
            .to_owned()
    };
    let curl = printed.lines().nth(2).unwrap();
    assert!(
        curl.starts_with("curl -sS -X POST 'http://127.0.0.1:")
            && curl.contains("--data-binary '@"),
        "{curl}"
    );
    let request = hyper::Request::post(format!("http://127.0.0.1:{port}{WEBHOOK_PATH}"))
        .header(
            sume_receiver::ingest::TIMESTAMP_HEADER,
            header(sume_receiver::ingest::TIMESTAMP_HEADER),
        )
        .header(
            sume_receiver::ingest::SIGNATURE_HEADER,
            header(sume_receiver::ingest::SIGNATURE_HEADER),
        )
        .body(http_body_util::Full::new(bytes::Bytes::from(job_body(
            "job-signed-by-hand",
        ))))
        .unwrap();
    let answer = sume_receiver::http_client::send(
        &sume_receiver::http_client::new_client(),
        request,
        Duration::from_secs(5),
        4096,
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 200);

    let other_dir = tempfile::tempdir().unwrap();
    let other = other_dir.path().join("config.toml");
    std::fs::write(
        &other,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[signature]\nsecrets = [\"whsec_other\"]\n"
        ),
    )
    .unwrap();
    let refused = cli(&other, &["send-test"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stdout).starts_with("401"),
        "{refused:?}"
    );
    service.stop_cleanly().await;
}

/// The access log: one line per delivery with its fields; JSON for log shippers.
#[tokio::test(flavor = "multi_thread")]
async fn json_logs_carry_one_line_per_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "[log]\nformat = \"json\"\n");
    let service = Service::start(&config, port).await;
    assert!(cli(&config, &["send-test", "--job-id", "job-logged"])
        .status
        .success());
    assert_eq!(deliver_once(port, "whsec_wrong", "job-forged").await, 401);
    service.stop_cleanly().await;
    let log = std::fs::read_to_string(dir.path().join("service.log")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let delivery = lines
        .iter()
        .find(|line| line["message"] == "delivery")
        .expect("an access log line");
    assert_eq!(delivery["job_id"], "job-logged");
    assert_eq!(delivery["outcome"], "claimed");
    assert_eq!(delivery["status"], 200);
    assert!(delivery["latency_ms"].as_f64().unwrap() > 0.0);
    let refused = lines
        .iter()
        .find(|line| line["message"] == "delivery refused")
        .expect("a refusal line");
    assert_eq!(
        (refused["status"].as_u64(), refused["level"].as_str()),
        (Some(401), Some("WARN"))
    );
    // Who sent it: the connection's address (here loopback, some ephemeral port).
    let peer = refused["peer"]
        .as_str()
        .expect("the refusal names its peer");
    assert!(
        peer.parse::<std::net::SocketAddr>()
            .is_ok_and(|peer| peer.ip().is_loopback()),
        "{peer}"
    );
    assert!(!log.contains(SECRET), "a secret reached the log");
}

/// Two receivers on one PostgreSQL ledger behind a load balancer that sends each delivery to
/// either of them (to the other while one is down): 10,000 deliveries, 30 % of them duplicates,
/// 500 job_ids sent to both receivers at the same moment; one receiver killed with -9 in the
/// middle and restarted. Every acknowledged job is done, no job_id is claimed first twice, and
/// only jobs in flight on the killed receiver may run again.
#[tokio::test(flavor = "multi_thread")]
async fn two_receivers_on_one_postgres_ledger_lose_nothing_across_a_kill_9() {
    Backend::Postgres
        .run("two_receivers_on_one_postgres_ledger_lose_nothing_across_a_kill_9", async {
            const JOBS: usize = 7_000;
            const REPEATED: usize = 2_500; // delivered a second time, one after the other
            const AT_ONCE: usize = 500; // delivered to both receivers at the same moment
            const SENDERS: usize = 32;
            const CONCURRENCY: usize = 8;

            let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let runs_log = dir_a.path().join("runs.log");
            let handler = format!(
                "[handler]\ncommand = [\"sh\", \"-c\", {:?}]\nconcurrency = {CONCURRENCY}\n\
                 timeout = \"2s\"\nmax_attempts = 20\nbackoff = \"50ms\"\n\n\
                 [sweeper]\ninterval = \"200ms\"\nstale_after = \"1s\"\n",
                format!("echo \"$SUME_JOB_ID\" >> {}", runs_log.display())
            );
            let (port_a, port_b) = (free_port(), free_port());
            let config_a = write_config(dir_a.path(), port_a, "", &handler);
            std::fs::copy(dir_a.path().join("postgres-url"), dir_b.path().join("postgres-url"))
                .unwrap();
            let config_b = write_config(dir_b.path(), port_b, "", &handler);
            let service_a = Service::start(&config_a, port_a).await;
            let service_b = Service::start(&config_b, port_b).await;

            // Each job once, AT_ONCE of them to both receivers together, then REPEATED again.
            let deliveries: Vec<(usize, bool)> = (0..JOBS)
                .map(|i| (i, i < AT_ONCE))
                .chain((AT_ONCE..AT_ONCE + REPEATED).map(|i| (i, false)))
                .collect();
            let requests = deliveries.len() + AT_ONCE;
            assert_eq!(requests, 10_000);
            let next = Arc::new(Mutex::new(deliveries.into_iter()));
            let first_claims: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
            let acknowledged = Arc::new(Mutex::new(HashSet::new()));
            let balancer = Arc::new(Balancer::new(&[port_a, port_b]));
            let started = Instant::now();
            let mut senders = tokio::task::JoinSet::new();
            for _ in 0..SENDERS {
                let (next, first_claims, acknowledged, balancer) = (
                    next.clone(),
                    first_claims.clone(),
                    acknowledged.clone(),
                    balancer.clone(),
                );
                senders.spawn(async move {
                    loop {
                        let Some((i, at_once)) = next.lock().unwrap().next() else {
                            return;
                        };
                        let job_id = format!("pair-job-{i:05}");
                        let firsts = if at_once {
                            let (a, b) = tokio::join!(
                                balancer.deliver(&job_id, 0),
                                balancer.deliver(&job_id, 1)
                            );
                            usize::from(!a) + usize::from(!b)
                        } else {
                            usize::from(!balancer.deliver(&job_id, fastrand::usize(..2)).await)
                        };
                        *first_claims.lock().unwrap().entry(job_id.clone()).or_default() += firsts;
                        acknowledged.lock().unwrap().insert(job_id);
                    }
                });
            }
            // The kill: once 40 % of the jobs are acknowledged, receiver A dies and comes back.
            while acknowledged.lock().unwrap().len() < JOBS * 4 / 10 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            service_a.kill_9();
            let killed_at = acknowledged.lock().unwrap().len();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let service_a = Service::start(&config_a, port_a).await;
            while senders.join_next().await.is_some() {}
            let sent_in = started.elapsed();
            let acknowledged = acknowledged.lock().unwrap().clone();
            assert_eq!(acknowledged.len(), JOBS);

            let all_done = eventually(Duration::from_secs(120), || {
                let rows = job_rows(dir_a.path());
                acknowledged
                    .iter()
                    .all(|job_id| rows.get(job_id).is_some_and(|(state, _)| state == "done"))
            })
            .await;
            let drained_in = started.elapsed();
            service_a.stop_cleanly().await;
            service_b.stop_cleanly().await;
            let rows = job_rows(dir_a.path());
            assert!(all_done, "not every acknowledged job is done");
            assert_eq!(rows.len(), JOBS, "one row per job, no more");

            let first_claims = first_claims.lock().unwrap().clone();
            let claimed_twice: Vec<_> = first_claims.iter().filter(|(_, n)| **n > 1).collect();
            assert!(claimed_twice.is_empty(), "claimed first twice: {claimed_twice:?}");
            // A claim committed just before the kill but never answered is seen as a duplicate
            // on its retry: such a job has no first claim among the answers.
            let unanswered_firsts = first_claims.values().filter(|n| **n == 0).count();

            let reran = jobs_run_twice(&runs_log, &rows, &acknowledged);
            assert!(
                reran <= CONCURRENCY,
                "{reran} jobs ran twice; at most {CONCURRENCY} were running on the killed receiver"
            );
            println!(
                "two receivers: {requests} deliveries ({} duplicates, {AT_ONCE} job_ids to both at once) \
                 sent in {:.1} s; kill -9 of one after {killed_at} jobs acknowledged; all {JOBS} jobs done \
                 after {:.1} s; lost 0; claimed first twice 0; first claim unanswered (kill) \
                 {unanswered_firsts}; ran twice {reran}",
                REPEATED + AT_ONCE,
                sent_in.as_secs_f64(),
                drained_in.as_secs_f64(),
            );
        })
        .await;
}

/// Signs and POSTs deliveries as a load balancer in front of receivers that may be down: to
/// one receiver, then to the next while it does not answer 200.
struct Balancer {
    ports: Vec<u16>,
    client: sume_receiver::http_client::HttpClient,
}

impl Balancer {
    fn new(ports: &[u16]) -> Balancer {
        Balancer {
            ports: ports.to_vec(),
            client: sume_receiver::http_client::new_client(),
        }
    }

    /// Delivers until acknowledged, starting with receiver `first`; whether it was a duplicate.
    async fn deliver(&self, job_id: &str, first: usize) -> bool {
        let body = job_body(job_id);
        for attempt in 0..2000 {
            let port = self.ports[(first + attempt) % self.ports.len()];
            let request = signed_delivery(port, SECRET, &body);
            match sume_receiver::http_client::send(
                &self.client,
                request,
                Duration::from_secs(10),
                4096,
            )
            .await
            {
                Ok(answer) if answer.status == 200 => {
                    let answer: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
                    return answer["duplicate"].as_bool().unwrap();
                }
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        panic!("{job_id} was never acknowledged");
    }

    async fn deliver_until_acknowledged(&self, job_id: &str) -> bool {
        self.deliver(job_id, 0).await
    }
}

on_both_ledgers! {
/// backup while the service runs: a checked, private copy that holds the jobs; refuses to
/// overwrite. jobs retry tells whether a service will pick the job up now or at the next start;
/// jobs stats counts.
#[tokio::test(flavor = "multi_thread")]
async fn backup_stats_and_retry_tell_the_truth() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = "[handler]\ncommand = [\"false\"]\nmax_attempts = 1\n";
    let config = write_config(dir.path(), port, "", extra);
    let service = Service::start(&config, port).await;
    let sender = Balancer::new(&[port]);
    for job in ["job-a", "job-b", "job-c"] {
        sender.deliver_until_acknowledged(job).await;
    }
    assert!(
        eventually(Duration::from_secs(5), || job_rows(dir.path())
            .values()
            .all(|(state, _)| state == "dead"))
        .await
    );

    if Backend::current() == Backend::Sqlite {
        let copy = dir.path().join("backup.sqlite3");
        let backup = cli(&config, &["backup", copy.to_str().unwrap()]);
        assert!(backup.status.success(), "{backup:?}");
        assert!(
            String::from_utf8_lossy(&backup.stdout).contains("backed up 3 jobs"),
            "{backup:?}"
        );
        let copied: i64 = rusqlite::Connection::open(&copy)
            .unwrap()
            .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
            .unwrap();
        assert_eq!(copied, 3);
        assert_eq!(
            std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let again = cli(&config, &["backup", copy.to_str().unwrap()]);
        assert!(!again.status.success());
        assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    } else {
        let backup = cli(&config, &["backup", "copy.sqlite3"]);
        assert!(!backup.status.success());
        assert!(
            String::from_utf8_lossy(&backup.stderr).contains("pg_dump"),
            "{backup:?}"
        );
    }

    let stats = cli(&config, &["jobs", "stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["by_state"]["dead"], 3, "{stats}");
    assert_eq!(stats["received_last_hour"], 3, "{stats}");
    assert_eq!(stats["dead_last_day"], 3, "{stats}");
    let table = String::from_utf8(cli(&config, &["jobs", "stats"]).stdout).unwrap();
    assert!(table.contains("dead, last 24 h"), "{table}");

    let expect = cli(&config, &["jobs", "expect", "job-later"]);
    assert!(
        String::from_utf8_lossy(&expect.stdout).contains("job job-later is expected"),
        "{expect:?}"
    );
    let expected = cli(&config, &["jobs", "expected", "--json"]);
    let expected: serde_json::Value = serde_json::from_slice(&expected.stdout).unwrap();
    assert_eq!(expected[0]["job_id"], "job-later", "{expected}");
    assert_eq!(expected[0]["state"], "waiting", "{expected}");

    let (running, stopped) = match Backend::current() {
        Backend::Sqlite => ("the running service picks it up", "runs at the next start"),
        Backend::Postgres => ("the receivers were notified", "the receivers were notified"),
    };
    let retry = cli(&config, &["jobs", "retry", "job-a"]);
    assert!(
        String::from_utf8_lossy(&retry.stdout).contains(running),
        "{retry:?}"
    );
    service.stop_cleanly().await;
    let retry = cli(&config, &["jobs", "retry", "job-b"]);
    assert!(
        String::from_utf8_lossy(&retry.stdout).contains(stopped),
        "{retry:?}"
    );
    assert_eq!(job_rows(dir.path())["job-b"].0, "claimed");
}

/// A receiver killed mid-attempt and started again takes its interrupted attempt back at once
/// (on PostgreSQL: the lease carries its name), not after the lease expires (here 2 minutes).
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_receiver_takes_back_its_own_interrupted_attempt_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let runs = dir.path().join("runs.log");
    let script = format!(
        "echo \"$SUME_ATTEMPT\" >> {}; [ \"$SUME_ATTEMPT\" -gt 1 ] || sleep 30",
        runs.display()
    );
    let extra = format!("[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\ntimeout = \"60s\"\n");
    let config = write_config(dir.path(), port, "", &extra);
    let attempts = || std::fs::read_to_string(&runs).unwrap_or_default();
    let service = Service::start(&config, port).await;
    Balancer::new(&[port]).deliver_until_acknowledged("job-cut").await;
    assert!(eventually(Duration::from_secs(5), || attempts() == "1\n").await);
    service.kill_9();
    let service = Service::start(&config, port).await;
    assert!(
        eventually(Duration::from_secs(5), || attempts() == "1\n2\n").await,
        "the interrupted attempt did not run again at once: {:?}",
        attempts()
    );
    assert!(eventually(Duration::from_secs(5), || job_rows(dir.path())["job-cut"].0 == "done").await);
    service.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_moments_loses_no_acknowledged_job() {
    const JOBS: usize = 200;
    const DUPLICATES: usize = 100; // a third of the 300 deliveries
    const SENDERS: usize = 4;
    const KILLS: usize = 6;
    const CONCURRENCY: usize = 4;

    let dir = tempfile::tempdir().unwrap();
    let runs_log = dir.path().join("runs.log");
    let port = free_port();
    let script = format!(
        "echo \"$SUME_JOB_ID\" >> {}; sleep 0.02",
        runs_log.display()
    );
    let handler = format!(
        "[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nconcurrency = {CONCURRENCY}\nmax_attempts = 20\nbackoff = \"50ms\"\n\n[sweeper]\ninterval = \"200ms\"\n"
    );
    let config = write_config(dir.path(), port, "", &handler);

    // 300 deliveries: every job once, and the first 100 jobs a second time.
    let deliveries: Vec<String> = (0..JOBS)
        .chain(0..DUPLICATES)
        .map(|i| format!("crash-job-{i:04}"))
        .collect();
    let next = Arc::new(Mutex::new(deliveries.into_iter()));
    let acknowledged = Arc::new(Mutex::new(HashSet::new()));
    let sender = Arc::new(Balancer::new(&[port]));

    let mut service = Service::start(&config, port).await;
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..SENDERS {
        let (next, acknowledged, sender) = (next.clone(), acknowledged.clone(), sender.clone());
        senders.spawn(async move {
            let mut duplicates = 0;
            loop {
                let Some(job_id) = next.lock().unwrap().next() else {
                    return duplicates;
                };
                if sender.deliver_until_acknowledged(&job_id).await {
                    duplicates += 1;
                }
                acknowledged.lock().unwrap().insert(job_id);
                // Paced so that the kills land while deliveries are still coming in.
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..25))).await;
            }
        });
    }
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(50..350))).await;
        service.kill_9();
        service = Service::start(&config, port).await;
    }
    let mut duplicate_answers = 0;
    while let Some(duplicates) = senders.join_next().await {
        duplicate_answers += duplicates.unwrap_or_else(|error| {
            let log = std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
            panic!("{error}; the service's log:\n{log}")
        });
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert_eq!(acknowledged.len(), JOBS);
    assert!(
        duplicate_answers >= DUPLICATES,
        "every second delivery of a job is a duplicate"
    );

    let all_done = eventually(Duration::from_secs(30), || {
        let rows = job_rows(dir.path());
        acknowledged
            .iter()
            .all(|job_id| rows.get(job_id).is_some_and(|(state, _)| state == "done"))
    })
    .await;
    service.stop_cleanly().await;
    let rows = job_rows(dir.path());
    assert!(all_done, "not every acknowledged job is done: {rows:?}");
    assert_eq!(rows.len(), JOBS, "one row per job, no more");

    let reran = jobs_run_twice(&runs_log, &rows, &acknowledged);
    assert!(
        reran <= KILLS * CONCURRENCY,
        "{reran} jobs ran twice; at most {} were in flight at kills",
        KILLS * CONCURRENCY
    );
    println!(
        "crash test: {} deliveries ({duplicate_answers} answered duplicate), {KILLS} kills, {} jobs done, lost 0, re-run {reran}",
        JOBS + DUPLICATES,
        acknowledged.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_a_running_handler_finish_within_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let handler = "[handler]\ncommand = [\"sh\", \"-c\", \"sleep 1\"]\n";
    let config = write_config(dir.path(), port, "", &format!("{handler}\n"));
    let service = Service::start(&config, port).await;
    let sender = Balancer::new(&[port]);
    sender.deliver_until_acknowledged("job-graceful").await;
    assert!(
        eventually(Duration::from_secs(5), || job_rows(dir.path())["job-graceful"]
            .0
            == "running")
        .await
    );
    assert!(service.stop_cleanly().await < Duration::from_secs(5));
    assert_eq!(job_rows(dir.path())["job-graceful"].0, "done");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_past_the_grace_stops_the_handler_and_the_next_start_finishes_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let release = dir.path().join("release");
    let script = format!("[ -e {} ] || sleep 30", release.display());
    // One attempt only: an attempt our own shutdown interrupted must not use it up.
    let handler = format!("[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nmax_attempts = 1\n");
    let config = write_config(dir.path(), port, "shutdown_grace = \"300ms\"", &handler);

    let service = Service::start(&config, port).await;
    let sender = Balancer::new(&[port]);
    sender.deliver_until_acknowledged("job-long").await;
    assert!(
        eventually(Duration::from_secs(5), || job_rows(dir.path())["job-long"].0
            == "running")
        .await
    );
    let took = service.stop_cleanly().await;
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // Regression: the row stayed `running` and the next start counted the interrupted attempt
    // as failed, so a job on its last attempt went `dead`.
    assert_eq!(
        job_rows(dir.path())["job-long"],
        ("claimed".to_owned(), 0),
        "given back uncounted, for the next start"
    );

    std::fs::write(&release, "").unwrap();
    let service = Service::start(&config, port).await;
    assert!(
        eventually(Duration::from_secs(10), || job_rows(dir.path())["job-long"].0
            == "done")
        .await
    );
    assert_eq!(
        job_rows(dir.path())["job-long"].1,
        1,
        "the interrupted attempt does not count"
    );
    service.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_lists_shows_and_retries_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let runs_log = dir.path().join("runs.log");
    let script = format!(
        "echo \"$SUME_JOB_ID $SUME_ATTEMPT\" >> {}; echo 'no luck' >&2; exit 1",
        runs_log.display()
    );
    let extra = format!(
        "[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nmax_attempts = 1\n\n[sweeper]\ninterval = \"100ms\"\n"
    );
    let config = write_config(dir.path(), port, "", &extra);

    let missing = cli(&config, &["jobs", "list"]);
    assert!(!missing.status.success());
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(
        error.contains("no ledger at") || error.contains("start the service once"),
        "{missing:?}"
    );

    let service = Service::start(&config, port).await;
    let sender = Balancer::new(&[port]);
    sender.deliver_until_acknowledged("job-cli").await;
    assert!(
        eventually(Duration::from_secs(5), || job_rows(dir.path())["job-cli"].0
            == "dead")
        .await
    );

    let list = cli(&config, &["jobs", "list", "--state", "dead"]);
    assert!(list.status.success(), "{list:?}");
    let table = String::from_utf8(list.stdout).unwrap();
    assert!(
        table.starts_with("JOB_ID") && table.contains("job-cli") && table.contains("no luck"),
        "{table}"
    );

    let list = cli(&config, &["jobs", "list", "--state", "done", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&list.stdout).unwrap(),
        serde_json::json!([])
    );

    let show = cli(&config, &["jobs", "show", "job-cli", "--json"]);
    let job: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(job["state"], "dead");
    assert_eq!(job["attempts"], 1);
    // The body as JSON, not a string holding JSON; times also in RFC 3339.
    assert_eq!(
        job["body"],
        serde_json::from_str::<serde_json::Value>(&job_body("job-cli")).unwrap()
    );
    assert!(
        job["received_at_utc"].as_str().unwrap().ends_with('Z'),
        "{job}"
    );
    assert!(job["received_at"].is_i64(), "{job}");
    assert!(job["last_error"]
        .as_str()
        .unwrap()
        .contains("exited with status 1"));

    let retry = cli(&config, &["jobs", "retry", "job-cli"]);
    assert!(retry.status.success(), "{retry:?}");
    let ran_twice = eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&runs_log)
            .unwrap_or_default()
            .lines()
            .count()
            == 2
    })
    .await;
    assert!(ran_twice, "the retried job did not run again");
    assert!(
        eventually(Duration::from_secs(5), || job_rows(dir.path())["job-cli"].0
            == "dead")
        .await
    );

    let unknown = cli(&config, &["jobs", "show", "nope"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no job \"nope\""));
    let unknown = cli(&config, &["jobs", "retry", "nope"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no job \"nope\""));
    let unknown = cli(&config, &["jobs", "run-now", "nope"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no job \"nope\""));
    let not_retrying = cli(&config, &["jobs", "run-now", "job-cli"]);
    assert!(!not_retrying.status.success());
    assert!(
        String::from_utf8_lossy(&not_retrying.stderr).contains("run-now applies to a retrying job"),
        "{not_retrying:?}"
    );
    let bad_state = cli(&config, &["jobs", "list", "--state", "sleeping"]);
    assert!(String::from_utf8_lossy(&bad_state.stderr).contains("unknown state"));

    service.stop_cleanly().await;
}
}

/// A retrying job: `jobs list` says when it is due; `jobs run-now` during a pause says it waits
/// for the resume (it said "picks it up within 1s").
#[tokio::test(flavor = "multi_thread")]
async fn cli_run_now_during_a_pause_says_it_waits_and_the_list_says_when_a_job_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = "[handler]\ncommand = [\"false\"]\nmax_attempts = 3\nbackoff = \"1h\"\n";
    let config = write_config(dir.path(), port, "", extra);
    let service = Service::start(&config, port).await;
    Balancer::new(&[port])
        .deliver_until_acknowledged("job-later")
        .await;
    assert!(
        eventually(Duration::from_secs(5), || job_rows(dir.path())["job-later"]
            .0
            == "retrying")
        .await
    );
    let stdout = |output: std::process::Output| {
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };

    let table = stdout(cli(&config, &["jobs", "list", "--state", "retrying"]));
    let lines: Vec<&str> = table.lines().collect();
    let due_at = ledger_rows(
        &sume_receiver::config::Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap(),
        "SELECT next_attempt_at FROM jobs WHERE job_id = 'job-later'",
        &[],
    )[0][0]
        .as_i64()
        .unwrap();
    let due = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + Duration::from_millis(due_at.try_into().unwrap()),
    )
    .to_string();
    let column = lines[0].find("DUE").expect(&table);
    assert!(lines[1][column..].starts_with(&due), "{due}\n{table}");

    assert!(stdout(cli(&config, &["jobs", "pause"])).starts_with("paused"));
    let run_now = stdout(cli(&config, &["jobs", "run-now", "job-later"]));
    assert!(
        run_now.contains("job job-later is due now; dispatch is paused, so it runs once `jobs resume` resumes it"),
        "{run_now}"
    );
    service.stop_cleanly().await;
}

/// The bad-day commands against a running service: a bulk retry counts first and changes
/// nothing without --yes; pause holds the retried jobs; a cancelled one never runs; resume runs
/// the rest; `jobs show` tells each job's story; `jobs list` pages.
#[tokio::test(flavor = "multi_thread")]
async fn cli_bulk_retry_pause_cancel_and_history() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let runs_log = dir.path().join("runs.log");
    let script = format!(
        "echo \"$SUME_JOB_ID\" >> {}; echo 'no luck' >&2; exit 1",
        runs_log.display()
    );
    let extra = format!("[handler]\ncommand = [\"sh\", \"-c\", {script:?}]\nmax_attempts = 1\n");
    let config = write_config(dir.path(), port, "", &extra);
    let runs = || {
        std::fs::read_to_string(&runs_log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let stdout = |output: &std::process::Output| {
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let service = Service::start(&config, port).await;
    let sender = Balancer::new(&[port]);
    for job_id in ["bad-a", "bad-b", "bad-c"] {
        sender.deliver_until_acknowledged(job_id).await;
    }
    let all_dead = || {
        job_rows(dir.path())
            .values()
            .filter(|(state, _)| state == "dead")
            .count()
    };
    assert!(eventually(Duration::from_secs(10), || all_dead() == 3).await);

    let show = stdout(&cli(&config, &["jobs", "show", "bad-a"]));
    assert!(show.contains("received (webhook)"), "{show}");
    assert!(show.contains("attempt 1 (first): dead after"), "{show}");
    assert!(
        show.contains("exit status 1: exited with status 1; stderr: no luck"),
        "{show}"
    );

    let preview = stdout(&cli(
        &config,
        &[
            "jobs",
            "retry",
            "--state",
            "dead",
            "--error-contains",
            "no luck",
        ],
    ));
    assert!(
        preview.contains("3 dead job(s) match; add --yes"),
        "{preview}"
    );
    assert_eq!(all_dead(), 3, "a preview changes nothing");
    let none = stdout(&cli(
        &config,
        &[
            "jobs",
            "retry",
            "--state",
            "dead",
            "--error-contains",
            "timeout",
        ],
    ));
    assert!(none.contains("0 dead job(s) match"), "{none}");
    // The dead-letter group of the handler's failure, by its signature (the console's).
    let group = stdout(&cli(
        &config,
        &[
            "jobs",
            "retry",
            "--state",
            "dead",
            "--group",
            "exited with status 1: no luck",
        ],
    ));
    assert!(
        group.contains("3 dead jobs in the group \"exited with status 1: no luck\"; add --yes"),
        "{group}"
    );

    assert!(stdout(&cli(&config, &["jobs", "pause"])).starts_with("paused"));
    assert!(stdout(&cli(&config, &["jobs", "pause"])).starts_with("already paused"));
    // The service reads a pause made elsewhere within IDLE_LOOK.
    tokio::time::sleep(sume_receiver::worker::IDLE_LOOK + Duration::from_millis(300)).await;
    let retried = stdout(&cli(
        &config,
        &["jobs", "retry", "--state", "dead", "--since", "1h", "--yes"],
    ));
    assert!(
        retried.starts_with("3 job(s) are queued to run again"),
        "{retried}"
    );
    assert!(
        retried.contains("dispatch is paused, so it runs once `jobs resume` resumes it"),
        "{retried}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(runs(), 3, "a retried job ran while dispatch was paused");

    let page = cli(
        &config,
        &["jobs", "list", "--state", "claimed", "--limit", "2"],
    );
    assert_eq!(stdout(&page).lines().count(), 3, "a header and two jobs");
    let next = String::from_utf8_lossy(&page.stderr).into_owned();
    let cursor = next
        .trim()
        .strip_prefix("next page: --after ")
        .expect(&next)
        .to_owned();
    let last = cli(
        &config,
        &[
            "jobs", "list", "--state", "claimed", "--limit", "2", "--after", &cursor,
        ],
    );
    assert_eq!(
        stdout(&last).lines().count(),
        2,
        "the third job, alone: {last:?}"
    );
    assert!(last.stderr.is_empty(), "no page after the last: {last:?}");

    // With no USER in its environment (cron, systemd-run), the CLI names its uid's user.
    let nameless = Command::new(BINARY)
        .arg("--config")
        .arg(&config)
        .args(["jobs", "cancel", "bad-c", "--reason", "not needed"])
        .env_remove("USER")
        .env_remove("SUDO_USER")
        .env_remove("LOGNAME")
        .output()
        .unwrap();
    stdout(&nameless);
    let user = Command::new("id").arg("-un").output().unwrap();
    let user = String::from_utf8_lossy(&user.stdout).trim().to_owned();
    let again = cli(&config, &["jobs", "cancel", "bad-c", "--reason", "twice"]);
    assert!(
        String::from_utf8_lossy(&again.stderr)
            .contains("cancel applies to a claimed or retrying job"),
        "{again:?}"
    );
    // The same reason rules as the console's and the API's: a blank one is none.
    let blank = cli(&config, &["jobs", "cancel", "bad-c", "--reason", " "]);
    assert!(
        String::from_utf8_lossy(&blank.stderr).contains("a cancel needs a reason"),
        "{blank:?}"
    );
    assert!(stdout(&cli(&config, &["jobs", "resume"])).starts_with("resumed"));
    assert!(
        eventually(Duration::from_secs(10), || runs() == 5 && all_dead() == 3).await,
        "{}",
        runs()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs(), 5, "the cancelled job ran");

    let story = stdout(&cli(&config, &["jobs", "show", "bad-a"]));
    assert!(story.contains("retry by cli:"), "{story}");
    assert!(
        story.contains("bulk retry: --state dead --since 1h"),
        "{story}"
    );
    assert!(
        story.contains("attempt 1 (manual_retry): dead after"),
        "{story}"
    );
    let cancelled = stdout(&cli(&config, &["jobs", "show", "bad-c"]));
    assert!(
        cancelled.contains(&format!("cancel by cli:{user} (uid ")),
        "{cancelled}"
    );
    assert!(cancelled.contains("not needed"), "{cancelled}");
    let neither = cli(&config, &["jobs", "retry"]);
    assert!(!neither.status.success());

    // A replay runs the stored body through another handler once; the job stays as it was.
    let copy = dir.path().join("replayed.json");
    let to_file = format!("cat > {}", copy.display());
    let replayed = cli(
        &config,
        &["jobs", "replay", "bad-a", "--", "sh", "-c", &to_file],
    );
    assert!(
        stdout(&replayed).contains("through command sh -c"),
        "{replayed:?}"
    );
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), job_body("bad-a"));
    let failing = cli(
        &config,
        &["jobs", "replay", "bad-a", "--", "sh", "-c", "exit 9"],
    );
    assert!(!failing.status.success(), "{failing:?}");
    assert_eq!(
        job_rows(dir.path())["bad-a"].0,
        "dead",
        "a replay changes no state"
    );
    let story = stdout(&cli(&config, &["jobs", "show", "bad-a"]));
    assert!(story.contains("replay by cli:"), "{story}");
    assert!(story.contains("failed after"), "{story}");
    assert!(story.contains("exited with status 9"), "{story}");
    let unknown = cli(
        &config,
        &["jobs", "replay", "nobody", "--url", "http://127.0.0.1:9/"],
    );
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no job \"nobody\""),
        "{unknown:?}"
    );
    service.stop_cleanly().await;
}

/// Regression: following the README's restore steps, the first `serve` refused the restored
/// file ("cannot open the WAL ... No such file or directory"): a backup has no WAL yet.
#[tokio::test]
async fn the_service_serves_a_restored_backup_on_its_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "");
    let service = Service::start(&config, port).await;
    assert_eq!(deliver_once(port, SECRET, "before-backup").await, 200);
    let backup = dir.path().join("backup.sqlite3");
    let made = cli(&config, &["backup", backup.to_str().unwrap()]);
    assert!(made.status.success(), "{made:?}");
    assert_eq!(deliver_once(port, SECRET, "after-backup").await, 200);
    service.stop_cleanly().await;

    // The README's steps: the ledger aside, its WAL and shared memory gone, the copy in place.
    let ledger = dir.path().join("ledger.sqlite3");
    std::fs::rename(&ledger, dir.path().join("ledger.sqlite3.broken")).unwrap();
    for leftover in ["ledger.sqlite3-wal", "ledger.sqlite3-shm"] {
        let _ = std::fs::remove_file(dir.path().join(leftover));
    }
    std::fs::copy(&backup, &ledger).unwrap();
    let service = Service::start(&config, port).await;
    assert_eq!(deliver_once(port, SECRET, "before-backup").await, 200);
    let rows = job_rows(dir.path());
    assert!(rows.contains_key("before-backup"), "{rows:?}");
    assert!(!rows.contains_key("after-backup"), "not in the backup");
    assert_eq!(deliver_once(port, SECRET, "after-restore").await, 200);
    service.stop_cleanly().await;
}

/// Regression: `serve` started with a handler that cannot run, acknowledged every delivery and
/// let it go dead; check-config already refused that config.
#[tokio::test]
async fn serve_refuses_a_handler_that_cannot_run_as_check_config_does() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        port,
        "",
        "[handler]\ncommand = [\"/nonexistent/handler\"]\n",
    );
    let checked = cli(&config, &["check-config"]);
    assert!(!checked.status.success());
    let served = cli(&config, &["serve"]);
    assert!(!served.status.success());
    let stderr = String::from_utf8_lossy(&served.stderr);
    let reason = "handler.command: \"/nonexistent/handler\" is not an executable file";
    assert!(stderr.contains(reason), "{stderr}");
    assert!(String::from_utf8_lossy(&checked.stdout).contains(reason));
    assert!(
        !dir.path().join("ledger.sqlite3").exists(),
        "refused before opening the ledger"
    );
}

/// Regression: syncing the database file at start through a descriptor of our own, then
/// closing it, dropped SQLite's POSIX locks on the file; the next process to read the live
/// ledger and close it (`sqlite3`, a monitoring script) took itself for the last connection,
/// checkpointed and deleted the WAL under the service, which then stopped (its WAL gone).
#[tokio::test]
async fn another_process_reading_the_live_ledger_leaves_its_wal_alone() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "");
    let service = Service::start(&config, port).await;
    let ledger = dir.path().join("ledger.sqlite3");
    for round in 0..3 {
        assert_eq!(
            deliver_once(port, SECRET, &format!("job-{round}")).await,
            200
        );
        let read = Command::new("python3")
            .args([
                "-c",
                "import sqlite3, sys\n\
                 db = sqlite3.connect(sys.argv[1])\n\
                 print(db.execute('SELECT count(*) FROM jobs').fetchone()[0])\n\
                 db.close()\n",
            ])
            .arg(&ledger)
            .output()
            .unwrap();
        assert!(read.status.success(), "{read:?}");
        assert_eq!(
            String::from_utf8_lossy(&read.stdout).trim(),
            (round + 1).to_string()
        );
        assert!(
            dir.path().join("ledger.sqlite3-wal").exists(),
            "the reader deleted the live WAL"
        );
    }
    assert_eq!(deliver_once(port, SECRET, "after-the-readers").await, 200);
    service.stop_cleanly().await;
}

/// Regression: with its descriptors used up by slow heads (a hard open-files limit below
/// `max_connections`), the accept loop only backed off, and no sender got in until a head
/// timed out. Now the connection that has waited longest for its head makes room, as at the
/// connection limit.
#[tokio::test(flavor = "multi_thread")]
async fn out_of_descriptors_slow_heads_make_room_for_a_sender() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "header_read_timeout = \"60s\"", "");
    let service = Service::start(&config, port).await;
    let limit = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    // SAFETY: prlimit reads the struct we pass and writes nothing (the old limit is not asked).
    let set = unsafe {
        libc::prlimit(
            service.child.id() as i32,
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let slow = slow_heads(("127.0.0.1", port), 100).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = sume_receiver::http_client::new_client();
    for i in 0..5 {
        let request = signed_delivery(port, SECRET, &job_body(&format!("job-{i}")));
        // Well before the 60 s the slow heads could otherwise hold the descriptors.
        let answer =
            sume_receiver::http_client::send(&client, request, Duration::from_secs(10), 4096)
                .await
                .expect("a sender waited behind slow heads");
        assert_eq!(answer.status, 200);
    }
    drop(slow);
    service.stop_cleanly().await;
}

/// Regression: under journald the fields were `F_JOB_ID` (the README's `JOB_ID=` found
/// nothing: bare `JOB_ID` is systemd's own field) and INFO went out at priority 5; the message
/// held no field (`delivery refused`, no reason or peer) and values held Debug quotes. Run where no
/// journald is (a socket of our own in its place); skipped where one runs or without root.
#[tokio::test(flavor = "multi_thread")]
async fn journald_fields_carry_our_prefix_and_info_is_priority_6() {
    let test = "journald_fields_carry_our_prefix_and_info_is_priority_6";
    let socket_path = Path::new("/run/systemd/journal/socket");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || socket_path.exists() {
        return skip(
            test,
            "needs root, and /run/systemd/journal/socket free (no journald)",
        );
    }
    std::fs::create_dir_all(socket_path.parent().unwrap()).unwrap();
    let journal = std::os::unix::net::UnixDatagram::bind(socket_path).unwrap();
    // Removed however the test ends: a socket left there would look like a journald.
    struct Unbind<'a>(&'a Path);
    impl Drop for Unbind<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _unbind = Unbind(socket_path);
    journal
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    // Read as journald does, while the service runs (its queue holds only a few datagrams),
    // until the service has stopped and nothing more comes.
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = std::thread::spawn({
        let stopped = stopped.clone();
        move || {
            let mut entries = Vec::new();
            let mut buffer = vec![0u8; 65536];
            loop {
                match journal.recv(&mut buffer) {
                    Ok(n) => entries.push(journal_fields(&buffer[..n])),
                    Err(_) if stopped.load(std::sync::atomic::Ordering::SeqCst) => return entries,
                    Err(_) => {}
                }
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "[log]\nformat = \"journald\"\n");
    let service = Service::start(&config, port).await;
    let client = sume_receiver::http_client::new_client();
    let request = signed_delivery(port, SECRET, &job_body("job-journal"));
    let answer = sume_receiver::http_client::send(&client, request, Duration::from_secs(5), 4096)
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(deliver_once(port, "whsec_wrong", "job-forged").await, 401);
    service.stop_cleanly().await;
    stopped.store(true, std::sync::atomic::Ordering::SeqCst);
    let entries = reader.join().unwrap();
    let field = |entry: &Vec<(String, String)>, name: &str| {
        entry
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let delivery = entries
        .iter()
        .find(|entry| field(entry, "SUME_JOB_ID").as_deref() == Some("job-journal"))
        .unwrap_or_else(|| panic!("no entry with SUME_JOB_ID=job-journal in {entries:#?}"));
    assert_eq!(
        field(delivery, "PRIORITY").as_deref(),
        Some("6"),
        "{delivery:?}"
    );
    assert_eq!(field(delivery, "SUME_OUTCOME").as_deref(), Some("claimed"));
    // The default view of journalctl shows MESSAGE alone: the fields are in it too.
    let message = field(delivery, "MESSAGE").unwrap();
    assert!(
        message.starts_with("delivery ")
            && message.contains(" job_id=job-journal")
            && message.contains(" outcome=claimed"),
        "{message}"
    );
    let refused = entries
        .iter()
        .find(|entry| field(entry, "SUME_OUTCOME").as_deref() == Some("unauthorized"))
        .unwrap_or_else(|| panic!("no refusal in {entries:#?}"));
    let error = field(refused, "SUME_ERROR").unwrap();
    assert!(
        error.starts_with("bad signature") && !error.contains('"'),
        "no Debug quotes in a field: {error}"
    );
    let message = field(refused, "MESSAGE").unwrap();
    assert!(
        message.contains(&format!(" error=\"{error}\"")) && message.contains(" peer=127.0.0.1:"),
        "{message}"
    );
    assert_eq!(field(refused, "PRIORITY").as_deref(), Some("4"));
    let unprefixed = entries
        .iter()
        .flatten()
        .find(|(key, _)| key.starts_with("F_") || key == "JOB_ID");
    assert!(unprefixed.is_none(), "{unprefixed:?}");
}

/// The fields of one datagram of journald's native protocol: `NAME=value\n`, or `NAME\n`, a
/// little-endian 64-bit length, the value, `\n`.
fn journal_fields(mut datagram: &[u8]) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    while let Some(end) = datagram.iter().position(|&b| b == b'\n' || b == b'=') {
        let name = String::from_utf8_lossy(&datagram[..end]).into_owned();
        let value;
        if datagram[end] == b'=' {
            let rest = &datagram[end + 1..];
            let stop = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            value = String::from_utf8_lossy(&rest[..stop]).into_owned();
            datagram = &rest[(stop + 1).min(rest.len())..];
        } else {
            let length = u64::from_le_bytes(datagram[end + 1..end + 9].try_into().unwrap());
            let start = end + 9;
            let stop = start + length as usize;
            value = String::from_utf8_lossy(&datagram[start..stop]).into_owned();
            datagram = &datagram[(stop + 1).min(datagram.len())..];
        }
        fields.push((name, value));
    }
    fields
}

/// A damaged ledger: the service serves at once (the whole-file check runs after the start),
/// the check finds the damage and the service exits with 65, which the unit does not restart
/// (that nothing is acknowledged meanwhile: open.rs's tests); the next start checks before
/// serving and refuses it.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_ledger_stops_the_service_and_the_next_start_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, "", "");
    let service = Service::start(&config, port).await;
    assert_eq!(deliver_once(port, SECRET, "job-before").await, 200);
    assert!(service.stop_cleanly().await < Duration::from_secs(10));
    sume_receiver::ledger::sqlite::damage_for_test(&dir.path().join("ledger.sqlite3"));

    let service = Service::start(&config, port).await;
    let status = service.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(65), "{status}");
    let log = std::fs::read_to_string(dir.path().join("service.log")).unwrap();
    assert!(log.contains("is damaged"), "{log}");

    let again = cli(&config, &["serve"]);
    assert_eq!(again.status.code(), Some(65), "{again:?}");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains(".recover"), "{stderr}");
}
