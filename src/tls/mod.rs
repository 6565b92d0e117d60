//! HTTPS on a listener: rustls serving the current certificate, handshakes under a deadline.
//!
//! Each listener with a `[*.tls]` table has one [`Tls`]: a certificate store that rustls asks
//! at every handshake (so a reload is seen by the next handshake, and open connections keep
//! theirs) and the watch that reloads it ([`reload`]).

pub mod certificate;
mod reload;

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;
use crate::metrics::METRICS;
use certificate::{About, Certificate};

/// The first byte of a TLS record that carries a handshake (a ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The answer to a plain HTTP request sent to an HTTPS port: a clear refusal, then close.
const PLAIN_HTTP_REFUSAL: &[u8] = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\
content-type: text/plain; charset=utf-8\r\ncontent-length: 42\r\n\r\n\
This port speaks HTTPS: use an https:// URL";

/// HTTPS on one listener.
pub struct Tls {
    /// `webhook` or `admin`: the label of its metrics and log lines.
    listener: &'static str,
    acceptor: TlsAcceptor,
    store: Arc<CertificateStore>,
    config: TlsConfig,
}

/// Why a connection ended before its first request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Timeout,
    PlainHttp,
    /// A name the certificate does not cover (the store refused it).
    UnknownName,
    Failed,
}

impl Tls {
    /// Reads the certificate files and builds the listener's TLS: 1.2 and 1.3, ALPN
    /// `http/1.1`, resumption by tickets. Refuses a pair that does not match or has expired.
    pub fn from_config(config: &TlsConfig, listener: &'static str) -> anyhow::Result<Arc<Tls>> {
        let certificate = load(config, listener)?;
        tracing::info!(
            listener,
            names = %certificate.about.names.join(","),
            not_after = %humantime::format_rfc3339_seconds(certificate.about.not_after),
            cert_file = %config.cert_file.display(),
            "TLS certificate loaded"
        );
        METRICS
            .tls
            .set_expiry(listener, certificate.about.not_after_unix());
        let store = Arc::new(CertificateStore {
            listener,
            current: RwLock::new(Arc::new(certificate)),
        });
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS: the protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(store.clone());
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        // A sender that opens a connection per delivery resumes instead of a full handshake.
        server.ticketer = rustls::crypto::ring::Ticketer::new().context("TLS: session tickets")?;
        Ok(Arc::new(Tls {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(server)),
            store,
            config: config.clone(),
        }))
    }

    /// The certificate served now.
    pub fn about(&self) -> About {
        self.store.current().about.clone()
    }

    /// The TLS handshake on a new connection, all within `deadline` (the listener's
    /// `header_read_timeout`). A plain HTTP request gets a short `400` that says to use
    /// https; anything else that is not a handshake is closed. `None`: the connection is done.
    pub async fn handshake(
        &self,
        mut stream: TcpStream,
        deadline: Duration,
    ) -> Option<TlsStream<TcpStream>> {
        let attempt = async {
            let mut first = [0u8; 1];
            if stream.peek(&mut first).await.ok() != Some(1) {
                return Err(Refused::Failed);
            }
            if first[0] != TLS_HANDSHAKE_RECORD {
                if first[0].is_ascii_uppercase() {
                    let _ = stream.write_all(PLAIN_HTTP_REFUSAL).await;
                    let _ = stream.shutdown().await;
                }
                return Err(Refused::PlainHttp);
            }
            self.acceptor.accept(stream).await.map_err(|error| {
                // The store's refusal is the one general error a server handshake ends with.
                match error.get_ref().and_then(|inner| inner.downcast_ref()) {
                    Some(rustls::Error::General(_)) => Refused::UnknownName,
                    _ => Refused::Failed,
                }
            })
        };
        let refused = match tokio::time::timeout(deadline, attempt).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(refused)) => refused,
            Err(_) => Refused::Timeout,
        };
        let reason = match refused {
            Refused::Timeout => "timeout",
            Refused::PlainHttp => "plain_http",
            Refused::UnknownName => "unknown_name",
            Refused::Failed => "failed",
        };
        METRICS.tls.record_handshake_refused(self.listener, reason);
        None
    }
}

/// Loads the configured pair, refusing one unfit to serve now; counts a failure.
fn load(config: &TlsConfig, listener: &'static str) -> anyhow::Result<Certificate> {
    let loaded =
        Certificate::from_files(&config.cert_file, &config.key_file).and_then(
            |loaded| match loaded.about.unfit(SystemTime::now()) {
                Some(problem) => Err(anyhow::anyhow!("{}: {problem}", config.cert_file.display())),
                None => Ok(loaded),
            },
        );
    loaded.with_context(|| format!("[{}.tls]", table(listener)))
}

/// The config table of a listener's TLS.
fn table(listener: &'static str) -> &'static str {
    match listener {
        "admin" => "admin",
        _ => "server",
    }
}

/// The certificate a listener serves, asked by rustls at each handshake.
struct CertificateStore {
    listener: &'static str,
    current: RwLock<Arc<Certificate>>,
}

impl CertificateStore {
    fn current(&self) -> Arc<Certificate> {
        self.current.read().expect("not poisoned").clone()
    }

    fn replace(&self, certificate: Certificate) {
        *self.current.write().expect("not poisoned") = Arc::new(certificate);
    }
}

impl std::fmt::Debug for CertificateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateStore")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CertificateStore {
    /// The certificate, for a client that asks for a name it covers or for none (an IP
    /// address). A name it does not cover ends the handshake at once with an alert: the
    /// client hears that this is not the host it wants, rather than a certificate error.
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.current();
        match hello.server_name() {
            Some(name) if !current.about.covers(name) => None,
            _ => Some(current.key.clone()),
        }
    }
}
