//! The webhook request path: cheap header checks -> body (bounded) -> signature -> job_id ->
//! durable claim -> answer.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, RETRY_AFTER};
use hyper::{HeaderMap, Request, Response, StatusCode};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::acknowledged::RecentlyAcknowledged;
use crate::config::{Config, Routes, Secret};
use crate::duplicates::DuplicateTally;
use crate::event_type::EventType;
use crate::job_id::JobId;
use crate::ledger::{ClaimOutcome, Ledger, NewClaim, Routing, Source, StorageError};
use crate::logging::Escaped;
use crate::metrics::{DeliveryOutcome, METRICS};
use crate::paced_body::{PaceError, Paced, MIN_BYTES_PER_SECOND};
use crate::payload::{Field, KeyFields};
use crate::raw_body::RawBody;
use crate::refusals::Refusals;
use crate::response::json_response;
use crate::rollup::ROLLUP;
use crate::signature::{self, SignatureError, SignedHeaders};
use crate::traces::{self, Kind, Parent, Span, SpanContext, Tracer};
use crate::worker::Queues;

pub const TIMESTAMP_HEADER: &str = "x-sume-webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "x-sume-webhook-signature";
/// What a 503 tells Sume (and any other client) to wait before trying again.
const RETRY_AFTER_SECS: &str = "5";
/// Bodies up to this size (every real Sume delivery) have a share of the body budget to
/// themselves, so that a flood of large bodies cannot starve them.
const SMALL_BODY_BYTES: usize = 64 * 1024;
/// How long a delivery waits for room in the body budget before it is answered 503.
const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// Why a delivery was not acknowledged; each maps to one status code.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("body exceeds {limit} bytes")]
    TooLarge { limit: usize },
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("bad signature: {0}")]
    BadSignature(#[from] SignatureError),
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    #[error("the body did not arrive within {0:?}, or slower than {MIN_BYTES_PER_SECOND} bytes a second after its first second")]
    BodyTimeout(Duration),
    #[error("{0}")]
    BadPayload(String),
    #[error("too many request bodies in memory at once")]
    BodyBudgetExhausted,
    #[error("claim not committed: {0}")]
    Storage(#[from] StorageError),
    #[error("claim not committed within {0:?}")]
    ClaimTimeout(Duration),
}

impl IngestError {
    fn outcome(&self) -> DeliveryOutcome {
        match self {
            IngestError::TooLarge { .. } => DeliveryOutcome::TooLarge,
            IngestError::MissingHeader(_) | IngestError::BadSignature(_) => {
                DeliveryOutcome::Unauthorized
            }
            IngestError::BodyRead(_) | IngestError::BodyTimeout(_) | IngestError::BadPayload(_) => {
                DeliveryOutcome::BadRequest
            }
            IngestError::BodyBudgetExhausted
            | IngestError::Storage(_)
            | IngestError::ClaimTimeout(_) => DeliveryOutcome::Unavailable,
        }
    }

    fn status(&self) -> StatusCode {
        if let IngestError::BodyTimeout(_) = self {
            return StatusCode::REQUEST_TIMEOUT;
        }
        match self.outcome() {
            DeliveryOutcome::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            DeliveryOutcome::Unauthorized => StatusCode::UNAUTHORIZED,
            DeliveryOutcome::BadRequest => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// What the client is told. Signature failures all read the same, so a prober learns nothing.
    fn public_message(&self) -> String {
        match self.outcome() {
            DeliveryOutcome::Unauthorized => "invalid or missing signature".into(),
            DeliveryOutcome::Unavailable => "overloaded or storage unavailable, retry later".into(),
            _ => self.to_string(),
        }
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = json_response(
            self.status(),
            &serde_json::json!({ "error": self.public_message() }),
        );
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
        }
        response
    }
}

/// The answer to an acknowledged delivery: `{"job_id":"...","duplicate":false}`.
#[derive(Serialize)]
struct Acknowledged<'a> {
    job_id: &'a JobId,
    duplicate: bool,
}

/// What a delivery's headers promise, checked before its body is read.
#[derive(Debug)]
pub struct Prechecked<'a> {
    pub signed: SignedHeaders<'a>,
    /// The declared Content-Length (within the limit); `None` for a chunked body.
    pub declared_length: Option<usize>,
}

