//! The admin listener: expected jobs, the operators' actions, and the recent refusals.
//!
//! With `Authorization: Bearer <token>`: `PUT /v1/expected/{job_id}` (or POST) registers a job
//! for reconciliation (twice is harmless); `GET /v1/jobs/{job_id}` shows a job and its history;
//! `POST /v1/jobs/{job_id}/retry`, `/run-now` and `/cancel?reason=...` act on it;
//! `GET /v1/dispatch`, `POST /v1/dispatch/pause` (optionally `?reason=`, `?route=`) and `/resume`;
//! `GET /v1/refusals`, the recent refused deliveries. The actions themselves are `actions.rs`'s,
//! shared with the console. Off unless `[admin] token_file` is set. Every admin token is a
//! bearer: the operator token and named operators act, the read token and named readers only
//! read (`GET`); a named token's actions are recorded as `api:<name>`. Wrong tokens are
//! throttled per peer (`peer_throttle.rs`). It also serves `/healthz`, `/readyz` and
//! `/metrics` (no token: read-only), under the console's Host names only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HOST, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};

use crate::access::{Role, Tokens};
use crate::actions::{Actions, JobAction, Refused};
use crate::console::Console;
use crate::job_id::JobId;
use crate::ledger::{self, now_ms, Actor, Ledger};
use crate::peer_throttle::PeerThrottle;
use crate::refusals::Refusals;
use crate::response::{error_response, json_response};
use crate::route_name::RouteName;
use crate::server::Router;
use crate::tls::Tls;
use crate::traces::Tracer;
use crate::worker::Queues;

pub struct Admin {
    pub ledger: Arc<Ledger>,
    /// Who a bearer token is (the console's sign-in knows the same tokens).
    pub tokens: Arc<Tokens>,
    /// Wrong bearer tokens, per peer.
    pub api_auth: PeerThrottle,
    pub reconcile_after: Duration,
    /// The local worker, woken when an action makes a job due; `None` without a handler.
    pub queue: Queues,
    pub refusals: Arc<Refusals>,
    /// `/console/...`: the pages, with their own sign-in.
    pub console: Console,
    /// The webhook listener's TLS, whose certificate a delivery needs (`/readyz`).
    pub webhook_tls: Option<Arc<Tls>>,
    /// A span of each operator action.
    pub tracer: Tracer,
}

impl Router for Admin {
    async fn route(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
        if Console::owns(request.uri().path()) {
            return self.console.handle(request, peer).await;
        }
        let host = request.headers().get(HOST).and_then(|v| v.to_str().ok());
        let ours = host.is_some_and(|host| self.console.answers_to(&host.to_ascii_lowercase()));
        if crate::server::is_operational(request.uri().path()) && !ours {
            // Read-only, but as the console: no answer to a name that is not ours (DNS
            // rebinding would let a page read them from an operator's browser).
            return error_response(
                StatusCode::MISDIRECTED_REQUEST,
                "this listener does not answer to that Host name",
            );
        }
        // Prometheus and health checks need no token.
        if let Some(response) = crate::server::operational(
            &self.ledger,
            &self.queue,
            self.webhook_tls.as_deref(),
            &request,
        )
        .await
        {
            return response;
        }
        if let Err(wait) = self.api_auth.check(peer.ip()) {
            let mut response = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                "too many wrong tokens from this address; wait",
            );
            response
                .headers_mut()
                .insert(RETRY_AFTER, wait.as_secs().max(1).into());
            return response;
        }
        let bearer = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().split_once(' '))
            // RFC 9110: the scheme is case-insensitive.
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let who = bearer.and_then(|token| self.tokens.identify(token));
        let Some(who) = who else {
            if bearer.is_some() {
                self.api_auth.failed(peer.ip());
            }
            return error_response(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
        };
        crate::connections::earned();
        let path = request.uri().path().to_owned();
        let query = request.uri().query().unwrap_or("").to_owned();
        let method = request.method().clone();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let posted = method == Method::POST;
        let read = matches!(method, Method::GET | Method::HEAD);
        if who.role == Role::Reader && !read {
            return error_response(StatusCode::FORBIDDEN, "a reader's token only reads (GET)");
        }
        // A named token's name; the shared token knows only where the request came from.
        let by = match &who.name {
            Some(name) => format!("api:{name}"),
            None => format!("admin:{}", peer.ip()),
        };
        match segments.as_slice() {
            ["v1", "expected", job_id] => {
                if !matches!(method, Method::PUT | Method::POST) {
                    return error_response(StatusCode::METHOD_NOT_ALLOWED, "use PUT or POST");
                }
                match decode_job_id(job_id) {
                    Ok(job_id) => self.register_expected(job_id).await,
                    Err(why) => error_response(StatusCode::BAD_REQUEST, &why),
                }
            }
            ["v1", "jobs", job_id, action @ ..] => {
                let job_id = match decode_job_id(job_id) {
                    Ok(job_id) => job_id,
                    Err(why) => return error_response(StatusCode::BAD_REQUEST, &why),
                };
                let act = match action {
                    [segment] => JobAction::from_segment(segment),
                    _ => None,
                };
                match (action, act, read, posted) {
                    ([], _, true, _) => self.show(&job_id).await,
                    (_, Some(act), _, true) => self.act(&job_id, act, &by, &query).await,
                    ([], _, _, _) => error_response(StatusCode::METHOD_NOT_ALLOWED, "use GET"),
                    (_, Some(_), _, _) => {
                        error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST")
                    }
                    _ => error_response(StatusCode::NOT_FOUND, "not found"),
                }
            }
            ["v1", "dispatch"] if read => match self.ledger.dispatch().await {
                Ok(dispatch) => json_response(StatusCode::OK, &serde_json::json!(dispatch)),
                Err(error) => storage_unavailable(&error),
            },
            ["v1", "dispatch", change @ ("pause" | "resume")] if posted => {
                let paused = *change == "pause";
                let reason = crate::console::form_value(&query, "reason");
                let actor = Actor::because(&by, reason.as_deref());
                let changed = match crate::console::form_value(&query, "route") {
                    None => self.actions().set_dispatch(paused, &actor).await,
                    Some(route) => match RouteName::parse(&route) {
                        Ok(route) => {
                            self.actions()
                                .set_route_dispatch(&route, paused, &actor)
                                .await
                        }
                        Err(why) => return error_response(StatusCode::BAD_REQUEST, &why),
                    },
                };
                match changed {
                    Ok(changed) => json_response(
                        StatusCode::OK,
                        &serde_json::json!({ "paused": paused, "changed": changed }),
                    ),
                    Err(Refused::Storage(error)) => storage_unavailable(&error),
                    Err(refused) => error_response(refused.status(), &refused.to_string()),
                }
            }
            ["v1", "refusals"] if read => {
                json_response(StatusCode::OK, &serde_json::json!(self.refusals.recent()))
            }
            ["v1", "dispatch", ..] | ["v1", "refusals"] => error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "wrong method for this resource",
            ),
            _ => error_response(StatusCode::NOT_FOUND, "not found"),
        }
    }
}

