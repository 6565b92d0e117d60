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
mod session;
mod settings;
mod show;
mod verdict;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::Semaphore;

use crate::config::{Config, Secret, TokenRole, DEFAULT_DUE_JOB_LIMIT};
use crate::ledger::{DeadGroup, Ledger};
use crate::refusals::Refusals;
use crate::worker::Queue;
use fresh::Fresh;
pub use health::{HealthSource, ReceiverHealth};
pub use http::form_value;
use http::{cookie, page, read_form, redirect, same_origin, secure, text};
use pages::Viewer;
pub use session::Role;
use session::Sessions;

/// Console requests served at once; more wait their turn briefly, then get 503.
pub const CONCURRENT_REQUESTS: usize = 4;
/// A form's body is small: a token, a reason.
const FORM_BYTES: usize = 8 * 1024;
const FORM_READ_TIMEOUT: Duration = Duration::from_secs(5);
const COOKIE: &str = "sume_console";
/// CSP reports kept for `GET /console/api/csp-reports`.
const CSP_REPORTS_KEPT: usize = 64;
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
    pub queue: Option<Queue>,
    operator_token: Secret,
    read_token: Option<Secret>,
    /// `[[admin.tokens]]`: name, role, token.
    named_tokens: Vec<(String, TokenRole, Secret)>,
    actions: bool,
    /// Host header values the console answers to (lowercase).
    hosts: Vec<String>,
    sessions: Sessions,
    csp_reports: Mutex<VecDeque<String>>,
    busy: Semaphore,
    settings: Vec<(String, String)>,
    /// The dead-letter groups read every dead job: computed at most every [`GROUPS_FRESH`].
    groups: Fresh<Vec<DeadGroup>>,
    ledger_facts: Fresh<health::LedgerFacts>,
    health: Arc<dyn HealthSource>,
    /// The directory of a ledger file (none on PostgreSQL), absolute.
    ledger_dir: Option<std::path::PathBuf>,
    tolerance: Duration,
    /// `[admin] due_job_limit`: the verdict's limit on the oldest due job's wait.
    due_limit: Duration,
}

