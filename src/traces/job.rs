//! A job's place in its trace: a delivery's parent (an inbound `traceparent`), an attempt's.

use hyper::HeaderMap;

use super::context::SpanContext;
use super::span::{Kind, Parent, Span, Tracer};
use crate::ledger::{Attempt, Ledger};

/// An inbound delivery's `traceparent` and `tracestate`, when valid (a proxy's, or Sume's):
/// the delivery's span is then its child. A malformed one is ignored.
pub fn delivery_parent(tracer: &Tracer, headers: &HeaderMap) -> Option<SpanContext> {
    if !tracer.is_on() {
        return None;
    }
    let traceparent = headers.get("traceparent")?;
    let tracestate = headers.get("tracestate").map(|value| value.as_bytes());
    SpanContext::from_headers(traceparent.as_bytes(), tracestate)
}

/// The span of one attempt, from the trace context kept with its job: the first attempt is a
/// child of the delivery's span; a later one (a retry, a run after a take-back) starts a new
/// trace linked to it, so that one trace does not grow for days. A job without a kept context
/// (claimed with tracing off, or unreadable now) starts a trace of its own.
pub async fn attempt_span(tracer: &Tracer, ledger: &Ledger, attempt: &Attempt) -> Span {
    if !tracer.is_on() {
        return Span::default();
    }
    let kept = match ledger.trace_context(&attempt.job_id).await {
        Ok(kept) => kept.as_deref().and_then(SpanContext::from_stored),
        Err(error) => {
            tracing::debug!(job_id = %attempt.job_id, %error, "cannot read the job's trace context; its attempt starts a trace");
            None
        }
    };
    let parent = match &kept {
        Some(delivery) if attempt.number == 1 => Parent::Child(delivery),
        Some(delivery) => Parent::Link(delivery),
        None => Parent::Root,
    };
    let name = match &attempt.event_type {
        Some(event_type) => format!("attempt {event_type}"),
        None => "attempt".to_owned(),
    };
    let mut span = tracer.start(&name, Kind::Consumer, parent);
    span.set("sume.job_id", attempt.job_id.as_str());
    if let Some(event_type) = &attempt.event_type {
        span.set("sume.event_type", event_type.as_str());
    }
    span.set("sume.attempt", attempt.number);
    span.set("sume.delivery_source", attempt.source.as_str());
    span
}
