//! The real binary as a child process: start it on a config file, sign deliveries for it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{config_text, unix_now, WEBHOOK_PATH};

pub const BINARY: &str = env!("CARGO_BIN_EXE_sume-receiver");

/// A config file for the binary in `dir`: on `port`, more `[server]` keys, `extra` sections.
pub fn write_config(dir: &Path, port: u16, server_keys: &str, extra: &str) -> PathBuf {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{server_keys}\n{}",
        config_text(dir, extra)
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

pub fn cli(config: &Path, args: &[&str]) -> Output {
    Command::new(BINARY)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

/// The binary running `serve`, its log appended to `service.log` in the test directory.
pub struct Service {
    pub child: Child,
    pub config: PathBuf,
}

impl Service {
    pub async fn start(config: &Path, port: u16) -> Service {
        Self::start_with_env(config, port, &[]).await
    }

    pub async fn start_with_env(config: &Path, port: u16, env: &[(&str, &str)]) -> Service {
        Self::launch(config, port, &[], env).await
    }

    /// `serve` with more arguments (`--listen ADDR`); `port` is the one it will listen on.
    pub async fn start_with_args(config: &Path, port: u16, args: &[&str]) -> Service {
        Self::launch(config, port, args, &[]).await
    }

    async fn launch(config: &Path, port: u16, args: &[&str], env: &[(&str, &str)]) -> Service {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(config.with_file_name("service.log"))
            .unwrap();
        let child = Command::new(BINARY)
            .args(["serve", "--config"])
            .arg(config)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut service = Service {
            child,
            config: config.to_owned(),
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = service.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(config.with_file_name("service.log")).unwrap();
                panic!("service exited with {status} at start:\n{log}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "service never listened"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        service
    }

    pub fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn terminate(&self) {
        // SAFETY: sending a signal to our own child has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// SIGTERM, then the exit must be clean (0) and within 10 s; returns how long it took.
    pub async fn stop_cleanly(self) -> Duration {
        let started = Instant::now();
        self.terminate();
        let status = self.wait_exit(Duration::from_secs(10)).await;
        assert!(status.success(), "{status}");
        started.elapsed()
    }

    /// Waits for the exit; a failed exit shows the service's log.
    pub async fn wait_exit(mut self, within: Duration) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                if !status.success() {
                    let log = std::fs::read_to_string(self.config.with_file_name("service.log"));
                    eprintln!(
                        "service exited with {status}; its log:\n{}",
                        log.unwrap_or_default()
                    );
                }
                return status;
            }
            assert!(
                started.elapsed() < within,
                "service did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A test that fails midway must not leave its service running.
impl Drop for Service {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A delivery of `body` to the receiver on `port`, signed now with `secret`.
pub fn signed_delivery(
    port: u16,
    secret: &str,
    body: &str,
) -> hyper::Request<http_body_util::Full<bytes::Bytes>> {
    let timestamp = unix_now().to_string();
    hyper::Request::post(format!("http://127.0.0.1:{port}{WEBHOOK_PATH}"))
        .header(sume_receiver::ingest::TIMESTAMP_HEADER, &timestamp)
        .header(
            sume_receiver::ingest::SIGNATURE_HEADER,
            sume_receiver::signature::sign(&[secret], &timestamp, body.as_bytes()),
        )
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_owned(),
        )))
        .unwrap()
}
