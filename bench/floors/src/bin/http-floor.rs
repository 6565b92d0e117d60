//! The HTTP floor: a bare hyper 1 server that reads each POST body and answers a fixed body.
//!
//!     http-floor ADDR [CERT_PEM KEY_PEM]
//!
//! With a certificate and key it serves TLS 1.2 and 1.3 through bare rustls (ALPN http/1.1,
//! session tickets), as the receiver's own HTTPS does. Nothing else: no signature, no ledger, no
//! limits. It runs until killed.

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (address, tls) = match args.as_slice() {
        [address] => (address, None),
        [address, cert, key] => (address, Some(acceptor(cert, key)?)),
        _ => return Err("usage: http-floor ADDR [CERT_PEM KEY_PEM]".into()),
    };
    let listener = TcpListener::bind(address.as_str()).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve(stream).await,
                Some(tls) => {
                    if let Ok(stream) = tls.accept(stream).await {
                        serve(stream).await;
                    }
                }
            }
        });
    }
}

fn acceptor(cert: &str, key: &str) -> Result<TlsAcceptor, Error> {
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// One connection: every request's body read whole, then a fixed answer of the receiver's size
/// (`ok` for a request without a body, as the receiver's health check answers).
async fn serve<S>(stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(|request: Request<Incoming>| async move {
        let body = request.into_body().collect().await?.to_bytes();
        let answer = if body.is_empty() {
            Bytes::from_static(b"ok\n")
        } else {
            Bytes::from_static(b"{\"job_id\":\"floor\",\"duplicate\":false}")
        };
        Ok::<_, hyper::Error>(Response::new(Full::new(answer)))
    });
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}
