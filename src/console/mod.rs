//! The operator's console on the admin listener: pages drawn by the server, a session cookie,
//! and the security a browser needs (Host allowlist, same-origin POSTs, a strict CSP).
//!
//! Every page works without JavaScript; `/console/api/...` answers the same data as JSON.
//! Read-only unless `[admin] console_actions` is on and the session is an operator's. At most
//! [`CONCURRENT_REQUESTS`] console requests run at once: the console never starves the
//! ledger of readers.

mod act;
mod assets;
mod charts;
mod fresh;
mod health;
mod http;
mod pages;
mod routes;
mod session;
mod settings;
mod show;
mod sign_in;
mod verdict;

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::Semaphore;

pub use crate::access::Role;
use crate::access::Tokens;
use crate::config::{Config, DEFAULT_DUE_JOB_LIMIT};
use crate::ledger::{DeadGroup, Ledger};
use crate::peer_throttle::PeerThrottle;
use crate::refusals::Refusals;
use crate::response::typed;
use crate::throttle::Throttled;
use crate::worker::Queues;
use fresh::Fresh;
pub use health::{HealthSource, ReceiverHealth};
pub use http::form_value;
use http::{page, read_form, redirect, same_origin, secure, text};
use pages::Viewer;
use session::{Cookie, Sessions};

/// Console requests doing ledger work at once; more wait their turn briefly, then get 503.
/// A slot is taken only once the request is signed in and its form read: a stranger's slow
/// connection never holds one.
pub const CONCURRENT_REQUESTS: usize = 4;
/// A form's body is small: a token, a reason.
const FORM_BYTES: usize = 8 * 1024;
/// A form is read before any slot is taken, under this deadline (a browser sends 8 KiB at
/// once); the connections that may be reading one are bounded by `server.max_connections`.
const FORM_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a request waits for a slot before its 503.
const SLOT_WAIT: Duration = Duration::from_secs(2);
/// CSP reports kept for `GET /console/api/csp-reports`, and how many of them one peer may
/// hold (a stranger cannot push out everyone else's).
const CSP_REPORTS_KEPT: usize = 64;
const CSP_REPORTS_PER_PEER: usize = 8;
const PAGE_LIMIT: usize = 50;
const MAX_PAGE_LIMIT: usize = 500;
const GROUPS_SHOWN: usize = 100;
/// How long the dead-letter groups are shown as computed (a group retry recomputes them).
const GROUPS_FRESH: Duration = Duration::from_secs(10);
/// How long the overview's ledger figures are shown as read: its script refreshes every 5 s,
/// and a backlog's counts read its index (a million claimed jobs during an outage).
const SNAPSHOT_FRESH: Duration = Duration::from_secs(5);

/// No script or style but the console's own files; no frames; forms post only here.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
     base-uri 'none'; report-uri /console/csp-report";

pub struct Console {
    pub ledger: Arc<Ledger>,
    pub refusals: Arc<Refusals>,
    pub queue: Queues,
    tokens: Arc<Tokens>,
    actions: bool,
    /// Host header values the console answers to (lowercase).
    hosts: Vec<String>,
    /// Those of [`Console::hosts`] reached over TLS at a proxy (`https://` in
    /// `allowed_hosts`): their cookies are `Secure`, their forms come from `https://`.
    tls_hosts: Vec<String>,
    /// The admin listener itself speaks TLS ([`crate::config::AdminConfig::has_tls`]): every
    /// cookie is `Secure`, every form's origin `https://`.
    served_over_tls: bool,
    sessions: Sessions,
    sign_ins: PeerThrottle,
    /// The reports kept, each with the peer that posted it.
    csp_reports: Mutex<VecDeque<(IpAddr, String)>>,
    busy: Semaphore,
    /// 503s for want of a slot, summed up in the log.
    busy_log: Mutex<Throttled>,
    /// The Config page's rows: for operators, and for readers (no handler arguments).
    settings: Vec<(String, String)>,
    reader_settings: Vec<(String, String)>,
    /// The HTTPS listeners, whose certificates the Config page shows as they are now.
    certificates: Vec<Arc<crate::tls::Tls>>,
    /// The dead-letter groups read every dead job: computed at most every [`GROUPS_FRESH`].
    groups: Fresh<Vec<DeadGroup>>,
    ledger_facts: Fresh<health::LedgerFacts>,
    health: Arc<dyn HealthSource>,
    /// The directory of a ledger file (none on PostgreSQL), absolute.
    ledger_dir: Option<std::path::PathBuf>,
    tolerance: Duration,
    /// `[admin] due_job_limit`: the verdict's limit on the oldest due job's wait.
    due_limit: Duration,
    /// `[tracing]`: a job's page shows its trace id, linked by `trace_url`.
    tracing: Option<crate::config::TracingConfig>,
    /// A span of each operator action.
    tracer: crate::traces::Tracer,
}

