//! A small HTTP/1 client (hyper-util's pooled client, http and https): each answer within a
//! deadline and a size, for the handler, Sume's API and the ACME account.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use instant_acme::{BodyWrapper, BytesResponse};

use crate::tls::certificate::add_ca_file;

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How long an idle connection is kept for reuse: under the 5 s after which common servers
/// (Node.js, Apache, and this receiver's own `header_read_timeout`) close an idle keep-alive
/// connection. A request sent on a connection the server is closing at that moment fails with
/// "connection closed before message completed", having been sent: no retry can tell whether
/// it was taken.
const POOL_IDLE: Duration = Duration::from_secs(4);

fn client_builder() -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.pool_idle_timeout(POOL_IDLE);
    builder
}

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
    client_builder().build(tls.https_or_http().enable_http1().build())
}

/// A client whose https trusts the system's CA certificates and those in `ca_file` (PEM): a
/// private CA's. Certificates are always verified.
pub fn client_trusting(ca_file: Option<&Path>) -> anyhow::Result<HttpClient> {
    match ca_file {
        None => Ok(new_client()),
        Some(_) => Ok(client_builder().build(connector_trusting(ca_file)?)),
    }
}

/// The connector of [`client_trusting`], for a client with another body type.
fn connector_trusting(ca_file: Option<&Path>) -> anyhow::Result<HttpsConnector<HttpConnector>> {
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
    /// Why the body ended before its end, if it did: the connection broke, or closed without
    /// TLS's close_notify (as Python's `http.server` over `ssl` does). The status stands, as
    /// curl and urllib judge it; only the body may be short.
    pub cut: Option<String>,
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

/// How an answer's body went on past the head [`read_head`] kept.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rest {
    /// The head is the whole body.
    None,
    /// More than the head: not read.
    Unread,
    /// It broke off, saying why.
    Cut(String),
}

/// The first `max` bytes of `body`; past them it is not read, and the connection goes with it.
async fn read_head<B>(mut body: B, max: usize) -> (Vec<u8>, Rest)
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error,
{
    let mut kept = Vec::new();
    loop {
        let Some(frame) = body.frame().await else {
            return (kept, Rest::None);
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => return (kept, Rest::Cut(with_causes(&error))),
        };
        if let Some(data) = frame.data_ref() {
            let room = max - kept.len();
            if data.len() > room {
                kept.extend_from_slice(&data[..room]);
                return (kept, Rest::Unread);
            }
            kept.extend_from_slice(data);
        }
    }
}

/// An error with its sources: hyper's own text is only the outermost ("client error
/// (Connect)", "error reading a body from connection"), the cause is in its sources.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
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
            let text = format!("request failed: {}", with_causes(&e));
            if e.is_connect() {
                SendError::Unreachable(text)
            } else {
                SendError::Failed(text)
            }
        })?;
        let (parts, body) = response.into_parts();
        let (kept, rest) = read_head(body, max_body).await;
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: Bytes::from(kept),
            cut: match rest {
                Rest::Cut(why) => Some(why),
                Rest::None | Rest::Unread => None,
            },
        })
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .unwrap_or_else(|_| Err(timed_out(deadline)))
}

fn timed_out(deadline: Duration) -> SendError {
    SendError::TimedOut(format!(
        "no answer within {}",
        humantime::format_duration(deadline)
    ))
}

/// The largest ACME answer read: a directory, an order or a certificate chain is a few KiB.
pub const ACME_MAX_ANSWER: usize = 1024 * 1024;
/// The longest one ACME exchange may take, its whole answer read.
pub const ACME_DEADLINE: Duration = Duration::from_secs(30);

/// The HTTP client an ACME account uses (instant-acme's `Account::builder_with_http`): each
/// answer whole within [`ACME_DEADLINE`] and [`ACME_MAX_ANSWER`] bytes, or an error that says
/// which. instant-acme's own client reads an answer to its end however long it is.
pub struct AcmeClient {
    client: Client<HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>,
    deadline: Duration,
}

impl AcmeClient {
    /// Trusting the system's CA certificates and those in `ca_file`, as [`client_trusting`].
    pub fn trusting(ca_file: Option<&Path>) -> anyhow::Result<AcmeClient> {
        Ok(AcmeClient {
            client: client_builder().build(connector_trusting(ca_file)?),
            deadline: ACME_DEADLINE,
        })
    }
}

impl instant_acme::HttpClient for AcmeClient {
    fn request(
        &self,
        request: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let (response, deadline) = (self.client.request(request), self.deadline);
        Box::pin(async move {
            let exchange = async {
                let (parts, body) = response
                    .await
                    .map_err(|e| format!("request failed: {}", with_causes(&e)))?
                    .into_parts();
                match read_head(body, ACME_MAX_ANSWER).await {
                    (kept, Rest::None) => Ok(BytesResponse {
                        parts,
                        body: Box::new(Bytes::from(kept)),
                    }),
                    (_, Rest::Unread) => Err(format!(
                        "the answer ({}) is longer than {} KiB",
                        parts.status,
                        ACME_MAX_ANSWER / 1024
                    )),
                    // A chain cut between two certificates would still parse: not taken.
                    (_, Rest::Cut(why)) => {
                        Err(format!("the answer ({}) broke off: {why}", parts.status))
                    }
                }
            };
            let answer = tokio::time::timeout(deadline, exchange)
                .await
                .unwrap_or_else(|_| Err(timed_out(deadline).to_string()));
            answer.map_err(|text| instant_acme::Error::Other(text.into()))
        })
    }
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

    /// A server of its own on 127.0.0.1 that answers 200 and then a byte of body every 50 ms
    /// until its client goes away.
    async fn dripping_server() -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let mut sent = stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n{").await;
            while sent.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                sent = stream.write_all(b" ").await;
            }
        });
        address
    }

    #[tokio::test]
    async fn an_acme_answer_slower_than_the_deadline_fails_saying_so() {
        use instant_acme::HttpClient as _;
        let address = dripping_server().await;
        let client = AcmeClient {
            deadline: Duration::from_millis(300),
            ..AcmeClient::trusting(None).unwrap()
        };
        let request = Request::get(format!("http://{address}/directory"))
            .body(BodyWrapper::default())
            .unwrap();
        let started = std::time::Instant::now();
        let Err(error) = client.request(request).await else {
            panic!("a dripping answer was taken");
        };
        assert_eq!(error.to_string(), "no answer within 300ms");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
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
