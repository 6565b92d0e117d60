//! A small HTTP/1 client (hyper-util's pooled client, http and https) with a deadline and a
//! bounded answer body.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client for `http://` and `https://` URLs; https trusts the system's CA certificates.
pub fn new_client() -> HttpClient {
    let tls = HttpsConnectorBuilder::new()
        .with_native_roots()
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "no system CA certificates found; https requests will fail");
            let empty = rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            HttpsConnectorBuilder::new().with_tls_config(empty)
        });
    Client::builder(TokioExecutor::new()).build(tls.https_or_http().enable_http1().build())
}

/// A completed exchange: the status, headers and the first `max_body` bytes of the answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// Sends `request` and reads the answer, all within `deadline`. The error says what went wrong.
pub async fn send(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    deadline: Duration,
    max_body: usize,
) -> Result<Answer, String> {
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("request failed: {e:#}"))?;
        let (parts, mut body) = response.into_parts();
        let mut kept = Vec::new();
        // Keep the head of the answer; past that, stop reading and let the connection go.
        while kept.len() < max_body {
            let Some(frame) = body.frame().await else {
                break;
            };
            let frame = frame.map_err(|e| format!("reading the answer failed: {e}"))?;
            if let Some(data) = frame.data_ref() {
                let room = max_body - kept.len();
                kept.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: Bytes::from(kept),
        })
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer within {}",
                humantime::format_duration(deadline)
            ))
        })
}