impl Console {
    /// Records a span of each operator action with `tracer`.
    pub fn traced_by(self, tracer: crate::traces::Tracer) -> Console {
        Console { tracer, ..self }
    }

    pub fn new(
        config: &Config,
        (ledger, queue, refusals): (Arc<Ledger>, Queues, Arc<Refusals>),
        health: Arc<dyn HealthSource>,
        (tokens, certificates): (Arc<Tokens>, Vec<Arc<crate::tls::Tls>>),
    ) -> Console {
        let admin = config.admin.as_ref();
        let listen = admin.map_or_else(
            || "127.0.0.1:8081".parse().expect("an address"),
            |a| a.listen,
        );
        let port = listen.port();
        let mut hosts = vec![
            listen.to_string(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        let mut tls_hosts = Vec::new();
        for host in admin
            .map(|a| a.allowed_hosts.as_slice())
            .unwrap_or_default()
        {
            let host = host.to_ascii_lowercase();
            // `https://name`: a TLS proxy in front answers to that name (its Host is the bare
            // name, or the name and the proxy's port).
            if let Some(name) = host.strip_prefix("https://") {
                tls_hosts.push(name.to_owned());
                hosts.push(name.to_owned());
                continue;
            }
            if !host.contains(':') || host.ends_with(']') {
                hosts.push(format!("{host}:{port}"));
            }
            hosts.push(host);
        }
        Console {
            tracing: config.tracing.clone(),
            tracer: crate::traces::Tracer::default(),
            settings: settings::settings(config, &ledger, Role::Operator),
            reader_settings: settings::settings(config, &ledger, Role::Reader),
            certificates,
            ledger: ledger.clone(),
            refusals,
            queue,
            tokens,
            actions: admin.is_some_and(|a| a.console_actions),
            hosts,
            tls_hosts,
            served_over_tls: admin.is_some_and(crate::config::AdminConfig::has_tls),
            sessions: Sessions::default(),
            sign_ins: PeerThrottle::new("console sign-in"),
            csp_reports: Mutex::new(VecDeque::new()),
            busy: Semaphore::new(CONCURRENT_REQUESTS),
            busy_log: Mutex::new(Throttled::new("the console is busy: a request got 503")),
            groups: Fresh::new(GROUPS_FRESH),
            ledger_facts: Fresh::new(SNAPSHOT_FRESH),
            health,
            ledger_dir: ledger_dir(&ledger),
            tolerance: config.signature.tolerance,
            due_limit: admin.map_or(DEFAULT_DUE_JOB_LIMIT, |a| a.due_job_limit),
        }
    }

    /// Whether `path` is the console's.
    pub fn owns(path: &str) -> bool {
        path == "/" || path == "/console" || path.starts_with("/console/")
    }

    pub async fn handle(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<Full<Bytes>> {
        let mut response = self.answer(request, peer).await;
        secure(response.headers_mut());
        response
    }

    /// Whether `host` is one this console answers to (DNS rebinding: another name pointing
    /// at this listener is not ours to answer).
    pub fn answers_to(&self, host: &str) -> bool {
        self.hosts.iter().any(|ours| ours == host)
    }

    /// The session cookie of a request to `host`: over TLS here, at a proxy named `https://`
    /// in `allowed_hosts`, or in plain HTTP (the forms' origin is `https://` but in the last).
    fn session_cookie(&self, host: &str) -> Cookie {
        if self.served_over_tls {
            Cookie::Host
        } else if self.tls_hosts.iter().any(|ours| ours == host) {
            Cookie::Secure
        } else {
            Cookie::Plain
        }
    }

    async fn answer(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|value| value.to_str().ok())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        if !self.answers_to(&host) {
            return text(
                StatusCode::MISDIRECTED_REQUEST,
                "this console does not answer to that Host name",
            );
        }
        let path = request.uri().path().to_owned();
        if path == "/" || path == "/console" {
            return redirect("/console/");
        }
        if let Some(asset) = assets::find(&path) {
            let mut response = typed(
                StatusCode::OK,
                Bytes::from_static(asset.content.as_bytes()),
                asset.content_type,
            );
            response.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=31536000, immutable"),
            );
            return response;
        }
        let method = request.method().clone();
        let jar = self.session_cookie(&host);
        let tls = jar != Cookie::Plain;
        if method == Method::POST && !same_origin(request.headers(), &host, tls) {
            return text(StatusCode::FORBIDDEN, "a form from another site: refused");
        }
        let session = jar.read(request.headers());
        let signed_in = session.as_deref().and_then(|id| self.sessions.session(id));
        // The doors open to strangers: none takes a slot, and the sign-in's throttle is
        // looked at before its form is read.
        match (&method, path.as_str()) {
            (&Method::POST, "/console/csp-report") => {
                return self.csp_report(request.into_body(), peer).await
            }
            (&Method::GET, "/console/sign-in") => {
                return page(
                    StatusCode::OK,
                    pages::layout("Sign in", None, false, pages::sign_in(None)),
                )
            }
            (&Method::POST, "/console/sign-in") => {
                return self.sign_in(request.into_body(), peer, jar).await
            }
            (&Method::POST, "/console/sign-out") => return self.sign_out(session.as_deref(), jar),
            _ => {}
        }
        let Some(who) = signed_in else {
            return if method == Method::GET || method == Method::HEAD {
                redirect("/console/sign-in")
            } else {
                text(StatusCode::UNAUTHORIZED, "sign in first")
            };
        };
        // A live session: its form is no stranger's to cut short at the connection limit.
        crate::connections::earned();
        let viewer = Viewer {
            role: who.role,
            name: who.name.clone(),
            may_act: self.actions && who.role == Role::Operator,
        };
        if (&method, path.as_str()) == (&Method::POST, "/console/sign-out-everywhere") {
            return self.sign_out_everywhere(&who, &viewer, jar);
        }
        // Who acts: a named token's name; the shared tokens know only where the request came
        // from.
        let by = match &who.name {
            Some(name) => format!("console:{name}"),
            None => format!("console:{}", peer.ip()),
        };
        let query = request.uri().query().unwrap_or("").to_owned();
        match method {
            Method::GET | Method::HEAD => {
                let Some(_slot) = self.slot().await else {
                    return self.busy();
                };
                self.show(viewer, &path, &query).await
            }
            Method::POST if !viewer.may_act => text(
                StatusCode::FORBIDDEN,
                "read-only: actions need [admin] console_actions = true and the operator token",
            ),
            Method::POST => {
                let form = match read_form(request.into_body()).await {
                    Ok(form) => form,
                    Err(response) => return *response,
                };
                let Some(_slot) = self.slot().await else {
                    return self.busy();
                };
                self.act(viewer, &path, &form, &by).await
            }
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET or POST"),
        }
    }

    /// A turn at the ledger work, waiting up to [`SLOT_WAIT`]; `None`: busy.
    async fn slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        tokio::time::timeout(SLOT_WAIT, self.busy.acquire())
            .await
            .ok()
            .map(|permit| permit.expect("never closed"))
    }

    /// The 503 for want of a slot, summed up in the log (one line, then one a minute).
    fn busy(&self) -> Response<Full<Bytes>> {
        self.busy_log
            .lock()
            .expect("not poisoned")
            .warn("every console slot stayed taken for 2 s");
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the console is busy; try again",
        )
    }
}

/// The directory holding the ledger's file, resolved to an absolute path; `None` where the
/// ledger is not a file (PostgreSQL).
fn ledger_dir(ledger: &Ledger) -> Option<std::path::PathBuf> {
    let file = std::fs::canonicalize(ledger.location()).ok()?;
    file.parent().map(std::path::Path::to_path_buf)
}
