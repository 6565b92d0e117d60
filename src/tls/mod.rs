//! HTTPS on a listener: rustls serving the current certificate, handshakes under a deadline.
//!
//! Each listener with a `[*.tls]` table has one [`Tls`]: a certificate store that rustls asks
//! at every handshake (so a new certificate is served from the next handshake on, and open
//! connections keep theirs), fed either by certificate files ([`reload`]) or by an ACME CA
//! ([`acme`]).

mod acme;
pub mod certificate;
mod reload;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::{AcmeChallenge, CertificateSource, TlsConfig};
use crate::metrics::METRICS;
pub use acme::HttpChallenges;
use acme::{Acme, ACME_TLS_ALPN};
use certificate::{About, Certificate};
use reload::Files;

/// The first byte of a TLS record that carries a handshake (a ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The answer to a plain HTTP request sent to an HTTPS port: a clear refusal, then close.
const PLAIN_HTTP_REFUSAL: &str = "This port speaks HTTPS: use an https:// URL\n";

/// HTTPS on one listener.
pub struct Tls {
    /// `webhook` or `admin`: the label of its metrics and log lines.
    listener: &'static str,
    acceptor: TlsAcceptor,
    store: Arc<CertificateStore>,
    source: Source,
}

/// Where the store's certificates come from.
enum Source {
    Files(Files),
    Acme(Arc<Acme>),
}

/// How a listener's certificate was obtained, for the console and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obtained {
    Files,
    /// From the ACME directory at this URL.
    Acme(String),
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
    /// The listener's TLS: 1.2 and 1.3, ALPN `http/1.1`, resumption by tickets. From files,
    /// refuses a pair that does not match or has expired; from ACME, serves the cached
    /// certificate if there is one (a restart orders nothing), and no handshake but the CA's
    /// validation until the first one is obtained.
    pub fn from_config(config: &TlsConfig, listener: &'static str) -> anyhow::Result<Arc<Tls>> {
        let (source, certificate) = match config.source() {
            CertificateSource::Files { cert, key } => {
                let files = Files::new(cert, key, config.watch_interval);
                let certificate = files.load(listener)?;
                (Source::Files(files), Some(certificate))
            }
            CertificateSource::Acme(acme) => {
                let acme = Acme::new(acme.clone(), listener)?;
                let cached = acme.cached();
                (Source::Acme(Arc::new(acme)), cached)
            }
        };
        match &certificate {
            Some(certificate) => {
                tracing::info!(
                    listener,
                    names = %certificate.about.names.join(","),
                    not_after = %humantime::format_rfc3339_seconds(certificate.about.not_after),
                    "TLS certificate loaded"
                );
                METRICS
                    .tls
                    .set_expiry(listener, certificate.about.not_after_unix());
            }
            None => tracing::info!(
                listener,
                "no TLS certificate yet: ordering one; handshakes are refused until it comes"
            ),
        }
        let challenges = match &source {
            Source::Acme(acme) => Some(acme.challenges.clone()),
            Source::Files(_) => None,
        };
        let store = Arc::new(CertificateStore {
            current: RwLock::new(certificate.map(Arc::new)),
            challenges: challenges.clone(),
        });
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS: the protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(store.clone());
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        if challenges.is_some() {
            server.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
        }
        // A sender that opens a connection per delivery resumes instead of a full handshake.
        server.ticketer = rustls::crypto::ring::Ticketer::new().context("TLS: session tickets")?;
        Ok(Arc::new(Tls {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(server)),
            store,
            source,
        }))
    }

    /// `webhook` or `admin`.
    pub fn listener(&self) -> &'static str {
        self.listener
    }

    /// The certificate served now (`None` until an ACME listener has its first one), and
    /// how it was obtained.
    pub fn about(&self) -> (Option<About>, Obtained) {
        let obtained = match &self.source {
            Source::Files(_) => Obtained::Files,
            Source::Acme(acme) => Obtained::Acme(acme.directory().to_owned()),
        };
        let about = self.store.current().map(|current| current.about.clone());
        (about, obtained)
    }

    /// Keeps the certificate current until `stop`: files read again when they change or on
    /// SIGHUP; ACME certificates ordered, renewed and retried.
    pub async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        match &self.source {
            Source::Files(files) => files.watch(&self.store, self.listener, stop).await,
            Source::Acme(acme) => acme.clone().maintain(&self.store, stop).await,
        }
    }

    /// Where the http-01 challenge must be answered, with the answers, for an ACME listener
    /// that validates that way.
    pub fn http_challenges(&self) -> Option<(SocketAddr, Arc<HttpChallenges>)> {
        match &self.source {
            Source::Acme(acme) if acme.challenge() == AcmeChallenge::Http01 => {
                Some((acme.http_listen(), acme.challenges.http.clone()))
            }
            _ => None,
        }
    }

    /// The TLS handshake on a new connection, all within `deadline` (the listener's
    /// `header_read_timeout`). A plain HTTP request gets a short `400` that says to use
    /// https; anything else that is not a handshake is closed, as is a CA's validation
    /// (TLS-ALPN-01) once done. `None`: the connection is done.
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
                    let answer = format!(
                        "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-type: \
                         text/plain; charset=utf-8\r\ncontent-length: {}\r\n\r\n\
                         {PLAIN_HTTP_REFUSAL}",
                        PLAIN_HTTP_REFUSAL.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
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
            Ok(Ok(stream)) if stream.get_ref().1.alpn_protocol() == Some(ACME_TLS_ALPN) => {
                return None;
            }
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

/// The config table of a listener's TLS.
fn table(listener: &'static str) -> &'static str {
    match listener {
        "admin" => "admin.tls",
        _ => "server.tls",
    }
}

/// Refuses a certificate unfit to serve now (expired, not yet valid).
fn fit(certificate: Certificate) -> anyhow::Result<Certificate> {
    match certificate.about.unfit(SystemTime::now()) {
        Some(problem) => Err(anyhow::anyhow!("the certificate is unfit: {problem}")),
        None => Ok(certificate),
    }
}

/// The certificate a listener serves, asked by rustls at each handshake.
struct CertificateStore {
    current: RwLock<Option<Arc<Certificate>>>,
    /// An ACME listener's challenges: TLS-ALPN-01 validations are answered here.
    challenges: Option<Arc<acme::Challenges>>,
}

impl CertificateStore {
    fn current(&self) -> Option<Arc<Certificate>> {
        self.current.read().expect("not poisoned").clone()
    }

    /// Serves `certificate` from the next handshake on.
    fn replace(&self, listener: &'static str, certificate: Certificate) {
        METRICS
            .tls
            .set_expiry(listener, certificate.about.not_after_unix());
        *self.current.write().expect("not poisoned") = Some(Arc::new(certificate));
    }
}

impl std::fmt::Debug for CertificateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateStore").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CertificateStore {
    /// The certificate, for a client that asks for a name it covers or for none (an IP
    /// address). A name it does not cover ends the handshake at once with an alert: the
    /// client hears that this is not the host it wants, rather than a certificate error. A
    /// CA's TLS-ALPN-01 validation gets the challenge's certificate for its name, if any.
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let validation = hello
            .alpn()
            .is_some_and(|mut offered| offered.any(|protocol| protocol == ACME_TLS_ALPN));
        if validation {
            return self.challenges.as_ref()?.tls_alpn(hello.server_name()?);
        }
        let current = self.current()?;
        match hello.server_name() {
            Some(name) if !current.about.covers(name) => None,
            _ => Some(current.key.clone()),
        }
    }
}
