//! The reconciler: polls Sume's status endpoint for expected jobs whose webhook never arrived.
//!
//! An expected job with no claim `reconcile_after` after it was registered is polled, at most
//! `max_requests_per_second` calls in all. A terminal status is claimed exactly like a webhook
//! (same ledger, same `ON CONFLICT DO NOTHING`), with the status answer as the stored body and
//! `SUME_DELIVERY_SOURCE=poll`; anything else is polled again later, with backoff, until
//! `give_up_after`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::AUTHORIZATION;
use hyper::{Request, StatusCode};
use serde_json::{Map, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Secret, SumeApiConfig};
use crate::event_type::EventType;
use crate::http_client::{self, Answer, HttpClient};
use crate::job_id::JobId;
use crate::ledger::{
    duration_ms, now_ms, ClaimOutcome, Ledger, NewClaim, PollResult, Routing, Source, StorageError,
};
use crate::logging::Escaped;
use crate::metrics::{PollCall, METRICS};
use crate::traces::{Kind, Parent, Span, SpanContext, Tracer};
use crate::worker::Queues;

/// Largest status answer kept (it becomes the job's stored body).
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// How often the reconciler looks for due polls.
const TICK: Duration = Duration::from_secs(1);
/// How long an expectation handed to this receiver for a poll is kept from the others (on a
/// shared PostgreSQL ledger): longer than a tick's polls take, short enough that another
/// receiver polls it soon if this one dies meanwhile.
const POLL_LEASE: Duration = Duration::from_secs(60);

/// What one reconcile pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Due expectations whose webhook had arrived: resolved without a call.
    pub arrived: usize,
    pub polled: usize,
    pub recovered: usize,
    pub given_up: usize,
}

pub struct Reconciler {
    ledger: Arc<Ledger>,
    api: SumeApiConfig,
    api_key: Secret,
    client: HttpClient,
    /// A recovered job takes the routes its webhook would have taken (those in force).
    queue: Queues,
    terminal: HashSet<String>,
    /// Earliest moment for the next call (the rate limit).
    next_call: Instant,
    /// Set after 401/403 or 429/5xx: no calls at all before then.
    paused_until: Option<Instant>,
    /// Consecutive refusals of our API key, for the back-off and to log the problem once.
    auth_refusals: u32,
    tracer: Tracer,
}

impl Reconciler {
    /// `api_key` as read at start ([`Credentials`](crate::config::Credentials)): a missing
    /// key file stops the start, not the first poll.
    pub fn new(ledger: Arc<Ledger>, api: SumeApiConfig, api_key: Secret, queue: Queues) -> Self {
        let terminal = api.terminal_statuses.iter().cloned().collect();
        Self {
            ledger,
            api_key,
            api,
            client: http_client::new_client(),
            queue,
            terminal,
            next_call: Instant::now(),
            paused_until: None,
            auth_refusals: 0,
            tracer: Tracer::default(),
        }
    }

    /// Records a span of each poll with `tracer`; a job recovered by a poll joins its trace.
    pub fn traced_by(self, tracer: Tracer) -> Reconciler {
        Reconciler { tracer, ..self }
    }