/// The checks that cost no body: a declared length within `max_body_bytes`, both signature
/// headers present, a fresh well-formed timestamp, at least one well-formed `sume-v1` entry.
/// Several signature header lines are read as one comma-separated list.
pub fn precheck(
    headers: &HeaderMap,
    max_body_bytes: usize,
    now_unix: i64,
    tolerance_secs: u64,
) -> Result<Prechecked<'_>, IngestError> {
    let declared_length = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let declared_length = match declared_length {
        Some(length) if length > max_body_bytes as u64 => {
            return Err(IngestError::TooLarge {
                limit: max_body_bytes,
            })
        }
        // Within the limit, so it fits a usize.
        Some(length) => Some(length as usize),
        None => None,
    };
    let mut timestamps = headers.get_all(TIMESTAMP_HEADER).iter();
    let timestamp = match (timestamps.next(), timestamps.next()) {
        (None, _) => return Err(IngestError::MissingHeader(TIMESTAMP_HEADER)),
        (Some(value), None) => value
            .to_str()
            .map_err(|_| SignatureError::MalformedTimestamp)?,
        (Some(_), Some(_)) => return Err(SignatureError::MalformedTimestamp.into()),
    };
    let mut lines = headers
        .get_all(SIGNATURE_HEADER)
        .iter()
        .filter_map(|value| value.to_str().ok());
    // One line, as Sume sends it, is read in place; only several are joined.
    let joined;
    let entries = match (lines.next(), lines.next()) {
        (None, _) => return Err(IngestError::MissingHeader(SIGNATURE_HEADER)),
        (Some(line), None) => line,
        (Some(first), Some(second)) => {
            joined = [first, second]
                .into_iter()
                .chain(lines)
                .collect::<Vec<_>>()
                .join(",");
            &joined
        }
    };
    let signed = signature::check_headers(timestamp, entries, now_unix, tolerance_secs)?;
    Ok(Prechecked {
        signed,
        declared_length,
    })
}

/// The whole check of one delivery, without I/O: [`precheck`], the body limit, the signature,
/// the payload. The service runs the same steps with the body read in between (and the fuzz
/// target runs this).
pub fn check_delivery<S: AsRef<[u8]>>(
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[S],
    now_unix: i64,
    tolerance_secs: u64,
    max_body_bytes: usize,
) -> Result<NewClaim, IngestError> {
    let prechecked = precheck(headers, max_body_bytes, now_unix, tolerance_secs)?;
    if body.len() > max_body_bytes {
        return Err(IngestError::TooLarge {
            limit: max_body_bytes,
        });
    }
    prechecked.signed.verify(secrets, body)?;
    parse_claim(Bytes::copy_from_slice(body), &Routes::default())
}

/// Bytes of request bodies held in memory at once, over all connections. A delivery reserves
/// its declared length (the limit, for a chunked body) before reading, and holds it until its
/// claim is answered.
struct BodyBudget {
    /// For bodies up to [`SMALL_BODY_BYTES`]: a quarter of the budget (less when the largest
    /// body needs it).
    small: Arc<Semaphore>,
    small_capacity: usize,
    large: Arc<Semaphore>,
}

impl BodyBudget {
    /// `total` is at least `max_body_bytes` (config validation), and at most 64 MiB x 1024.
    fn new(total: usize, max_body_bytes: usize) -> Self {
        let small_capacity = (total / 4).min(total - max_body_bytes);
        Self {
            small: Arc::new(Semaphore::new(small_capacity)),
            small_capacity,
            large: Arc::new(Semaphore::new(total - small_capacity)),
        }
    }

    async fn reserve(&self, bytes: usize) -> Result<OwnedSemaphorePermit, IngestError> {
        let lane = if bytes <= SMALL_BODY_BYTES && bytes <= self.small_capacity {
            &self.small
        } else {
            &self.large
        };
        let bytes = u32::try_from(bytes).map_err(|_| IngestError::BodyBudgetExhausted)?;
        // Room at once is the common case: no timer for it.
        if let Ok(permit) = lane.clone().try_acquire_many_owned(bytes) {
            return Ok(permit);
        }
        match tokio::time::timeout(BUDGET_WAIT, lane.clone().acquire_many_owned(bytes)).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(IngestError::BodyBudgetExhausted),
        }
    }
}

