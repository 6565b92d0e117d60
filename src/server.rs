//! The HTTP server: accept loop, hardened hyper settings, routing, graceful shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::connections::{Ask, Open, Room};
use crate::ingest::Ingest;
use crate::ledger::{now_ms, Hold, Ledger, StorageError};
use crate::metrics::{FilesystemSpace, Scrape, METRICS};
use crate::response::{error_response, json_response, typed};
use crate::throttle::Throttled;
use crate::tls::{HttpChallenges, Tls, NO_CERTIFICATE};
use crate::worker::{Queue, Queues};

/// How long a scrape of `/metrics` waits for the ledger.
const LEDGER_READ_PER_SCRAPE: Duration = Duration::from_secs(5);
/// Connections the kernel queues for the accept loop (capped by `net.core.somaxconn`, 4096
/// since Linux 5.4). Above tokio's 1024: at the default `max_connections`, strangers cut off or
/// shed together reconnect together, and a queue of 1024 dropped a real sender's SYN among
/// them (its retry comes a second later).
const LISTEN_BACKLOG: u32 = 4096;
/// The pause after a failed accept that nothing could make room for.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The pause after shedding a connection to free its descriptor: long enough for its task to
/// run and close it.
const SHED_PAUSE: Duration = Duration::from_millis(1);

/// What every connection shares.
pub struct App {
    pub webhook_path: String,
    pub ingest: Ingest,
    pub ledger: Arc<Ledger>,
    /// `[server] expose_metrics`: `/metrics` on the public listener too.
    pub expose_metrics: bool,
    /// This listener's TLS, whose certificate a delivery needs.
    pub tls: Option<Arc<Tls>>,
}

/// Answers the requests of one listener.
pub trait Router: Send + Sync + 'static {
    /// `peer`: the address the connection came from (behind a proxy, the proxy's).
    fn route(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl std::future::Future<Output = Response<Full<Bytes>>> + Send;
}

