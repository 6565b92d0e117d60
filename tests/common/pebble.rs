//! A real ACME CA for the tests: Debian's `pebble` with `pebble-challtestsrv` answering its DNS
//! (every name is 127.0.0.1), on loopback ports of their own, validating for real.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::tls::TestCa;
use super::{free_port, skip};

/// A running Pebble; stopped when dropped.
pub struct Pebble {
    /// The ACME directory URL.
    pub directory: String,
    /// The CA of Pebble's own HTTPS (`tls.acme.directory_ca_file`).
    pub ca_file: PathBuf,
    management: u16,
    log: PathBuf,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

/// Where Pebble validates: TLS-ALPN-01 on `tls_port`, HTTP-01 on `http_port`.
pub struct Validation {
    pub tls_port: u16,
    pub http_port: u16,
    /// How long the certificates it issues are valid.
    pub validity: Duration,
}

impl Pebble {
    /// `None` (the test skips, saying why) when Pebble is not installed.
    pub async fn start(test: &str, validation: Validation) -> Option<Pebble> {
        let installed = |program: &str| {
            Command::new(program)
                .arg("-h")
                .stderr(Stdio::null())
                .stdout(Stdio::null())
                .status()
                .is_ok()
        };
        if !installed("pebble") || !installed("pebble-challtestsrv") {
            skip(
                test,
                "install Debian's pebble (pebble and pebble-challtestsrv) to run it",
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new();
        let own = ca.leaf();
        let ca_file = dir.path().join("pebble-ca.pem");
        std::fs::write(&ca_file, &ca.pem).unwrap();
        std::fs::write(dir.path().join("cert.pem"), &own.cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), &own.key).unwrap();
        let (listen, management, dns, dns_management) =
            (free_port(), free_port(), free_port(), free_port());
        let config = serde_json::json!({ "pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": dir.path().join("cert.pem"),
            "privateKey": dir.path().join("key.pem"),
            "httpPort": validation.http_port,
            "tlsPort": validation.tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "certificateValidityPeriod": validation.validity.as_secs(),
        }});
        let config_file = dir.path().join("pebble.json");
        std::fs::write(&config_file, config.to_string()).unwrap();
        let log = dir.path().join("pebble.log");
        let output = |name: &str| std::fs::File::create(dir.path().join(name)).unwrap();
        let dns_server = Command::new("pebble-challtestsrv")
            .args(["-dns01", &format!("127.0.0.1:{dns}")])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-management", &format!("127.0.0.1:{dns_management}")])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdout(output("challtestsrv.log"))
            .stderr(output("challtestsrv.err"))
            .spawn()
            .unwrap();
        let pebble = Command::new("pebble")
            .arg("-config")
            .arg(&config_file)
            .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
            // Validations at once, not after up to 15 s; they still happen.
            .env("PEBBLE_VA_NOSLEEP", "1")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(output("pebble.err"))
            .spawn()
            .unwrap();
        let pebble = Pebble {
            directory: format!("https://127.0.0.1:{listen}/dir"),
            ca_file,
            management,
            log,
            children: vec![pebble, dns_server],
            _dir: dir,
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", listen)).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", management)).is_ok()
            {
                return Some(pebble);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("pebble did not listen within 5 s");
    }

    /// The root of the certificates it issues (made anew at each start).
    pub async fn root(&self) -> String {
        let client = sume_receiver::http_client::client_trusting(Some(&self.ca_file)).unwrap();
        let request = hyper::Request::get(format!("https://127.0.0.1:{}/roots/0", self.management))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let answer =
            sume_receiver::http_client::send(&client, request, Duration::from_secs(5), 1 << 20)
                .await
                .unwrap();
        assert_eq!(answer.status, 200);
        String::from_utf8(answer.body.to_vec()).unwrap()
    }

    /// Orders it has taken so far.
    pub fn orders(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("Added order")
            .count()
    }

    /// Stops it: the CA is down from here on.
    pub fn stop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
    }
}
