//! A small HTTP/1 client (hyper-util's pooled client, http and https) with a deadline and a
//! bounded answer body.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::tls::certificate::add_ca_file;

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

/// A client whose https trusts the system's CA certificates and those in `ca_file` (PEM): a
/// private CA's. Certificates are always verified.
pub fn client_trusting(ca_file: Option<&Path>) -> anyhow::Result<HttpClient> {
    match ca_file {
        None => Ok(new_client()),
        Some(_) => Ok(Client::builder(TokioExecutor::new()).build(connector_trusting(ca_file)?)),
    }
}

/// The connector of [`client_trusting`], for a client with another body type.
pub fn connector_trusting(ca_file: Option<&Path>) -> anyhow::Result<HttpsConnector<HttpConnector>> {
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates leave the CA file's alone, which may be all it needs.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(ca_file) = ca_file {
        add_ca_file(&mut roots, ca_file)?;
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build())
}

/// A completed exchange: the status, headers and the first `max_body` bytes of the answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// Why an exchange failed: the handler's hold tells a downstream that is not there from one
/// that answered badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (refused, unreachable, no such host).
    #[error("{0}")]
    Unreachable(String),
    /// No whole answer within the deadline.
    #[error("{0}")]
    TimedOut(String),
    #[error("{0}")]
    Failed(String),
}

/// Sends `request` and reads the answer, all within `deadline`. The error says what went wrong.
pub async fn send(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    deadline: Duration,
    max_body: usize,
) -> Result<Answer, SendError> {
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            // hyper-util's error says only "client error (Connect)": the cause (refused, no
            // such host, a certificate not trusted) is in its sources.
            let mut text = format!("request failed: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            if e.is_connect() {
                SendError::Unreachable(text)
            } else {
                SendError::Failed(text)
            }
        })?;
        let (parts, mut body) = response.into_parts();
        let mut kept = Vec::new();
        // Keep the head of the answer; past that, stop reading and let the connection go.
        while kept.len() < max_body {
            let Some(frame) = body.frame().await else {
                break;
            };
            let frame =
                frame.map_err(|e| SendError::Failed(format!("reading the answer failed: {e}")))?;
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
            Err(SendError::TimedOut(format!(
                "no answer within {}",
                humantime::format_duration(deadline)
            )))
        })
}

/// An answer's `Retry-After`: delay-seconds or an HTTP-date (RFC 9110, 10.2.3), as a wait
/// from `now`; a date in the past is no wait. `None` when absent or unreadable.
pub fn retry_after(headers: &hyper::HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let text = headers
        .get(hyper::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn headers(value: &str) -> hyper::HeaderMap {
        let mut headers = hyper::HeaderMap::new();
        headers.insert(hyper::header::RETRY_AFTER, value.parse().unwrap());
        headers
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(
            retry_after(&headers(" 120 "), now),
            Some(Duration::from_secs(120))
        );
        let date = headers("Wed, 21 Oct 2015 07:28:30 GMT");
        assert_eq!(retry_after(&date, now), Some(Duration::from_secs(30)));
        let past = headers("Wed, 21 Oct 2015 07:27:00 GMT");
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&hyper::HeaderMap::new(), now), None);
    }
}