/// Verifies and claims deliveries; shared by every connection.
pub struct Ingest {
    /// Swapped whole on SIGHUP; a delivery verifies against the set it read at its start.
    secrets: RwLock<Arc<Vec<Secret>>>,
    tolerance_secs: u64,
    max_body_bytes: usize,
    body_read_timeout: Duration,
    claim_timeout: Duration,
    /// `[log] access`: an info line per acknowledged delivery.
    access_log: bool,
    budget: BodyBudget,
    ledger: Arc<Ledger>,
    /// Which routes a delivery takes (decided at its claim, written with it), and where each
    /// route's work goes to be worked on; none when no handler is configured.
    queue: Queues,
    /// The recent refusals, for the admin listener.
    refusals: Arc<Refusals>,
    duplicates: Arc<DuplicateTally>,
    /// Answers a duplicate of a recent claim without the ledger.
    recent: Arc<RecentlyAcknowledged>,
    tracer: Tracer,
    /// The delivery span's name: `POST <webhook path>` (HTTP's semantic conventions).
    span_name: String,
}

impl Ingest {
    pub fn new(
        config: &Config,
        secrets: Vec<Secret>,
        ledger: Arc<Ledger>,
        queue: Queues,
        (refusals, duplicates, recent): (
            Arc<Refusals>,
            Arc<DuplicateTally>,
            Arc<RecentlyAcknowledged>,
        ),
        tracer: Tracer,
    ) -> Self {
        let server = &config.server;
        Self {
            secrets: RwLock::new(Arc::new(secrets)),
            tolerance_secs: config.signature.tolerance.as_secs(),
            max_body_bytes: server.max_body_bytes,
            body_read_timeout: server.body_read_timeout,
            claim_timeout: server.claim_timeout,
            access_log: config.log.access,
            budget: BodyBudget::new(server.max_inflight_body_bytes, server.max_body_bytes),
            ledger,
            queue,
            refusals,
            duplicates,
            recent,
            tracer,
            span_name: format!("POST {}", server.webhook_path),
        }
    }

    /// The workers' queues, one per route; none when no handler is configured.
    pub fn queue(&self) -> &Queues {
        &self.queue
    }

    pub fn replace_secrets(&self, secrets: Vec<Secret>) {
        *self.secrets.write().expect("not poisoned") = Arc::new(secrets);
    }

    pub fn secret_count(&self) -> usize {
        self.secrets.read().expect("not poisoned").len()
    }