    pub async fn reconcile_once(&mut self) -> Result<ReconcileReport, StorageError> {
        let now = now_ms();
        let mut report = ReconcileReport {
            arrived: self.ledger.resolve_arrived(now).await?,
            ..ReconcileReport::default()
        };
        if self
            .paused_until
            .is_some_and(|until| Instant::now() < until)
        {
            return Ok(report);
        }
        // One tick's worth of calls at the configured rate (at least one).
        let budget = (self.api.max_requests_per_second * TICK.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        let due = self
            .ledger
            .due_expectations(now, budget, POLL_LEASE)
            .await?;
        for expectation in due {
            if self
                .paused_until
                .is_some_and(|until| Instant::now() < until)
            {
                break;
            }
            let give_up_at = expectation.expected_at + duration_ms(self.api.give_up_after);
            let result = match JobId::parse(&expectation.job_id) {
                // Registered before ids were checked: it cannot be put in a URL.
                Err(error) => {
                    tracing::warn!(job_id = %Escaped(&expectation.job_id), %error, "giving up on an expected job whose stored job_id is invalid");
                    METRICS.record_given_up();
                    PollResult::GivenUp {
                        error: Some(error.to_string()),
                    }
                }
                Ok(job_id) if now >= give_up_at => {
                    tracing::warn!(job_id = %job_id, polls = expectation.polls, "giving up on an expected job: its webhook never arrived and Sume never reported it terminal");
                    METRICS.record_given_up();
                    PollResult::GivenUp {
                        error: Some("no terminal status within give_up_after".to_owned()),
                    }
                }
                Ok(job_id) => {
                    report.polled += 1;
                    let mut span = self.tracer.start("poll Sume", Kind::Client, Parent::Root);
                    span.set("sume.job_id", job_id.as_str());
                    span.set("sume.polls", expectation.polls);
                    let result = self.poll(&job_id, expectation.polls, &span).await?;
                    span.set("sume.poll_result", poll_label(&result));
                    if let PollResult::Again {
                        error: Some(error), ..
                    } = &result
                    {
                        span.fail("poll_failed", || error.clone());
                    }
                    result
                }
            };
            match &result {
                PollResult::Recovered { .. } => report.recovered += 1,
                PollResult::Arrived { .. } => report.arrived += 1,
                PollResult::GivenUp { .. } => report.given_up += 1,
                PollResult::Again { .. } => {}
            }
            self.ledger
                .record_poll(&expectation.job_id, &result, now_ms())
                .await?;
        }
        Ok(report)
    }

    /// Calls the status endpoint once (rate limited) and decides what the answer means.
    /// A recovered job keeps the poll's trace context (`span`), as a delivery's job keeps its.
    async fn poll(
        &mut self,
        job_id: &JobId,
        polls: u32,
        span: &Span,
    ) -> Result<PollResult, StorageError> {
        tokio::time::sleep_until(self.next_call).await;
        self.next_call =
            Instant::now() + Duration::from_secs_f64(1.0 / self.api.max_requests_per_second);
        let next_poll_at = now_ms() + duration_ms(self.poll_backoff(polls));
        let again = |status: Option<String>, error: Option<String>| PollResult::Again {
            status,
            error,
            next_poll_at,
        };
        let answer = match self.call(job_id, "status", hyper::Method::GET).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::warn!(job_id = %job_id, error = %Escaped(&error), "polling Sume failed; will retry");
                METRICS.record_poll(PollCall::Failed);
                return Ok(again(None, Some(error)));
            }
        };
        let status = answer.status;
        let refused = status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN;
        METRICS.record_poll(if refused {
            PollCall::Refused
        } else {
            PollCall::Answered
        });
        if refused {
            self.auth_refused(status);
            return Ok(again(None, Some(format!("Sume answered {status}"))));
        }
        self.auth_refusals = 0;
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            let wait = retry_after(&answer).unwrap_or(self.api.poll_backoff);
            tracing::warn!(%status, wait = ?wait, "Sume asks us to slow down; pausing polls");
            self.paused_until = Some(Instant::now() + wait);
            return Ok(PollResult::Again {
                status: None,
                error: Some(format!("Sume answered {status}")),
                next_poll_at: now_ms() + duration_ms(wait),
            });
        }
        if !status.is_success() {
            return Ok(again(None, Some(format!("Sume answered {status}"))));
        }
        let Some((job_status, event_type)) = parse_status(&answer.body) else {
            let mut error = "status answer is not a JSON object with a string `status`".to_owned();
            if let Some(why) = &answer.cut {
                error.push_str(&format!(" (it broke off: {why})"));
            }
            return Ok(again(None, Some(error)));
        };
        if !self.terminal.contains(&job_status) {
            return Ok(again(Some(job_status), None));
        }
        let event_type = event_type.unwrap_or_else(|| format!("job.{job_status}"));
        let event_type = match EventType::parse(&event_type) {
            Ok(event_type) => event_type,
            Err(error) => return Ok(again(Some(job_status), Some(error.to_string()))),
        };
        let body = String::from_utf8_lossy(&answer.body).into_owned();
        // The status answer's top-level fields, as a webhook's body would have them.
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&body).unwrap_or_default();
        let in_force = self.queue.in_force();
        let chosen = in_force.routes.select(Some(event_type.as_str()), &fields);
        let routing = Routing::chosen(&chosen, Some(&event_type));
        let claim = NewClaim {
            job_id: job_id.clone(),
            event_type: Some(event_type),
            body: body.into(),
            source: Source::Poll,
            routing,
            trace_context: span.context().map(SpanContext::to_stored),
        };
        let routes = claim.routing.routes().to_vec();
        let queued = std::time::Instant::now();
        let answered = self.ledger.claim(claim).await;
        METRICS.record_claim_wait(queued.elapsed());
        Ok(match answered? {
            ClaimOutcome::Claimed => {
                tracing::info!(job_id = %job_id, status = %Escaped(&job_status), "job recovered by polling: its webhook never arrived");
                METRICS.record_recovered();
                self.queue.enqueue(job_id, &routes);
                PollResult::Recovered { status: job_status }
            }
            ClaimOutcome::Duplicate => PollResult::Arrived { status: job_status },
        })
    }

    fn poll_backoff(&self, polls: u32) -> Duration {
        self.api
            .poll_backoff
            .saturating_mul(1u32 << polls.min(20))
            .min(self.api.max_poll_backoff)
    }

    fn auth_refused(&mut self, status: StatusCode) {
        if self.auth_refusals == 0 {
            tracing::error!(%status, "Sume refused our API key: check sume_api.api_key_file; polling is paused and retried with backoff");
        }
        let pause = self.poll_backoff(self.auth_refusals);
        self.auth_refusals = self.auth_refusals.saturating_add(1);
        self.paused_until = Some(Instant::now() + pause);
    }

    /// One authenticated call to `{base_url}/v1/jobs/{job_id}/{action}`.
    async fn call(
        &self,
        job_id: &JobId,
        action: &str,
        method: hyper::Method,
    ) -> Result<Answer, String> {
        call_sume(
            &self.client,
            &self.api,
            &self.api_key,
            job_id,
            action,
            method,
        )
        .await
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    let pass = tokio::select! {
                        report = self.reconcile_once() => report,
                        () = shutdown.cancelled() => break,
                    };
                    if let Err(error) = pass {
                        tracing::warn!(%error, "reconcile pass failed; trying again next tick");
                    }
                }
                () = shutdown.cancelled() => break,
            }
        }
    }
}

