//! The operator's console on the admin listener: pages drawn by the server, a session cookie,
//! and the security a browser needs (Host allowlist, same-origin POSTs, a strict CSP).
//!
//! Every page works without JavaScript; `/console/api/...` answers the same data as JSON.
//! Read-only unless `[admin] console_actions` is on and the session is an operator's. At most
//! [`CONCURRENT_REQUESTS`] console requests run at once: the console never starves the
//! ledger of readers.

mod assets;
mod pages;
mod session;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use maud::Markup;
use tokio::sync::Semaphore;

use crate::config::{Config, Secret};
use crate::ingest::json_response;
use crate::job_id::JobId;
use crate::ledger::{
    duration_ms, now_ms, Cursor, DeadGroup, JobFilter, Ledger, RetryFilter, State,
};
use crate::metrics::METRICS;
use crate::refusals::Refusals;
use crate::rollup::ROLLUP;
use crate::worker::Queue;
use pages::Viewer;
pub use session::Role;
use session::Sessions;

/// An answer that ends a request early (boxed: it is large, and the rare path).
type Refused = Box<Response<Full<Bytes>>>;

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
/// Jobs a group retry changes per transaction (claims commit in between).
const RETRY_BATCH: usize = 500;

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
    actions: bool,
    /// Host header values the console answers to (lowercase).
    hosts: Vec<String>,
    sessions: Sessions,
    csp_reports: Mutex<VecDeque<String>>,
    busy: Semaphore,
    settings: Vec<(String, String)>,
    /// The dead-letter groups read every dead job: computed at most every [`GROUPS_FRESH`].
    groups: Fresh<Vec<DeadGroup>>,
    snapshot: Fresh<crate::metrics::Snapshot>,
}

