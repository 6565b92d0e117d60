//! The webhook request path: body limit -> signature -> job_id -> durable claim -> answer.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use serde_json::{Map, Value};

use crate::config::{Config, Secret};
use crate::ledger::{ClaimOutcome, Ledger, NewClaim, Source, StorageError};
use crate::metrics::{DeliveryOutcome, METRICS};
use crate::signature::{self, SignatureError};
use crate::worker::Queue;

pub const TIMESTAMP_HEADER: &str = "x-sume-webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "x-sume-webhook-signature";
/// Longest job_id we accept: the ledger key, shown in logs and the CLI.
pub const MAX_JOB_ID_BYTES: usize = 255;
/// What a 503 tells Sume (and any other client) to wait before trying again.
const RETRY_AFTER_SECS: &str = "5";

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
    #[error("the body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    #[error("{0}")]
    BadPayload(String),
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
            IngestError::Storage(_) | IngestError::ClaimTimeout(_) => DeliveryOutcome::Unavailable,
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
            DeliveryOutcome::Unavailable => "storage unavailable, retry later".into(),
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

pub fn json_response(status: StatusCode, value: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Verifies and claims deliveries; shared by every connection.
pub struct Ingest {
    secrets: Vec<Secret>,
    tolerance_secs: u64,
    max_body_bytes: usize,
    body_read_timeout: Duration,
    claim_timeout: Duration,
    ledger: Arc<Ledger>,
    /// Where a new claim goes to be worked on; `None` when no handler is configured.
    queue: Option<Queue>,
}

impl Ingest {
    pub fn new(config: &Config, ledger: Arc<Ledger>, queue: Option<Queue>) -> Self {
        Self {
            secrets: config.signature.secrets.clone(),
            tolerance_secs: config.signature.tolerance.as_secs(),
            max_body_bytes: config.server.max_body_bytes,
            body_read_timeout: config.server.body_read_timeout,
            claim_timeout: config.server.claim_timeout,
            ledger,
            queue,
        }
    }

    pub async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        match self.ingest(request).await {
            Ok((job_id, outcome)) => {
                let duplicate = outcome == ClaimOutcome::Duplicate;
                METRICS.record_delivery(if duplicate {
                    DeliveryOutcome::Duplicate
                } else {
                    DeliveryOutcome::Claimed
                });
                tracing::debug!(job_id = %job_id, duplicate, "delivery acknowledged");
                json_response(
                    StatusCode::OK,
                    &serde_json::json!({ "job_id": job_id, "duplicate": duplicate }),
                )
            }
            Err(error) => {
                METRICS.record_delivery(error.outcome());
                tracing::warn!(status = error.status().as_u16(), %error, "delivery refused");
                error.into_response()
            }
        }
    }

    async fn ingest(
        &self,
        request: Request<Incoming>,
    ) -> Result<(String, ClaimOutcome), IngestError> {
        let (parts, body) = request.into_parts();
        let too_large = IngestError::TooLarge {
            limit: self.max_body_bytes,
        };
        let declared_length = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if declared_length.is_some_and(|length| length > self.max_body_bytes as u64) {
            return Err(too_large);
        }
        let header = |name: &'static str| {
            parts
                .headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .ok_or(IngestError::MissingHeader(name))
        };
        let timestamp = header(TIMESTAMP_HEADER)?;
        let signature_header = header(SIGNATURE_HEADER)?;

        // Limited also stops a chunked body that never declared its length.
        let collect = Limited::new(body, self.max_body_bytes).collect();
        let body = match tokio::time::timeout(self.body_read_timeout, collect).await {
            Err(_) => return Err(IngestError::BodyTimeout(self.body_read_timeout)),
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
                return Err(too_large)
            }
            Ok(Err(error)) => return Err(IngestError::BodyRead(error.to_string())),
        };

        signature::verify(
            &self.secrets,
            timestamp,
            &body,
            signature_header,
            unix_now(),
            self.tolerance_secs,
        )?;

        let claim = parse_claim(&body)?;
        let job_id = claim.job_id.clone();
        let outcome = tokio::time::timeout(self.claim_timeout, self.ledger.claim(claim))
            .await
            .map_err(|_| IngestError::ClaimTimeout(self.claim_timeout))??;
        if outcome == ClaimOutcome::Claimed {
            tracing::debug!(job_id = %job_id, "job claimed");
            if let Some(queue) = &self.queue {
                queue.enqueue(&job_id);
            }
        }
        Ok((job_id, outcome))
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Reads the fields we key on from a verified body; the body itself is stored verbatim.
pub fn parse_claim(body: &[u8]) -> Result<NewClaim, IngestError> {
    let bad = |reason: String| IngestError::BadPayload(reason);
    let text = std::str::from_utf8(body).map_err(|_| bad("body is not UTF-8".into()))?;
    let object: Map<String, Value> =
        serde_json::from_str(text).map_err(|e| bad(format!("body is not a JSON object: {e}")))?;
    let job_id = match object.get("job_id") {
        None | Some(Value::Null) => return Err(bad("job_id is missing".into())),
        Some(Value::String(id)) if id.is_empty() => return Err(bad("job_id is empty".into())),
        Some(Value::String(id)) if id.len() > MAX_JOB_ID_BYTES => {
            return Err(bad(format!(
                "job_id is longer than {MAX_JOB_ID_BYTES} bytes"
            )))
        }
        Some(Value::String(id)) => id.clone(),
        Some(_) => return Err(bad("job_id must be a string".into())),
    };
    let event_type = ["type", "event"]
        .iter()
        .find_map(|key| object.get(*key).and_then(Value::as_str))
        .map(str::to_owned);
    Ok(NewClaim {
        job_id,
        event_type,
        body: text.to_owned(),
        source: Source::Webhook,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(body: &str) -> String {
        parse_claim(body.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn reads_job_id_and_event_type() {
        let claim = parse_claim(br#"{"job_id":"j1","type":"job.completed","x":[1]}"#).unwrap();
        assert_eq!(claim.job_id, "j1");
        assert_eq!(claim.event_type.as_deref(), Some("job.completed"));
        let claim = parse_claim(br#"{"job_id":"j1","event":"job.failed"}"#).unwrap();
        assert_eq!(claim.event_type.as_deref(), Some("job.failed"));
        assert_eq!(parse_claim(br#"{"job_id":"j1"}"#).unwrap().event_type, None);
    }

    #[test]
    fn keeps_the_body_verbatim() {
        let body = "{ \"job_id\" : \"j1\",\n \"n\": 1.50 }";
        assert_eq!(parse_claim(body.as_bytes()).unwrap().body, body);
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
        assert!(parse_claim(max.as_bytes()).is_ok());
    }

    #[test]
    fn refuses_non_objects() {
        assert!(reason("[\"job_id\"]").contains("not a JSON object"));
        assert!(reason("not json").contains("not a JSON object"));
        assert!(parse_claim(&[0xff, 0xfe])
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
    }
}