    /// Answers one delivery; logs it (the access log) with its outcome, status and latency.
    pub async fn handle(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<Full<Bytes>> {
        let span = self.delivery_span(&request, peer);
        let log_span = span.log_span();
        self.answer(request, peer, span).instrument(log_span).await
    }

    /// [`Ingest::handle`] within the delivery's span.
    async fn answer(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
        mut span: Span,
    ) -> Response<Full<Bytes>> {
        let started = Instant::now();
        match self.ingest(request, &mut span).await {
            Ok((job_id, outcome)) => {
                let duplicate = outcome == ClaimOutcome::Duplicate;
                span.set("sume.duplicate", duplicate);
                span.set("http.response.status_code", 200u16);
                let outcome = if duplicate {
                    self.duplicates.record(&job_id);
                    DeliveryOutcome::Duplicate
                } else {
                    DeliveryOutcome::Claimed
                };
                METRICS.record_delivery(outcome);
                if self.access_log {
                    tracing::info!(
                        job_id = %job_id,
                        outcome = outcome.label(),
                        status = 200,
                        latency_ms = milliseconds(started.elapsed()),
                        "delivery"
                    );
                }
                json_response(
                    StatusCode::OK,
                    &Acknowledged {
                        job_id: &job_id,
                        duplicate,
                    },
                )
            }
            Err(error) => {
                METRICS.record_delivery(error.outcome());
                let (status, outcome) = (error.status().as_u16(), error.outcome().label());
                span.set("http.response.status_code", status);
                span.fail(outcome, || error.to_string());
                self.refusals
                    .record(peer, status, outcome, &error.to_string());
                tracing::warn!(
                    %peer,
                    outcome = error.outcome().label(),
                    status = error.status().as_u16(),
                    latency_ms = milliseconds(started.elapsed()),
                    error = %Escaped(&error),
                    "delivery refused"
                );
                error.into_response()
            }
        }
    }

    /// The delivery's server span: a child of the request's `traceparent` when it has a valid
    /// one. Nothing, with tracing off.
    fn delivery_span(&self, request: &Request<Incoming>, peer: SocketAddr) -> Span {
        let inbound = traces::delivery_parent(&self.tracer, request.headers());
        let parent = inbound.as_ref().map_or(Parent::Root, Parent::Child);
        let mut span = self.tracer.start(&self.span_name, Kind::Server, parent);
        if span.is_recording() {
            span.set("http.request.method", request.method().as_str());
            span.set("http.route", &self.span_name["POST ".len()..]);
            span.set("client.address", peer.ip().to_string());
        }
        span
    }

    async fn ingest(
        &self,
        request: Request<Incoming>,
        span: &mut Span,
    ) -> Result<(JobId, ClaimOutcome), IngestError> {
        let (parts, body) = request.into_parts();
        let now = unix_now();
        let prechecked = precheck(
            &parts.headers,
            self.max_body_bytes,
            now,
            self.tolerance_secs,
        )?;
        let skew = prechecked.signed.skew_secs(now);
        let reserved = prechecked.declared_length.unwrap_or(self.max_body_bytes);
        let _budget = self.budget.reserve(reserved).await?;
        let body = read_body(body, reserved, self.max_body_bytes, self.body_read_timeout).await?;
        let secrets = self.secrets.read().expect("not poisoned").clone();
        let secret = prechecked.signed.verify_which(&secrets, &body)?;
        // Signed by one who knows a secret: no longer a stranger's slot to take.
        crate::connections::earned();
        ROLLUP.record_verified(secret, skew);
        METRICS.record_clock_skew(skew);

        let mut claim = parse_claim(body, &self.queue.in_force().routes)?;
        span.set("sume.job_id", claim.job_id.as_str());
        if let Some(event_type) = &claim.event_type {
            span.set("sume.event_type", event_type.as_str());
        }
        // Kept with the job, recorded or not: every attempt then follows the same decision.
        claim.trace_context = span.context().map(SpanContext::to_stored);
        let job_id = claim.job_id.clone();
        let routes = claim.routing.routes().to_vec();
        let queued = Instant::now();
        if self.recent.contains(&job_id, queued) {
            METRICS.record_duplicate_from_memory();
            return Ok((job_id, ClaimOutcome::Duplicate));
        }
        let claim_span = span.context().map(|delivery| {
            self.tracer
                .start("claim", Kind::Internal, Parent::Child(delivery))
        });
        let answered = tokio::time::timeout(self.claim_timeout, self.ledger.claim(claim))
            .await
            .map_err(|_| IngestError::ClaimTimeout(self.claim_timeout))?;
        drop(claim_span);
        METRICS.record_claim_wait(queued.elapsed());
        let outcome = answered?;
        self.recent.remember(&job_id, queued);
        if outcome == ClaimOutcome::Claimed {
            tracing::debug!(job_id = %job_id, "job claimed");
            self.queue.enqueue(&job_id, &routes);
        }
        Ok((job_id, outcome))
    }
}

/// Reads the body: a body that arrives in one piece (the usual case) is that piece of the
/// connection's read buffer, not a copy; one in several pieces is joined into one buffer of the
/// reserved size. More than `limit` bytes (a chunked body that never declared its length) is
/// refused as soon as it arrives. The whole body within `within`, and at the minimum rate
/// after its first second ([`Paced`]).
async fn read_body(
    body: Incoming,
    reserved: usize,
    limit: usize,
    within: Duration,
) -> Result<Bytes, IngestError> {
    let mut body = Paced::new(body, within);
    let mut first: Option<Bytes> = None;
    let mut joined = Vec::new();
    let mut length = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| match error {
            PaceError::TooSlow => IngestError::BodyTimeout(within),
            PaceError::Body(error) => IngestError::BodyRead(error.to_string()),
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        length += data.len();
        if length > limit {
            return Err(IngestError::TooLarge { limit });
        }
        if first.is_none() && joined.is_empty() {
            first = Some(data);
            continue;
        }
        if let Some(earlier) = first.take() {
            joined.reserve_exact(reserved.max(length));
            joined.extend_from_slice(&earlier);
        }
        joined.extend_from_slice(&data);
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

/// A duration in milliseconds to the microsecond, for log lines (`0.024`, not
/// `0.024036000000000002`).
fn milliseconds(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Reads the fields we key on from a verified body, and decides the routes it takes from them
/// in the same one read; the body itself is stored verbatim.
pub fn parse_claim(body: Bytes, routes: &Routes) -> Result<NewClaim, IngestError> {
    let bad = |reason: String| IngestError::BadPayload(reason);
    let body = RawBody::from_utf8(body).map_err(|_| bad("body is not UTF-8".into()))?;
    let (job_id, event_type, routing) = {
        let fields = KeyFields::read_routed(&body, routes.field_names())
            .map_err(|e| bad(format!("body is not a JSON object: {e}")))?;
        let job_id = match &fields.job_id {
            None | Some(Field::Null) => return Err(bad("job_id is missing".into())),
            Some(Field::Text(id)) => JobId::parse(id).map_err(|error| bad(error.to_string()))?,
            Some(Field::Other) => return Err(bad("job_id must be a string".into())),
        };
        let event_type = fields.event_type().map(EventType::parse).transpose();
        let event_type = event_type.map_err(|error| bad(error.to_string()))?;
        let chosen = routes.select(event_type.as_ref().map(EventType::as_str), &fields);
        let routing = Routing::chosen(&chosen, event_type.as_ref());
        (job_id, event_type, routing)
    };
    Ok(NewClaim {
        job_id,
        event_type,
        body,
        source: Source::Webhook,
        routing,
        trace_context: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_unit";
    const NOW: i64 = 1_767_225_600;

    #[test]
    fn log_latencies_are_milliseconds_to_the_microsecond() {
        assert_eq!(milliseconds(Duration::from_nanos(24_036)), 0.024);
        assert_eq!(milliseconds(Duration::from_micros(1_500)), 1.5);
        assert_eq!(
            format!("{:?}", milliseconds(Duration::from_nanos(24_036))),
            "0.024"
        );
    }

    fn parse(body: &str) -> Result<NewClaim, IngestError> {
        parse_claim(Bytes::copy_from_slice(body.as_bytes()), &Routes::default())
    }

    fn reason(body: &str) -> String {
        parse(body).unwrap_err().to_string()
    }

    /// Headers of a delivery of `body` signed at NOW, with these extra signature lines.
    fn headers(body: &str, signature_lines: &[String]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(TIMESTAMP_HEADER, NOW.to_string().parse().unwrap());
        headers.insert(CONTENT_LENGTH, body.len().into());
        for line in signature_lines {
            headers.append(SIGNATURE_HEADER, line.parse().unwrap());
        }
        headers
    }

    fn check(headers: &HeaderMap, body: &str) -> Result<NewClaim, IngestError> {
        check_delivery(headers, body.as_bytes(), &[SECRET], NOW, 300, 1024)
    }

    #[test]
    fn reads_job_id_and_event_type() {
        let claim = parse(r#"{"job_id":"j1","type":"job.completed","x":[1]}"#).unwrap();
        assert_eq!(claim.job_id.as_str(), "j1");
        let event_type = |claim: &NewClaim| claim.event_type.as_ref().map(|t| t.to_string());
        assert_eq!(event_type(&claim).as_deref(), Some("job.completed"));
        let claim = parse(r#"{"job_id":"j1","event":"job.failed"}"#).unwrap();
        assert_eq!(event_type(&claim).as_deref(), Some("job.failed"));
        assert_eq!(parse(r#"{"job_id":"j1"}"#).unwrap().event_type, None);
    }

    /// Regression: a `type` holding `\u0000` failed every claim batch it was in on PostgreSQL.
    #[test]
    fn an_event_type_with_a_control_character_is_refused_with_the_reason() {
        let error = parse(r#"{"job_id":"j1","type":"job\u0000completed"}"#).unwrap_err();
        assert!(
            error.to_string().contains("control character (U+0000)"),
            "{error}"
        );
    }

    #[test]
    fn keeps_the_body_verbatim() {
        let body = "{ \"job_id\" : \"j1\",\n \"n\": 1.50 }";
        assert_eq!(parse(body).unwrap().body, body);
    }

    #[test]
    fn refuses_bad_job_ids_with_a_reason() {
        assert!(reason("{}").contains("job_id is missing"));
        assert!(reason(r#"{"job_id":null}"#).contains("job_id is missing"));
        assert!(reason(r#"{"job_id":""}"#).contains("job_id is empty"));
        assert!(reason(r#"{"job_id":42}"#).contains("job_id must be a string"));
        let long = format!(r#"{{"job_id":"{}"}}"#, "x".repeat(256));
        assert!(reason(&long).contains("longer than 255"));
        let max = format!(r#"{{"job_id":"{}"}}"#, "x".repeat(255));
        assert!(parse(&max).is_ok());
        assert!(reason(r#"{"job_id":"a\u0000b"}"#).contains("control character (U+0000)"));
        assert!(reason(r#"{"job_id":"a\nINFO forged"}"#).contains("control character"));
        assert!(reason(r#"{"job_id":".."}"#).contains("`.` or `..`"));
        // Which of two would a handler's parser key on? Neither is taken.
        let twice = reason(r#"{"job_id":"a","n":1,"job_id":"b"}"#);
        assert!(twice.contains("duplicate key `job_id`"), "{twice}");
    }

    #[test]
    fn refuses_non_objects() {
        assert!(reason("[\"job_id\"]").contains("not a JSON object"));
        assert!(reason("not json").contains("not a JSON object"));
        assert!(
            parse_claim(Bytes::from_static(&[0xff, 0xfe]), &Routes::default())
                .unwrap_err()
                .to_string()
                .contains("UTF-8")
        );
    }

    #[test]
    fn a_signed_delivery_passes_every_check() {
        let body = r#"{"job_id":"j1"}"#;
        let signature = signature::sign(&[SECRET], &NOW.to_string(), body.as_bytes());
        let claim = check(&headers(body, &[signature]), body).unwrap();
        assert_eq!(claim.job_id.as_str(), "j1");
    }

    #[test]
    fn several_signature_header_lines_are_one_list() {
        let body = r#"{"job_id":"j1"}"#;
        let good = signature::sign(&[SECRET], &NOW.to_string(), body.as_bytes());
        let lines = [format!("sume-v1={}", "00".repeat(32)), good];
        assert!(check(&headers(body, &lines), body).is_ok());
    }

    #[test]
    fn headers_are_checked_before_any_body() {
        let body = r#"{"job_id":"j1"}"#;
        let good = signature::sign(&[SECRET], &NOW.to_string(), body.as_bytes());
        let precheck = |headers: &HeaderMap| precheck(headers, 1024, NOW, 300).map(drop);

        let mut missing = headers(body, &[]);
        assert!(matches!(
            precheck(&missing),
            Err(IngestError::MissingHeader(SIGNATURE_HEADER))
        ));
        missing.remove(TIMESTAMP_HEADER);
        assert!(matches!(
            precheck(&missing),
            Err(IngestError::MissingHeader(TIMESTAMP_HEADER))
        ));

        let mut stale = headers(body, std::slice::from_ref(&good));
        stale.insert(TIMESTAMP_HEADER, (NOW - 301).to_string().parse().unwrap());
        assert!(matches!(
            precheck(&stale),
            Err(IngestError::BadSignature(SignatureError::StaleTimestamp))
        ));

        let mut twice = headers(body, std::slice::from_ref(&good));
        twice.append(TIMESTAMP_HEADER, NOW.to_string().parse().unwrap());
        assert!(matches!(
            precheck(&twice),
            Err(IngestError::BadSignature(
                SignatureError::MalformedTimestamp
            ))
        ));

        let malformed = headers(body, &["sume-v1=zz".to_owned()]);
        assert!(matches!(
            precheck(&malformed),
            Err(IngestError::BadSignature(SignatureError::NoEntries))
        ));

        let mut too_long = headers(body, &[good]);
        too_long.insert(CONTENT_LENGTH, 1025.into());
        assert!(matches!(
            precheck(&too_long),
            Err(IngestError::TooLarge { limit: 1024 })
        ));
    }

    #[tokio::test]
    async fn the_body_budget_keeps_a_share_for_small_bodies() {
        let budget = BodyBudget::new(4 * 1024 * 1024, 1024 * 1024);
        let large: Vec<_> = reserve_each(&budget, 3, 1024 * 1024).await;
        assert!(large.iter().all(Result::is_ok), "3 MiB of large bodies fit");
        assert!(
            matches!(
                budget.reserve(1024 * 1024).await,
                Err(IngestError::BodyBudgetExhausted)
            ),
            "a fourth large body waits, then is refused"
        );
        assert!(
            budget.reserve(2048).await.is_ok(),
            "a small body still has room"
        );
    }

    async fn reserve_each(
        budget: &BodyBudget,
        count: usize,
        bytes: usize,
    ) -> Vec<Result<OwnedSemaphorePermit, IngestError>> {
        let mut permits = Vec::new();
        for _ in 0..count {
            permits.push(budget.reserve(bytes).await);
        }
        permits
    }
}