impl Console {
    pub fn new(
        config: &Config,
        (ledger, queue, refusals): (Arc<Ledger>, Option<Queue>, Arc<Refusals>),
        operator_token: Secret,
        read_token: Option<Secret>,
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
            settings: settings(config, &ledger),
            ledger,
            refusals,
            queue,
            operator_token,
            read_token,
            actions: admin.is_some_and(|a| a.console_actions),
            hosts,
            sessions: Sessions::default(),
            csp_reports: Mutex::new(VecDeque::new()),
            busy: Semaphore::new(CONCURRENT_REQUESTS),
            groups: Fresh::new(GROUPS_FRESH),
            snapshot: Fresh::new(SNAPSHOT_FRESH),
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
        let role = session.as_deref().and_then(|id| self.sessions.role(id));
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
        let Some(role) = role else {
            return if method == Method::GET || method == Method::HEAD {
                redirect("/console/sign-in")
            } else {
                text(StatusCode::UNAUTHORIZED, "sign in first")
            };
        };
        let viewer = Viewer {
            role,
            may_act: self.actions && role == Role::Operator,
        };
        let by = format!("console:{}", peer.ip());
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
        let role = if self.operator_token.matches(token.trim()) {
            Some(Role::Operator)
        } else if self
            .read_token
            .as_ref()
            .is_some_and(|read| read.matches(token.trim()))
        {
            Some(Role::Reader)
        } else {
            None
        };
        let Some(role) = role else {
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
        let id = match self.sessions.start(role) {
            Ok(id) => id,
            Err(error) => {
                tracing::error!(%error, "cannot start a console session");
                return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot start a session");
            }
        };
        tracing::info!(%peer, role = role.label(), "console sign-in");
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

    /// A page, or its JSON twin under `/console/api/`.
    async fn show(&self, viewer: Viewer, path: &str, query: &str) -> Response<Full<Bytes>> {
        let (json, path) = match path.strip_prefix("/console/api/") {
            Some(rest) => (true, format!("/console/{rest}")),
            None => (false, path.to_owned()),
        };
        let segments: Vec<&str> = path.trim_start_matches("/console/").split('/').collect();
        let shown: Result<(String, Markup, serde_json::Value, bool), Refused> = match segments
            .as_slice()
        {
            [""] => self
                .overview(viewer)
                .await
                .map(|(m, j)| ("Overview".into(), m, j, true)),
            ["jobs"] if !json && form_value(query, "job_id").is_some_and(|id| !id.is_empty()) => {
                // The search box: straight to the job's page.
                let location = pages::job_href(&form_value(query, "job_id").unwrap_or_default());
                let mut response = text(StatusCode::SEE_OTHER, "");
                let value = HeaderValue::from_str(&location).expect("percent-encoded: ASCII");
                response.headers_mut().insert(header::LOCATION, value);
                return response;
            }
            ["jobs"] => self
                .jobs(query)
                .await
                .map(|(m, j)| ("Jobs".into(), m, j, false)),
            ["jobs", id] => self
                .job(viewer, id)
                .await
                .map(|(m, j)| ("Job".into(), m, j, false)),
            ["jobs", id, "body"] if !json => return self.body(id).await,
            ["dead"] => match self.dead_groups().await {
                Ok(groups) => Ok((
                    "Dead letters".into(),
                    pages::dead(viewer, &groups),
                    serde_json::json!(groups),
                    false,
                )),
                Err(error) => Err(Box::new(unavailable(&error))),
            },
            ["dead", "retry"] if viewer.may_act => {
                let signature = form_value(query, "signature").unwrap_or_default();
                match self
                    .ledger
                    .count_retry_matching(&group_filter(&signature))
                    .await
                {
                    Ok(count) => Ok((
                        "Retry a group".into(),
                        pages::retry_group(&signature, count.retryable, count.body_purged),
                        serde_json::json!(count),
                        false,
                    )),
                    Err(error) => Err(Box::new(unavailable(&error))),
                }
            }
            ["receipts"] => {
                let refusals = self.refusals.recent();
                let hour = ROLLUP.last_hour();
                let json = serde_json::json!({ "refusals": refusals, "last_hour": hour });
                Ok((
                    "Receipts".into(),
                    pages::receipts(&refusals, &hour),
                    json,
                    false,
                ))
            }
            ["expected"] => match self.ledger.list_expectations(PAGE_LIMIT * 4).await {
                Ok(rows) => Ok((
                    "Expected".into(),
                    pages::expected(&rows),
                    serde_json::json!(rows),
                    false,
                )),
                Err(error) => Err(Box::new(unavailable(&error))),
            },
            ["config"] => match self.ledger.running_by_receiver().await {
                Ok(receivers) => {
                    let settings: std::collections::BTreeMap<_, _> =
                        self.settings.iter().cloned().collect();
                    let json = serde_json::json!({
                        "settings": settings,
                        "running_by_receiver": receivers,
                    });
                    let main = pages::config(&self.settings, &receivers);
                    Ok(("Config".into(), main, json, false))
                }
                Err(error) => Err(Box::new(unavailable(&error))),
            },
            ["csp-canary"] => Ok((
                "CSP canary".into(),
                pages::csp_canary(),
                serde_json::json!({}),
                false,
            )),
            ["csp-reports"] => {
                let reports: Vec<String> = self
                    .csp_reports
                    .lock()
                    .expect("not poisoned")
                    .iter()
                    .cloned()
                    .collect();
                Ok((
                    "CSP reports".into(),
                    maud::html! { pre { (reports.join("\n")) } },
                    serde_json::json!(reports),
                    false,
                ))
            }
            _ => Err(refuse(StatusCode::NOT_FOUND, "no such page")),
        };
        match shown {
            Ok((_, _, value, _)) if json => json_response(StatusCode::OK, &value),
            Ok((title, main, _, refresh)) => page(
                StatusCode::OK,
                pages::layout(&title, Some(viewer), refresh, main),
            ),
            Err(response) => *response,
        }
    }

    /// The dead-letter groups, as computed at most [`GROUPS_FRESH`] ago.
    async fn dead_groups(&self) -> Result<Vec<DeadGroup>, crate::ledger::StorageError> {
        self.groups
            .get_or_read(|| self.ledger.dead_groups(GROUPS_SHOWN))
            .await
    }

    async fn overview(&self, viewer: Viewer) -> Result<(Markup, serde_json::Value), Refused> {
        let snapshot = self
            .snapshot
            .get_or_read(|| self.ledger.metrics_snapshot())
            .await
            .ok();
        let dispatch = self.ledger.dispatch().await.ok();
        let data = pages::Overview {
            readiness: self.ledger.readiness(),
            free_disk: self.ledger_directory().and_then(|dir| free_bytes(&dir)),
            dispatch,
            snapshot,
            totals: METRICS.delivery_totals(),
            maintenance: METRICS.maintenance_totals(),
            hour: ROLLUP.last_hour(),
            refusals: self.refusals.recent().len(),
        };
        let json = serde_json::json!({
            "ready": data.readiness.is_ok(),
            "not_ready_because": data.readiness.err(),
            "dispatch": data.dispatch,
            "jobs": data.snapshot.as_ref().map(|s| s.jobs.clone()),
            "oldest_unfinished_age_seconds": data.snapshot.as_ref().map(|s| s.oldest_unfinished_age_seconds),
            "last_hour": data.hour,
        });
        Ok((pages::overview(viewer, &data), json))
    }

    fn ledger_directory(&self) -> Option<std::path::PathBuf> {
        let location = std::path::PathBuf::from(self.ledger.location());
        location
            .is_absolute()
            .then(|| location.parent().map(std::path::Path::to_path_buf))
            .flatten()
    }

    async fn jobs(&self, query: &str) -> Result<(Markup, serde_json::Value), Refused> {
        let state = match form_value(query, "state").filter(|s| !s.is_empty()) {
            Some(state) => Some(
                state
                    .parse::<State>()
                    .map_err(|error| refuse(StatusCode::BAD_REQUEST, &error))?,
            ),
            None => None,
        };
        let after = match form_value(query, "after").filter(|s| !s.is_empty()) {
            Some(after) => Some(
                after
                    .parse::<Cursor>()
                    .map_err(|error| refuse(StatusCode::BAD_REQUEST, &error))?,
            ),
            None => None,
        };
        let limit = form_value(query, "limit")
            .and_then(|limit| limit.parse::<usize>().ok())
            .unwrap_or(PAGE_LIMIT)
            .clamp(1, MAX_PAGE_LIMIT);
        let given = |name| form_value(query, name).filter(|value| !value.is_empty());
        let (event_type, since, before) = (given("event_type"), given("since"), given("before"));
        let ago = |text: &Option<String>, name: &str| -> Result<Option<i64>, Refused> {
            text.as_deref()
                .map(|text| {
                    humantime::parse_duration(text)
                        .map(|ago| now_ms() - duration_ms(ago))
                        .map_err(|error| {
                            refuse(
                                StatusCode::BAD_REQUEST,
                                &format!(
                                    "{name}: {text:?} is not a duration (\"1h\", \"2d\"): {error}"
                                ),
                            )
                        })
                })
                .transpose()
        };
        let filter = JobFilter {
            state,
            event_type: event_type.clone(),
            since: ago(&since, "since")?,
            before: ago(&before, "before")?,
        };
        let page = self
            .ledger
            .find_jobs(&filter, after.as_ref(), limit)
            .await
            .map_err(|e| Box::new(unavailable(&e)))?;
        let list = pages::ListQuery {
            state,
            event_type: event_type.as_deref(),
            since: since.as_deref(),
            before: before.as_deref(),
            limit,
        };
        Ok((pages::jobs(&list, &page), serde_json::json!(page)))
    }

    async fn job(&self, viewer: Viewer, id: &str) -> Result<(Markup, serde_json::Value), Refused> {
        let job_id = decode(id)?;
        match self.ledger.show_job(job_id.as_str()).await {
            Ok(Some(job)) => Ok((pages::job(viewer, &job), serde_json::json!(job))),
            Ok(None) => Err(refuse(StatusCode::NOT_FOUND, "no such job in the ledger")),
            Err(error) => Err(Box::new(unavailable(&error))),
        }
    }

    /// The stored body exactly as received, as a download: never rendered by the browser.
    async fn body(&self, id: &str) -> Response<Full<Bytes>> {
        let job_id = match decode(id) {
            Ok(job_id) => job_id,
            Err(response) => return *response,
        };
        match self.ledger.show_job(job_id.as_str()).await {
            Ok(Some(job)) => match job.body {
                Some(body) => {
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    let headers = response.headers_mut();
                    headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/octet-stream"),
                    );
                    headers.insert(
                        header::CONTENT_DISPOSITION,
                        HeaderValue::from_static("attachment; filename=\"body.json\""),
                    );
                    response
                }
                None => text(StatusCode::GONE, "retention purged this job's body"),
            },
            Ok(None) => text(StatusCode::NOT_FOUND, "no such job in the ledger"),
            Err(error) => unavailable(&error),
        }
    }

    /// A form's action; answers with a page saying what happened.
    async fn act(&self, viewer: Viewer, path: &str, form: &str, by: &str) -> Response<Full<Bytes>> {
        let segments: Vec<&str> = path.trim_start_matches("/console/").split('/').collect();
        let now = now_ms();
        let (message, back) = match segments.as_slice() {
            ["dispatch", change @ ("pause" | "resume")] => {
                let paused = *change == "pause";
                match self.ledger.set_dispatch(paused, by, now).await {
                    Ok(_) => {
                        if let Some(queue) = &self.queue {
                            queue.dispatch_changed(paused);
                        }
                        tracing::info!(%by, paused, "dispatch changed in the console");
                        (
                            if paused {
                                "Dispatch paused: deliveries are claimed, no job runs."
                            } else {
                                "Dispatch resumed."
                            }
                            .to_owned(),
                            "/console/".to_owned(),
                        )
                    }
                    Err(error) => return unavailable(&error),
                }
            }
            ["jobs", id, action @ ("retry" | "run-now" | "cancel")] => {
                let job_id = match decode(id) {
                    Ok(job_id) => job_id,
                    Err(response) => return *response,
                };
                let done = match *action {
                    "retry" => match self.ledger.retry_job(job_id.as_str(), by, now).await {
                        Ok(()) => Ok(true),
                        Err(crate::ledger::RetryError::Storage(error)) => Err(error),
                        Err(refused) => return text(StatusCode::CONFLICT, &refused.to_string()),
                    },
                    "run-now" => self.ledger.run_now(job_id.as_str(), by, now).await,
                    _ => {
                        let Some(reason) =
                            form_value(form, "reason").filter(|r| !r.trim().is_empty())
                        else {
                            return text(StatusCode::BAD_REQUEST, "a cancel needs a reason");
                        };
                        self.ledger
                            .cancel_job(job_id.as_str(), by, &reason, now)
                            .await
                    }
                };
                match done {
                    Ok(true) => {
                        if let Some(queue) = &self.queue {
                            queue.look_in_ledger();
                        }
                        tracing::info!(job_id = %job_id, action, %by, "job action in the console");
                        (format!("{action}: done."), pages::job_href(job_id.as_str()))
                    }
                    Ok(false) => {
                        return text(
                            StatusCode::CONFLICT,
                            &format!("{action} does not apply to this job in its state"),
                        )
                    }
                    Err(error) => return unavailable(&error),
                }
            }
            ["dead", "retry"] => {
                let signature = form_value(form, "signature").unwrap_or_default();
                let filter = group_filter(&signature);
                let mut retried = 0;
                loop {
                    match self
                        .ledger
                        .retry_matching(
                            &filter,
                            by,
                            "console: retry of a dead-letter group",
                            now_ms(),
                            RETRY_BATCH,
                        )
                        .await
                    {
                        Ok(0) => break,
                        Ok(batch) => retried += batch,
                        Err(error) => return unavailable(&error),
                    }
                }
                if let Some(queue) = &self.queue {
                    queue.look_in_ledger();
                }
                self.groups.forget().await;
                tracing::info!(retried, %by, "dead-letter group retried in the console");
                (
                    format!("{retried} jobs are queued to run again."),
                    "/console/dead".to_owned(),
                )
            }
            _ => return text(StatusCode::NOT_FOUND, "no such action"),
        };
        page(
            StatusCode::OK,
            pages::layout("Done", Some(viewer), false, pages::done(&message, &back)),
        )
    }
}

/// Dead jobs whose error contains a group's signature, that finished before now.
fn group_filter(signature: &str) -> RetryFilter {
    RetryFilter {
        state: State::Dead,
        finished_since: None,
        finished_before: now_ms() + 1,
        error_contains: (!signature.is_empty()).then(|| signature.to_owned()),
    }
}

/// Headers on every console answer.
fn secure(headers: &mut HeaderMap) {
    let set = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

/// A POST from one of the console's own pages: the browser says so (`Sec-Fetch-Site`), or
/// its `Origin` is this console's.
fn same_origin(headers: &HeaderMap, host: &str) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site == "same-origin";
    }
    headers
        .get(header::ORIGIN)
        .and_then(|origin| origin.to_str().ok())
        .is_some_and(|origin| origin.eq_ignore_ascii_case(&format!("http://{host}")))
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix("sume_console=").map(str::to_owned))
}

