//! The HTTP server: accept loop, hardened hyper settings, routing, graceful shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::ingest::{json_response, Ingest};
use crate::ledger::Ledger;
use crate::metrics::METRICS;
use crate::throttle::Throttled;

/// The pause after a failed accept (no file descriptors left, typically).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Paths the server answers itself; the webhook path may not take one of them.
pub const RESERVED_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics"];

/// What every connection shares.
pub struct App {
    pub webhook_path: String,
    pub ingest: Ingest,
    pub ledger: Arc<Ledger>,
    /// `[server] expose_metrics`: `/metrics` on the public listener too.
    pub expose_metrics: bool,
}

/// Answers the requests of one listener.
pub trait Router: Send + Sync + 'static {
    fn route(
        &self,
        request: Request<Incoming>,
    ) -> impl std::future::Future<Output = Response<Full<Bytes>>> + Send;
}

impl Router for App {
    async fn route(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path();
        if path == self.webhook_path {
            return if request.method() == Method::POST {
                self.ingest.handle(request).await
            } else {
                let mut response = error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST");
                response
                    .headers_mut()
                    .insert(ALLOW, HeaderValue::from_static("POST"));
                response
            };
        }
        if path == "/metrics" && !self.expose_metrics {
            return error_response(StatusCode::NOT_FOUND, "not found");
        }
        match operational(&self.ledger, &request).await {
            Some(response) => response,
            None => error_response(StatusCode::NOT_FOUND, "not found"),
        }
    }
}

/// `/healthz`, `/readyz` and `/metrics`: served on the public listener and on the admin one.
/// `None` when the request is for none of them.
pub async fn operational(
    ledger: &Ledger,
    request: &Request<Incoming>,
) -> Option<Response<Full<Bytes>>> {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    Some(match (read, request.uri().path()) {
        // Liveness: the process answers.
        (true, "/healthz") => json_response(StatusCode::OK, &serde_json::json!({ "status": "ok" })),
        // Readiness: a delivery sent now would be claimed.
        (true, "/readyz") => match ledger.readiness() {
            Ok(()) => json_response(StatusCode::OK, &serde_json::json!({ "status": "ready" })),
            Err(reason) => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({ "status": "not ready", "reason": reason }),
            ),
        },
        (true, "/metrics") => metrics(ledger).await,
        _ => return None,
    })
}

async fn metrics(ledger: &Ledger) -> Response<Full<Bytes>> {
    match ledger.metrics_snapshot().await {
        Ok(snapshot) => {
            let mut response = Response::new(Full::new(Bytes::from(METRICS.render(&snapshot))));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        Err(error) => error_response(StatusCode::SERVICE_UNAVAILABLE, &error.to_string()),
    }
}

pub fn error_response(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json_response(status, &serde_json::json!({ "error": message }))
}

/// Serves until `shutdown`, then stops accepting and gives open connections `grace` to finish.
pub async fn serve<R: Router>(
    listener: TcpListener,
    app: Arc<R>,
    config: &ServerConfig,
    shutdown: CancellationToken,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .max_headers(config.max_headers)
        .max_buf_size(config.max_header_bytes)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    // One permit per open connection: at the limit we stop accepting, and new connections wait
    // in the kernel's backlog (or are refused when it is full) instead of becoming tasks.
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let mut accept_failures = Throttled::new("accept failed; backing off");
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => permit.expect("never closed"),
            () = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    accept_failures.warn(&error.to_string());
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        accept_failures.recovered();
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = service_fn(move |request| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(app.route(request).await) }
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(config.shutdown_grace) => {
            tracing::warn!("connections still open after the shutdown grace; closing them");
        }
    }
}
