//! HTTPS on a listener: rustls serving the current certificate, handshakes under a deadline.
//!
//! Each listener with a `[*.tls]` table has one [`Tls`]: a certificate store that rustls asks
//! at every handshake (so a new certificate is served from the next handshake on, and open
//! connections keep theirs), fed either by certificate files ([`reload`]) or by an ACME CA
//! ([`acme`]).

mod acme;
pub mod certificate;
mod challenges;
mod reload;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rustls::server::Acceptor;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{LazyConfigAcceptor, StartHandshake};
use tokio_util::sync::CancellationToken;

use crate::config::{AcmeChallenge, CertificateSource, Listener, TlsConfig};
use crate::metrics::METRICS;
pub use acme::cached_certificate;
use acme::Acme;
use certificate::{About, Certificate};
pub use challenges::HttpChallenges;
use challenges::ACME_TLS_ALPN;
use reload::Files;
use store::{is_validation, CertificateStore, Unserved};

/// The first byte of a TLS record that carries a handshake (a ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The answer to a plain HTTP request sent to an HTTPS port: a clear refusal, then close.
const PLAIN_HTTP_REFUSAL: &str = "This port speaks HTTPS: use an https:// URL\n";

/// What `/readyz` says while the webhook listener has no certificate to serve.
pub const NO_CERTIFICATE: &str = "the webhook listener has no TLS certificate yet: every HTTPS \
    handshake is refused until its ACME order succeeds (the journal says why it has not)";

/// HTTPS on one listener.
pub struct Tls {
    listener: Listener,
    server: Arc<rustls::ServerConfig>,
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
    /// No certificate fits the client's hello (the store said why).
    Unserved(Unserved),
    Failed,
}

impl Refused {
    /// The label of `sume_tls_handshakes_refused`.
    fn reason(self) -> &'static str {
        match self {
            Refused::Timeout => "timeout",
            Refused::PlainHttp => "plain_http",
            Refused::Unserved(unserved) => unserved.reason(),
            Refused::Failed => "failed",
        }
    }
}

impl Tls {
    /// The listener's TLS: 1.2 and 1.3, ALPN `http/1.1`, resumption by tickets. From files,
    /// serves `read_at_start` (the pair the start-up check read, [`Credentials`]), refused if
    /// it has expired; from ACME, serves the cached certificate if there is one (a restart
    /// orders nothing), and no handshake but the CA's validation until the first one is
    /// obtained.
    ///
    /// [`Credentials`]: crate::config::Credentials
    pub fn from_config(
        config: &TlsConfig,
        listener: Listener,
        read_at_start: Option<Certificate>,
    ) -> anyhow::Result<Arc<Tls>> {
        let (source, certificate) = match &config.source {
            CertificateSource::Files { cert, key } => {
                let files = Files::new(cert, key, config.watch_interval);
                let certificate = read_at_start
                    .context("its certificate files were not read at start")
                    .and_then(fit)
                    .with_context(|| format!("[{}]", listener.table()))?;
                (Source::Files(files), Some(certificate))
            }
            CertificateSource::Acme(acme) => {
                let acme = Acme::new(acme.clone(), listener);
                acme.make_cache_dir()?;
                let cached = acme.cached();
                (Source::Acme(Arc::new(acme)), cached)
            }
        };
        match &certificate {
            Some(certificate) => tracing::info!(
                %listener,
                names = %certificate.about.names.join(","),
                not_after = %humantime::format_rfc3339_seconds(certificate.about.not_after),
                "TLS certificate loaded"
            ),
            None => tracing::info!(
                %listener,
                "no TLS certificate yet: ordering one; handshakes are refused until it comes"
            ),
        }
        let challenges = match &source {
            Source::Acme(acme) => Some(acme.challenges.clone()),
            Source::Files(_) => None,
        };
        let validates = challenges.is_some();
        let store = Arc::new(CertificateStore::new(listener, certificate, challenges));
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS: the protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(store.clone());
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        if validates {
            server.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
        }
        // A sender that opens a connection per delivery resumes instead of a full handshake.
        server.ticketer = rustls::crypto::ring::Ticketer::new().context("TLS: session tickets")?;
        Ok(Arc::new(Tls {
            listener,
            server: Arc::new(server),
            store,
            source,
        }))
    }

    pub fn listener(&self) -> Listener {
        self.listener
    }

    /// Whether the listener has a certificate to serve (an ACME listener has none until its
    /// first order succeeds).
    pub fn has_certificate(&self) -> bool {
        self.store.current().is_some()
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
    /// (TLS-ALPN-01) once done; a hello no certificate fits hears why in an alert. `None`: the
    /// connection is done.
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
            let start = LazyConfigAcceptor::new(Acceptor::default(), stream)
                .await
                .map_err(|_| Refused::Failed)?;
            let hello = start.client_hello();
            let chosen = self
                .store
                .choose(hello.server_name(), is_validation(hello.alpn()));
            if let Err(unserved) = chosen {
                refuse(start, unserved).await;
                return Err(Refused::Unserved(unserved));
            }
            start
                .into_stream(self.server.clone())
                .await
                .map_err(|_| Refused::Failed)
        };
        let refused = match tokio::time::timeout(deadline, attempt).await {
            Ok(Ok(stream)) if stream.get_ref().1.alpn_protocol() == Some(ACME_TLS_ALPN) => {
                return None;
            }
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(refused)) => refused,
            Err(_) => Refused::Timeout,
        };
        METRICS
            .tls
            .record_handshake_refused(self.listener, refused.reason());
        None
    }
}

/// Ends a handshake no certificate fits with the store's alert, as a TLS record in the clear
/// (the hello was not answered: nothing is encrypted yet), then closes.
async fn refuse(start: StartHandshake<TcpStream>, unserved: Unserved) {
    // Content type 21 (alert), version 3.3 (TLS 1.2's, which TLS 1.3 keeps on its records),
    // length 2, level 2 (fatal), then the description.
    let record = [21, 3, 3, 0, 2, 2, unserved.alert()];
    let mut stream = start.io;
    let _ = stream.write_all(&record).await;
    let _ = stream.shutdown().await;
}

/// SIGHUP (`systemctl reload`), for a task that acts on it.
struct Hangups(Option<Signal>);

impl Hangups {
    /// Without a handler (it could not be installed), `without` says what is lost.
    fn new(without: &str) -> Hangups {
        Hangups(
            signal(SignalKind::hangup())
                .inspect_err(|error| tracing::warn!(%error, "cannot handle SIGHUP: {without}"))
                .ok(),
        )
    }

    /// Resolves at the next SIGHUP; never, without a handler.
    async fn next(&mut self) {
        let received = match self.0.as_mut() {
            Some(hangups) => hangups.recv().await,
            None => None,
        };
        if received.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

/// Refuses a certificate unfit to serve now (expired, not yet valid).
fn fit(certificate: Certificate) -> anyhow::Result<Certificate> {
    match certificate.about.unfit(SystemTime::now()) {
        Some(problem) => Err(anyhow::anyhow!("the certificate is unfit: {problem}")),
        None => Ok(certificate),
    }
}