/// A job_id from one path segment: a raw '/' would have made it another resource (`%2F` is
/// part of an id).
/// `Err`: why it is not one, for a 400.
fn decode_job_id(encoded: &str) -> Result<JobId, String> {
    match percent_encoding::percent_decode_str(encoded).decode_utf8() {
        Ok(decoded) => JobId::parse(&decoded).map_err(|error| error.to_string()),
        Err(_) => Err("job_id is not UTF-8".into()),
    }
}

fn storage_unavailable(error: &ledger::StorageError) -> Response<Full<Bytes>> {
    tracing::warn!(%error, "an admin request found the ledger unavailable");
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "storage unavailable, retry later",
    )
}

impl Admin {
    async fn register_expected(&self, job_id: JobId) -> Response<Full<Bytes>> {
        match self.actions().expect(&job_id, self.reconcile_after).await {
            Ok(registered) => json_response(
                StatusCode::OK,
                &serde_json::json!({ "job_id": job_id, "registered": registered }),
            ),
            Err(error) => storage_unavailable(&error),
        }
    }

    async fn show(&self, job_id: &JobId) -> Response<Full<Bytes>> {
        let job = match self.ledger.show_job(job_id).await {
            Ok(Some(job)) => job,
            Ok(None) => return error_response(StatusCode::NOT_FOUND, "no such job in the ledger"),
            Err(error) => return storage_unavailable(&error),
        };
        match self.ledger.stops_delaying(&job, now_ms()).await {
            Ok(stops) => {
                let mut json = serde_json::json!(job);
                json["delayed_by"] = serde_json::json!(stops);
                json_response(StatusCode::OK, &json)
            }
            Err(error) => storage_unavailable(&error),
        }
    }

    fn actions(&self) -> Actions<'_> {
        Actions {
            ledger: &self.ledger,
            queue: Some(&self.queue),
            tracer: &self.tracer,
        }
    }

    /// `retry`, `run-now` or `cancel` (with `?reason=`), of the job's work on every route or on
    /// `?route=`, recorded as `by`'s action; the job's state after it. 409 when the job is not in
    /// a state the action applies to; 400 for a route name that cannot be one.
    async fn act(
        &self,
        job_id: &JobId,
        action: JobAction,
        by: &str,
        query: &str,
    ) -> Response<Full<Bytes>> {
        let reason = crate::console::form_value(query, "reason");
        let route = match crate::console::form_value(query, "route").map(|r| RouteName::parse(&r)) {
            None => None,
            Some(Ok(route)) => Some(route),
            Some(Err(why)) => return error_response(StatusCode::BAD_REQUEST, &why),
        };
        let actor = Actor::because(by, reason.as_deref());
        match self
            .actions()
            .on_job(action, job_id, route.as_ref(), &actor)
            .await
        {
            Ok(()) => {
                let job = self.ledger.show_job(job_id).await.ok().flatten();
                let state = job.map(|job| job.summary.state);
                json_response(
                    StatusCode::OK,
                    &serde_json::json!({ "job_id": job_id, "action": action.as_str(), "state": state }),
                )
            }
            Err(Refused::Storage(error)) => storage_unavailable(&error),
            Err(Refused::NoReason) => {
                error_response(StatusCode::BAD_REQUEST, "cancel needs ?reason=")
            }
            Err(refused) => error_response(refused.status(), &refused.to_string()),
        }
    }
}