impl Router for App {
    async fn route(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
        let path = request.uri().path();
        if path == self.webhook_path {
            return if request.method() == Method::POST {
                self.ingest.handle(request, peer).await
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
        // Boxed: the operational pages' future is larger than a delivery's, and would size
        // (and every delivery copy) this one.
        let webhook_tls = self.tls.as_deref();
        let answer = operational(&self.ledger, self.ingest.queue(), webhook_tls, &request);
        match Box::pin(answer).await {
            Some(response) => response,
            None => error_response(StatusCode::NOT_FOUND, "not found"),
        }
    }
}

/// The http-01 listener of an ACME certificate: the open challenges' answers, nothing else.
impl Router for HttpChallenges {
    async fn route(&self, request: Request<Incoming>, _peer: SocketAddr) -> Response<Full<Bytes>> {
        match self.answer(request.uri().path()) {
            Some(answer) if request.method() == Method::GET => {
                typed(StatusCode::OK, answer, "application/octet-stream")
            }
            _ => error_response(StatusCode::NOT_FOUND, "not found"),
        }
    }
}

/// Whether `path` is one of [`operational`]'s.
pub fn is_operational(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// Whether a delivery sent now would be claimed: the webhook listener has a certificate to
/// finish its handshake with (`webhook_tls`, if it speaks TLS), and the ledger takes claims.
pub fn readiness(ledger: &Ledger, webhook_tls: Option<&Tls>) -> Result<(), &'static str> {
    if webhook_tls.is_some_and(|tls| !tls.has_certificate()) {
        return Err(NO_CERTIFICATE);
    }
    ledger.readiness()
}

/// A route's hold as `/readyz` shows it.
fn hold_json(hold: &Hold) -> serde_json::Value {
    serde_json::json!({
        "since": hold.since,
        "reason": hold.reason,
        "next_probe_at": hold.next_probe_at,
        "note": "the route's downstream looks down: deliveries are claimed and wait; one probe at a time",
    })
}

/// `/healthz`, `/readyz` and `/metrics`: served on the public listener and on the admin one.
/// `None` when the request is for none of them.
pub async fn operational(
    ledger: &Ledger,
    queue: &Queues,
    webhook_tls: Option<&Tls>,
    request: &Request<Incoming>,
) -> Option<Response<Full<Bytes>>> {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    Some(match (read, request.uri().path()) {
        // Liveness: the process answers.
        (true, "/healthz") => json_response(StatusCode::OK, &serde_json::json!({ "status": "ok" })),
        // Readiness: a delivery sent now would be claimed.
        // Paused dispatch is still ready: deliveries are claimed; the body says so (as this
        // process knows it: no ledger read for a request anyone may send).
        (true, "/readyz") => {
            // A hold is still ready too: deliveries are claimed, and wait for the downstream.
            let holds = queue.holds();
            let in_force = queue.in_force();
            let routes = in_force.names().count();
            let dispatch = match routes {
                0 => "no handler",
                _ if queue.dispatch_paused() => "paused",
                _ if holds.len() == routes => "held",
                _ => "running",
            };
            // A round trip at most once a second, shared by every request (PostgreSQL).
            ledger.prove_readiness().await;
            let mut body = match readiness(ledger, webhook_tls) {
                Ok(()) => serde_json::json!({ "status": "ready", "dispatch": dispatch }),
                Err(reason) => {
                    serde_json::json!({ "status": "not ready", "reason": reason, "dispatch": dispatch })
                }
            };
            // Each route's dispatch: a route held waits alone, the others run.
            if routes > 0 {
                let mut by_route = serde_json::Map::new();
                for route in in_force.names() {
                    let hold = holds.iter().find(|hold| hold.route == route.as_str());
                    let paused = in_force
                        .route(route.as_str())
                        .is_some_and(Queue::dispatch_paused);
                    let mut state = serde_json::json!({ "dispatch": match hold {
                        _ if paused => "paused",
                        Some(_) => "held",
                        None => "running",
                    }});
                    if let Some(hold) = hold {
                        state["hold"] = hold_json(hold);
                    }
                    by_route.insert(route.to_string(), state);
                }
                body["routes"] = serde_json::Value::Object(by_route);
            }
            // Kept in the ledger for a route taken out of the config: it runs when it comes back.
            let not_run = queue.work_not_run();
            if !not_run.is_empty() {
                body["not_in_config"] = not_run
                    .into_iter()
                    .map(|(route, waiting)| (route, serde_json::json!({ "waiting": waiting })))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
            }
            if let Some(hold) = holds.first().filter(|_| routes == 1) {
                body["hold"] = hold_json(hold);
            }
            // Apart from the status: a load balancer keeps sending deliveries, which are claimed.
            if let Some(work_side) = ledger.work_side() {
                let state = work_side.state();
                body["work_side"] = serde_json::json!({
                    "can_write": state.can_write,
                    "since": humantime::format_rfc3339_seconds(state.since).to_string(),
                });
            }
            let status = if body["status"] == "ready" {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json_response(status, &body)
        }
        (true, "/metrics") => metrics(ledger, queue, webhook_tls).await,
        _ => return None,
    })
}

async fn metrics(
    ledger: &Ledger,
    queue: &Queues,
    webhook_tls: Option<&Tls>,
) -> Response<Full<Bytes>> {
    let now = now_ms();
    // Bounded: a scrape that outlasts Prometheus's timeout would read as the receiver down, not
    // as its ledger unreachable. Served either way, with the ledger's gauges as last read.
    // Readiness as of this scrape, not as of the last claim.
    ledger.prove_readiness().await;
    let read = tokio::time::timeout(LEDGER_READ_PER_SCRAPE, async {
        let snapshot = ledger.metrics_snapshot().await?;
        let next_due = ledger.next_due_at().await?;
        Ok::<_, StorageError>((snapshot, next_due))
    })
    .await;
    let (snapshot, next_due) = match read {
        Ok(Ok((snapshot, next_due))) => {
            queue.note_work(&snapshot.work);
            (Some(snapshot), next_due)
        }
        _ => (None, None),
    };
    let scrape = Scrape {
        ledger: snapshot,
        oldest_due_wait_seconds: next_due.map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0),
        ready: readiness(ledger, webhook_tls).is_ok(),
        filesystem: match ledger {
            Ledger::Sqlite(_) => {
                let file = std::path::PathBuf::from(ledger.location());
                // A bare file name is in the working directory.
                FilesystemSpace::of(&file.with_file_name("").join("."))
            }
            Ledger::Postgres(_) => None,
        },
    };
    typed(
        StatusCode::OK,
        METRICS.render(&scrape),
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
    )
}

/// A slot at the connection limit: the first to end, or the oldest sheddable connection's once
/// it is past its grace. `None` on shutdown.
async fn room(
    open: &Open,
    connections: &Arc<Semaphore>,
    shutdown: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    loop {
        let look_again = match open.shed_oldest() {
            // The slot is the one that connection's task gives back: wait for it alone.
            Room::Made => {
                METRICS.record_connection_shed();
                None
            }
            Room::At(at) => Some(at),
        };
        let look_again = async {
            match look_again {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            permit = connections.clone().acquire_owned() => return Some(permit.expect("never closed")),
            () = look_again => {}
            () = shutdown.cancelled() => return None,
        }
    }
}

/// A listener on `address` with a backlog of [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as
/// tokio's own `bind` sets it: a restart binds while the old connections linger).
pub fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

fn is_out_of_descriptors(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Serves until `shutdown`, then stops accepting, lets each open connection finish the request
/// it is in (one waiting for a request closes at once), and closes what is left after `grace`.
/// With `tls`, each connection's handshake comes first, under `header_read_timeout`, holding
/// its connection slot as a connection waiting for a head does (and shed like one).
pub async fn serve<R: Router>(
    listener: TcpListener,
    app: Arc<R>,
    config: &ServerConfig,
    tls: Option<Arc<Tls>>,
    shutdown: CancellationToken,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .max_headers(config.max_headers)
        .max_buf_size(config.max_header_bytes)
        .keep_alive(true);
    // One permit per open connection. At the limit, a new connection takes the place of the
    // one that has been sheddable longest (a slow or idle client, or a body nobody vouched
    // for; see `connections.rs`); with every connection vouched for, it waits for one to end,
    // and further ones wait in the kernel's backlog (or are refused when it is full) instead
    // of becoming tasks.
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let open = Arc::new(Open::new(config.max_connections));
    let mut accept_failures = Throttled::new("accept failed; backing off");
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    accept_failures.warn(&error.to_string());
                    // Out of file descriptors (a hard limit below max_connections): the
                    // connection sheddable longest makes room, as at the connection limit.
                    // Anything else: back off instead of spinning.
                    if is_out_of_descriptors(&error) && matches!(open.shed_oldest(), Room::Made) {
                        METRICS.record_connection_shed();
                        tokio::time::sleep(SHED_PAUSE).await;
                    } else {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        accept_failures.recovered();
        let permit = match connections.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => match room(&open, &connections, &shutdown).await {
                Some(permit) => permit,
                None => break,
            },
        };
        let _ = stream.set_nodelay(true);
        let (id, tracked, pushed_out) = open.register(peer.ip());
        if pushed_out {
            METRICS.record_connection_shed();
        }
        let app = app.clone();
        let service = service_fn({
            let tracked = tracked.clone();
            move |request: Request<Incoming>| {
                let (app, tracked) = (app.clone(), tracked.clone());
                async move {
                    let response = tracked.route(app.route(request, peer)).await;
                    Ok::<_, Infallible>(response)
                }
            }
        });
        let open = open.clone();
        let Some(tls) = &tls else {
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::spawn(async move {
                if let Err(error) = tracked.serve(connection).await {
                    tracing::debug!(%error, "connection ended with an error");
                }
                open.unregister(id);
                drop(permit);
            });
            continue;
        };
        let (tls, builder) = (tls.clone(), builder.clone());
        let handshake_deadline = config.header_read_timeout;
        tokio::spawn(async move {
            let handshake = tracked.unless_asked(tls.handshake(stream, handshake_deadline));
            if let Some(Some(stream)) = handshake.await {
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                if let Err(error) = tracked.serve(connection).await {
                    tracing::debug!(%error, "connection ended with an error");
                }
            }
            open.unregister(id);
            drop(permit);
        });
    }
    drop(listener);
    // Every permit back means every connection closed.
    open.ask_all(Ask::Drain);
    let all = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = connections.acquire_many(all) => {}
        () = tokio::time::sleep(config.shutdown_grace) => {
            tracing::warn!("connections still open after the shutdown grace; closing them");
            open.ask_all(Ask::Close);
        }
    }
}