/// What a poll found, as its span says it.
fn poll_label(result: &PollResult) -> &'static str {
    match result {
        PollResult::Recovered { .. } => "recovered",
        PollResult::Arrived { .. } => "arrived",
        PollResult::GivenUp { .. } => "given_up",
        PollResult::Again { .. } => "again",
    }
}

/// An authenticated call to Sume's job API; used by the reconciler and `jobs redeliver`.
pub async fn call_sume(
    client: &HttpClient,
    api: &SumeApiConfig,
    api_key: &Secret,
    job_id: &JobId,
    action: &str,
    method: hyper::Method,
) -> Result<Answer, String> {
    let request = Request::builder()
        .method(method)
        .uri(job_url(&api.base_url, job_id, action))
        .header(AUTHORIZATION, format!("Bearer {}", api_key.expose()))
        .header("accept", "application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("cannot build the request: {e}"))?;
    http_client::send(client, request, api.request_timeout, MAX_ANSWER_BYTES)
        .await
        .map_err(|error| error.to_string())
}

/// `{base_url}/v1/jobs/{job_id}/{action}`, with the job_id percent-encoded.
fn job_url(base_url: &str, job_id: &JobId, action: &str) -> String {
    format!(
        "{}/v1/jobs/{}/{action}",
        base_url.trim_end_matches('/'),
        job_id.url_segment()
    )
}

/// `Retry-After` (seconds or an HTTP-date), kept between a second and an hour.
fn retry_after(answer: &Answer) -> Option<Duration> {
    let wait = http_client::retry_after(&answer.headers, std::time::SystemTime::now())?;
    Some(wait.clamp(Duration::from_secs(1), Duration::from_secs(3600)))
}

/// The job's `status`, and its event type if the answer names one (`type`, then `event`).
fn parse_status(body: &[u8]) -> Option<(String, Option<String>)> {
    let object: Map<String, Value> = serde_json::from_slice(body).ok()?;
    let status = object.get("status")?.as_str()?.to_owned();
    let event_type = ["type", "event"]
        .iter()
        .find_map(|key| object.get(*key)?.as_str())
        .map(str::to_owned);
    Some((status, event_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_urls_encode_the_job_id_under_the_base_url() {
        let job_id = JobId::parse("job 1/x").unwrap();
        for base_url in ["https://api.sume.example", "https://api.sume.example/"] {
            assert_eq!(
                job_url(base_url, &job_id, "status"),
                "https://api.sume.example/v1/jobs/job%201%2Fx/status"
            );
        }
    }

    #[test]
    fn status_answers_are_read_leniently_but_need_a_status() {
        assert_eq!(
            parse_status(br#"{"status":"completed","job_id":"j"}"#),
            Some(("completed".into(), None))
        );
        assert_eq!(
            parse_status(br#"{"status":"failed","type":"job.failed"}"#),
            Some(("failed".into(), Some("job.failed".into())))
        );
        assert_eq!(parse_status(br#"{"state":"completed"}"#), None);
        assert_eq!(parse_status(b"[]"), None);
    }
}
