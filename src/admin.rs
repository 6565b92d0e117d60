//! The admin listener: the application registers the job_ids it expects Sume to report.
//!
//! `PUT /v1/expected/{job_id}` (or POST) with `Authorization: Bearer <token>` registers a job
//! for reconciliation; registering twice is harmless. Off unless `[admin] token_file` is set.
//! It also serves `/healthz`, `/readyz` and `/metrics` (no token: read-only, loopback).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request, Response, StatusCode};

use crate::config::Secret;
use crate::ingest::json_response;
use crate::job_id::JobId;
use crate::ledger::{self, duration_ms, now_ms, Ledger};
use crate::server::{error_response, Router};

const EXPECTED_PREFIX: &str = "/v1/expected/";

pub struct Admin {
    pub ledger: Arc<Ledger>,
    pub token: Secret,
    pub reconcile_after: Duration,
}

/// Registers `job_id` as expected, first polled `reconcile_after` from now. `true` if new.
pub async fn expect(
    ledger: &Ledger,
    job_id: JobId,
    reconcile_after: Duration,
) -> Result<bool, ledger::StorageError> {
    let now = now_ms();
    let first_poll = now + duration_ms(reconcile_after);
    ledger.expect_job(&job_id, now, first_poll).await
}

/// Whether `candidate` is the token, compared in constant time.
fn bearer_matches(token: &Secret, candidate: &str) -> bool {
    use sha2::Digest;
    // Comparing digests keeps the time independent of where the strings first differ.
    let (a, b) = (
        sha2::Sha256::digest(token.expose()),
        sha2::Sha256::digest(candidate),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

impl Router for Admin {
    async fn route(&self, request: Request<Incoming>, _peer: SocketAddr) -> Response<Full<Bytes>> {
        // Read-only and on loopback by default: Prometheus and health checks need no token.
        if let Some(response) = crate::server::operational(&self.ledger, &request).await {
            return response;
        }
        let authorized = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().split_once(' '))
            // RFC 9110: the scheme is case-insensitive.
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .is_some_and(|(_, token)| bearer_matches(&self.token, token.trim()));
        if !authorized {
            return error_response(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
        }
        // One path segment: a raw '/' would make it another resource (`%2F` is part of an id).
        let Some(encoded) = request
            .uri()
            .path()
            .strip_prefix(EXPECTED_PREFIX)
            .filter(|segment| !segment.contains('/'))
        else {
            return error_response(StatusCode::NOT_FOUND, "not found");
        };
        if !matches!(*request.method(), Method::PUT | Method::POST) {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "use PUT or POST");
        }
        let job_id = match percent_encoding::percent_decode_str(encoded).decode_utf8() {
            Ok(decoded) => match JobId::parse(&decoded) {
                Ok(job_id) => job_id,
                Err(error) => return error_response(StatusCode::BAD_REQUEST, &error.to_string()),
            },
            Err(_) => return error_response(StatusCode::BAD_REQUEST, "job_id is not UTF-8"),
        };
        match expect(&self.ledger, job_id.clone(), self.reconcile_after).await {
            Ok(registered) => {
                tracing::info!(job_id = %job_id, registered, "expected job registered");
                json_response(
                    StatusCode::OK,
                    &serde_json::json!({ "job_id": job_id, "registered": registered }),
                )
            }
            Err(error) => {
                tracing::warn!(job_id = %job_id, %error, "could not register an expected job");
                error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage unavailable, retry later",
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_token_matches_only_itself() {
        let token = Secret::new("t0ken");
        assert!(bearer_matches(&token, "t0ken"));
        for other in ["t0ke", "t0ken ", ""] {
            assert!(!bearer_matches(&token, other), "{other:?}");
        }
    }
}
