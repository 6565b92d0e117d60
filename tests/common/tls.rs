//! Test certificates (a CA of the test's own, leaves for names) and a TLS client that tells which
//! certificate a server presented.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A CA that signs the test's certificates.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A certificate with its key, as PEM.
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sume test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A leaf for `names` (DNS names or IP addresses), valid from `from` to `until` seconds
    /// from now.
    pub fn leaf_valid(&self, names: &[&str], from: i64, until: i64) -> Pair {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::seconds(from);
        params.not_after = now + time::Duration::seconds(until);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap().pem();
        Pair {
            cert,
            key: key.serialize_pem(),
        }
    }

    /// A leaf for `127.0.0.1` and `localhost`, valid for 90 days.
    pub fn leaf(&self) -> Pair {
        self.leaf_valid(&["127.0.0.1", "localhost"], -60, 90 * 86_400)
    }
}

impl Pair {
    /// A TLS server's acceptor presenting this pair.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        use rustls::pki_types::PrivateKeyDer;
        let chain = vec![CertificateDer::from_pem_slice(self.cert.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(self.key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }

    /// Writes `cert.pem` and `key.pem` in `dir`, each by a rename over the old file (as
    /// certbot and cert-manager replace them).
    pub fn install(&self, dir: &Path) {
        for (name, text) in [("cert.pem", &self.cert), ("key.pem", &self.key)] {
            let temporary = dir.join(format!("{name}.tmp"));
            std::fs::write(&temporary, text).unwrap();
            std::fs::rename(&temporary, dir.join(name)).unwrap();
        }
    }

    /// The leaf's DER, to compare with what a server presented.
    pub fn der(&self) -> Vec<u8> {
        CertificateDer::from_pem_slice(self.cert.as_bytes())
            .unwrap()
            .to_vec()
    }
}

/// `[server.tls]` for the files [`Pair::install`] writes in `dir`.
pub fn server_tls(dir: &Path) -> String {
    format!(
        "[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nwatch_interval = \"100ms\"\n",
        dir.join("cert.pem").display(),
        dir.join("key.pem").display()
    )
}

/// A server with `[server.tls]` from a certificate of `ca` for 127.0.0.1 (in `dir`, with the CA
/// at `<dir>/ca.pem`, which the test server's client trusts).
pub async fn https_server(ca: &TestCa, extra: &str) -> super::TestServer {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    ca.leaf().install(dir.path());
    let tls = server_tls(dir.path());
    super::TestServer::start_in(dir, &format!("{extra}\n{tls}")).await
}

/// A TLS connection to `address` asking for `name`, trusting the CA in `ca_pem`.
pub async fn connect(
    address: SocketAddr,
    name: &str,
    ca_pem: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let connector = connector(ca_pem);
    let stream = TcpStream::connect(address).await?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), connector.connect(name, stream))
        .await
        .map_err(|_| std::io::Error::other("no handshake within 10 s"))?
}

/// A TLS client (HTTP/1.1) trusting the CA in `ca_pem`.
pub fn connector(ca_pem: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(certificate.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The leaf certificate `address` presents to a client asking for `name`.
pub async fn presented(address: SocketAddr, name: &str, ca_pem: &str) -> std::io::Result<Vec<u8>> {
    let stream = connect(address, name, ca_pem).await?;
    let (_, connection) = stream.get_ref();
    Ok(connection.peer_certificates().unwrap()[0].to_vec())
}

/// `GET /healthz` on an open connection (keep-alive); the status line of the answer.
pub async fn health_on(stream: &mut TlsStream<TcpStream>) -> String {
    // The Host a client of this address sends (the admin listener answers no other).
    let host = stream.get_ref().0.peer_addr().unwrap();
    stream
        .write_all(format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let read = stream.read(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer[..read]).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

/// Each request's target and `Authorization` header, as a downstream saw them.
pub type Seen = Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

/// A downstream HTTPS server that answers `200` to every request and keeps what it saw: the
/// request target and the `Authorization` header of each.
pub struct HttpsDownstream {
    pub address: SocketAddr,
    pub seen: Seen,
}

impl HttpsDownstream {
    pub async fn start(pair: &Pair) -> HttpsDownstream {
        let acceptor = pair.acceptor();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let kept = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, kept) = (acceptor.clone(), kept.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |request: hyper::Request<hyper::body::Incoming>| {
                            let authorization = request
                                .headers()
                                .get(hyper::header::AUTHORIZATION)
                                .map(|value| value.to_str().unwrap().to_owned());
                            kept.lock()
                                .unwrap()
                                .push((request.uri().to_string(), authorization));
                            async {
                                Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                                ))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        HttpsDownstream { address, seen }
    }
}