async fn read_form(body: Incoming) -> Result<String, Box<Response<Full<Bytes>>>> {
    let read =
        tokio::time::timeout(FORM_READ_TIMEOUT, Limited::new(body, FORM_BYTES).collect()).await;
    match read {
        Ok(Ok(collected)) => Ok(String::from_utf8_lossy(&collected.to_bytes()).into_owned()),
        Ok(Err(_)) => Err(Box::new(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "a form is at most 8 KiB",
        ))),
        Err(_) => Err(Box::new(text(
            StatusCode::REQUEST_TIMEOUT,
            "the form did not arrive in time",
        ))),
    }
}

/// The value of `name` in a query string or an urlencoded form, decoded.
pub fn form_value(text: &str, name: &str) -> Option<String> {
    text.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| {
            percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

fn decode(segment: &str) -> Result<JobId, Refused> {
    let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
    JobId::parse(&decoded).map_err(|error| refuse(StatusCode::BAD_REQUEST, &error.to_string()))
}

fn page(status: StatusCode, markup: Markup) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(markup.into_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

fn text(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message.to_owned())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn refuse(status: StatusCode, message: &str) -> Refused {
    Box::new(text(status, message))
}

fn redirect(to: &'static str) -> Response<Full<Bytes>> {
    let mut response = text(StatusCode::SEE_OTHER, "");
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    response
}

fn unavailable(error: &crate::ledger::StorageError) -> Response<Full<Bytes>> {
    tracing::warn!(%error, "a console page found the ledger unavailable");
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the ledger is unavailable; try again",
    )
}

/// Free bytes on the file system holding `dir`.
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes only into the struct it is given; the path is NUL-terminated.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(path.as_ptr(), &mut stats) } == 0)
        .then(|| stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// What the config page shows: the settings in effect, without any credential.
fn settings(config: &Config, ledger: &Ledger) -> Vec<(String, String)> {
    let mut rows = vec![
        ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        ("server.listen".into(), config.server.listen.to_string()),
        (
            "server.webhook_path".into(),
            config.server.webhook_path.clone(),
        ),
        ("ledger".into(), ledger.location()),
        (
            "ledger shared by several receivers".into(),
            ledger.is_shared().to_string(),
        ),
        (
            "signature.tolerance".into(),
            humantime::format_duration(config.signature.tolerance).to_string(),
        ),
        ("signing secrets".into(), "(never shown)".into()),
    ];
    match &config.handler {
        Some(handler) => {
            let kind = handler.kind.describe();
            rows.push(("handler".into(), kind));
            rows.push((
                "handler.max_attempts".into(),
                handler.max_attempts.to_string(),
            ));
            rows.push((
                "handler.timeout".into(),
                humantime::format_duration(handler.timeout).to_string(),
            ));
            rows.push((
                "handler.concurrency".into(),
                handler.concurrency.to_string(),
            ));
        }
        None => rows.push(("handler".into(), "none: jobs stay claimed".into())),
    }
    rows.push((
        "sume_api".into(),
        config
            .sume_api
            .as_ref()
            .map_or("off".into(), |api| api.base_url.clone()),
    ));
    if let Some(admin) = &config.admin {
        rows.push(("admin.listen".into(), admin.listen.to_string()));
        rows.push((
            "admin.console_actions".into(),
            admin.console_actions.to_string(),
        ));
    }
    rows
}

/// A value read from the ledger and shown as read for a while: however many viewers poll a
/// page, the ledger pays for it once per period.
struct Fresh<T> {
    period: Duration,
    read: tokio::sync::Mutex<Option<(std::time::Instant, T)>>,
}

impl<T: Clone> Fresh<T> {
    fn new(period: Duration) -> Fresh<T> {
        Fresh {
            period,
            read: tokio::sync::Mutex::new(None),
        }
    }

    /// The value read less than a period ago, or `read`'s (a failed read is not kept).
    async fn get_or_read<F, E>(&self, read: impl FnOnce() -> F) -> Result<T, E>
    where
        F: std::future::Future<Output = Result<T, E>>,
    {
        let mut kept = self.read.lock().await;
        if let Some((at, value)) = kept.as_ref() {
            if at.elapsed() < self.period {
                return Ok(value.clone());
            }
        }
        let value = read().await?;
        *kept = Some((std::time::Instant::now(), value.clone()));
        Ok(value)
    }

    /// The next look reads afresh.
    async fn forget(&self) {
        *self.read.lock().await = None;
    }
}