impl Console {
    pub fn new(
        config: &Config,
        (ledger, queue, refusals): (Arc<Ledger>, Option<Queue>, Arc<Refusals>),
        health: Arc<dyn HealthSource>,
        operator_token: Secret,
        read_token: Option<Secret>,
        named_tokens: Vec<(String, TokenRole, Secret)>,
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
        for host in admin
            .map(|a| a.allowed_hosts.as_slice())
            .unwrap_or_default()
        {
            let host = host.to_ascii_lowercase();
            if !host.contains(':') || host.ends_with(']') {
                hosts.push(format!("{host}:{port}"));
            }
            hosts.push(host);
        }
        Console {
            settings: settings::settings(config, &ledger),
            ledger: ledger.clone(),
            refusals,
            queue,
            operator_token,
            read_token,
            named_tokens,
            actions: admin.is_some_and(|a| a.console_actions),
            hosts,
            sessions: Sessions::default(),
            csp_reports: Mutex::new(VecDeque::new()),
            busy: Semaphore::new(CONCURRENT_REQUESTS),
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

    async fn answer(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|value| value.to_str().ok())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        if !self.hosts.contains(&host) {
            // Another name pointing at this listener (DNS rebinding): not ours to answer.
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
            let mut response =
                Response::new(Full::new(Bytes::from_static(asset.content.as_bytes())));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            );
            headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=31536000, immutable"),
            );
            return response;
        }
        let method = request.method().clone();
        if method == Method::POST && !same_origin(request.headers(), &host) {
            return text(StatusCode::FORBIDDEN, "a form from another site: refused");
        }
        let Ok(_turn) = tokio::time::timeout(Duration::from_secs(2), self.busy.acquire()).await
        else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the console is busy; try again",
            );
        };
        let session = cookie(request.headers());
        let signed_in = session.as_deref().and_then(|id| self.sessions.session(id));
        let (parts, body) = request.into_parts();
        let form = if method == Method::POST {
            match read_form(body).await {
                Ok(form) => form,
                Err(response) => return *response,
            }
        } else {
            String::new()
        };
        let query = parts.uri.query().unwrap_or("").to_owned();
        match (method.clone(), path.as_str()) {
            (Method::POST, "/console/csp-report") => return self.csp_report(&form),
            (Method::GET, "/console/sign-in") => {
                return page(
                    StatusCode::OK,
                    pages::layout("Sign in", None, false, pages::sign_in(None)),
                )
            }
            (Method::POST, "/console/sign-in") => return self.sign_in(&form, peer),
            (Method::POST, "/console/sign-out") => {
                if let Some(id) = &session {
                    self.sessions.end(id);
                }
                let mut response = redirect("/console/sign-in");
                response.headers_mut().insert(
                    header::SET_COOKIE,
                    HeaderValue::from_static(
                        "sume_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
                    ),
                );
                return response;
            }
            _ => {}
        }
        let Some((role, name)) = signed_in else {
            return if method == Method::GET || method == Method::HEAD {
                redirect("/console/sign-in")
            } else {
                text(StatusCode::UNAUTHORIZED, "sign in first")
            };
        };
        // Who acts: a named token's name; the shared tokens know only where the request came
        // from.
        let by = match &name {
            Some(name) => format!("console:{name}"),
            None => format!("console:{}", peer.ip()),
        };
        let viewer = Viewer {
            role,
            name,
            may_act: self.actions && role == Role::Operator,
        };
        match method {
            Method::GET | Method::HEAD => self.show(viewer, &path, &query).await,
            Method::POST if !viewer.may_act => text(
                StatusCode::FORBIDDEN,
                "read-only: actions need [admin] console_actions = true and the operator token",
            ),
            Method::POST => self.act(viewer, &path, &form, &by).await,
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET or POST"),
        }
    }

    fn sign_in(&self, form: &str, peer: SocketAddr) -> Response<Full<Bytes>> {
        if !self.sessions.may_try() {
            return page(
                StatusCode::TOO_MANY_REQUESTS,
                pages::layout(
                    "Sign in",
                    None,
                    false,
                    pages::sign_in(Some("Too many failed sign-ins: wait a minute.")),
                ),
            );
        }
        let token = form_value(form, "token").unwrap_or_default();
        let token = token.trim();
        let named = self
            .named_tokens
            .iter()
            .find(|(_, _, secret)| secret.matches(token))
            .map(|(name, role, _)| {
                let role = match role {
                    TokenRole::Operator => Role::Operator,
                    TokenRole::Reader => Role::Reader,
                };
                (role, Some(name.as_str()))
            });
        let signed_in = named.or_else(|| {
            if self.operator_token.matches(token) {
                Some((Role::Operator, None))
            } else if self
                .read_token
                .as_ref()
                .is_some_and(|read| read.matches(token))
            {
                Some((Role::Reader, None))
            } else {
                None
            }
        });
        let Some((role, name)) = signed_in else {
            self.sessions.failed();
            tracing::warn!(%peer, "console sign-in refused: wrong token");
            return page(
                StatusCode::UNAUTHORIZED,
                pages::layout(
                    "Sign in",
                    None,
                    false,
                    pages::sign_in(Some("That token is not one of this receiver's.")),
                ),
            );
        };
        let id = match self.sessions.start(role, name) {
            Ok(id) => id,
            Err(error) => {
                tracing::error!(%error, "cannot start a console session");
                return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot start a session");
            }
        };
        tracing::info!(%peer, role = role.label(), name = name.unwrap_or("-"), "console sign-in");
        let mut response = redirect("/console/");
        let cookie = format!(
            "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
            session::SESSION_LIFETIME.as_secs()
        );
        response.headers_mut().insert(
            header::SET_COOKIE,
            HeaderValue::from_str(&cookie).expect("hex and ASCII"),
        );
        response
    }

    fn csp_report(&self, body: &str) -> Response<Full<Bytes>> {
        let mut reports = self.csp_reports.lock().expect("not poisoned");
        if reports.len() == CSP_REPORTS_KEPT {
            reports.pop_front();
        }
        reports.push_back(body.chars().take(2048).collect());
        tracing::debug!("console: a Content-Security-Policy violation was reported");
        text(StatusCode::NO_CONTENT, "")
    }
}

/// The directory holding the ledger's file, resolved to an absolute path; `None` where the
/// ledger is not a file (PostgreSQL).
fn ledger_dir(ledger: &Ledger) -> Option<std::path::PathBuf> {
    let file = std::fs::canonicalize(ledger.location()).ok()?;
    file.parent().map(std::path::Path::to_path_buf)
}
