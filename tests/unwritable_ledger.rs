//! `serve` as a user who cannot write the ledger's directory says so in `check-config`'s words,
//! not as the lock file it cannot open there.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::service::BINARY;
use common::{free_port, SECRET};

#[test]
fn serve_in_a_ledger_directory_it_cannot_write_says_what_check_config_says() {
    let dir = tempfile::tempdir().unwrap();
    let ledger_dir = dir.path().join("ledger");
    std::fs::create_dir(&ledger_dir).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\n\n[signature]\nsecrets = [\"{SECRET}\"]\n\n\
             [database]\npath = \"{}\"\n",
            free_port(),
            ledger_dir.join("ledger.sqlite3").display()
        ),
    )
    .unwrap();
    let mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    mode(dir.path(), 0o755);
    mode(&config, 0o644);
    mode(&ledger_dir, 0o555);

    let serve = as_another_user(&config, "serve");
    let check = as_another_user(&config, "check-config");
    let said = |output: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let (serve_said, check_said) = (said(&serve), said(&check));
    assert!(!serve.status.success() && !check.status.success());
    let cause = format!(
        "database.path: cannot create the ledger or its WAL in {}: not writable by this user",
        ledger_dir.display()
    );
    assert!(check_said.contains(&cause), "{check_said}");
    assert!(serve_said.contains(&cause), "{serve_said}");
    assert!(!serve_said.contains("lock file"), "{serve_said}");
}

/// Runs the binary with `command`: as nobody (65534) when the test runs as root, who may write
/// anywhere; else as this user, who may not write a directory of mode 0555.
fn as_another_user(config: &Path, command: &str) -> Output {
    // SAFETY: geteuid has no preconditions.
    let mut run = if unsafe { libc::geteuid() } == 0 {
        let mut setpriv = Command::new("setpriv");
        setpriv.args(["--reuid=65534", "--regid=65534", "--clear-groups", BINARY]);
        setpriv
    } else {
        Command::new(BINARY)
    };
    let mut child = run
        .arg("--config")
        .arg(config)
        .arg(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A serve that started after all must not hang the test.
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
