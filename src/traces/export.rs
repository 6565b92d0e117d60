//! The batch exporter: ended spans from a bounded queue, POSTed to the collector as OTLP protobuf.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::Request;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::context::SpanContext;
use super::span::{SpanData, Value};
use crate::config::Secret;
use crate::http_client::{self, HttpClient};
use crate::metrics::METRICS;
use crate::throttle::Throttled;

/// Spans waiting for export at most (OpenTelemetry's default `maxQueueSize`): past it, a span
/// is dropped and counted, so that a collector that is down costs memory that stays bounded.
pub const QUEUE: usize = 2048;
/// Most spans in one export (OpenTelemetry's default `maxExportBatchSize`).
const BATCH: usize = 512;
/// How often the queue is exported.
const EVERY: Duration = Duration::from_secs(1);
/// Bytes of a collector's answer kept (for the log line of a refusal).
const ANSWER_BYTES: usize = 512;

/// Sends the queue's spans to the collector, one batch at a time.
pub struct Exporter {
    spans: mpsc::Receiver<SpanData>,
    client: HttpClient,
    endpoint: hyper::Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
    service_name: String,
    timeout: Duration,
    failures: Throttled,
}

impl Exporter {
    pub fn new(
        spans: mpsc::Receiver<SpanData>,
        endpoint: hyper::Uri,
        headers: &[(String, Secret)],
        service_name: String,
        timeout: Duration,
    ) -> anyhow::Result<Exporter> {
        let headers = headers
            .iter()
            .map(|(name, value)| {
                let mut value = HeaderValue::from_str(value.expose())?;
                value.set_sensitive(true);
                Ok((HeaderName::from_bytes(name.as_bytes())?, value))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Exporter {
            spans,
            client: http_client::new_client(),
            endpoint,
            headers,
            service_name,
            timeout,
            failures: Throttled::new("cannot export spans to the OTLP collector; they are dropped and counted (sume_trace_spans_dropped_total)"),
        })
    }

    /// Exports every [`EVERY`] until `stop`; then what is left, within `grace`.
    pub async fn run(mut self, stop: CancellationToken, grace: Duration) {
        let mut ticks = tokio::time::interval(EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => while self.export_once().await == BATCH {},
                () = stop.cancelled() => break,
            }
        }
        let flushed =
            tokio::time::timeout(grace, async { while self.export_once().await > 0 {} }).await;
        if flushed.is_err() {
            tracing::warn!("the shutdown grace ran out before every span was exported");
        }
    }

    /// Exports up to one batch of the queue's spans; how many it took from the queue.
    pub async fn export_once(&mut self) -> usize {
        let mut batch = Vec::new();
        while batch.len() < BATCH {
            match self.spans.try_recv() {
                Ok(span) => batch.push(span),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            return 0;
        }
        let taken = batch.len();
        let body = encode(&self.service_name, batch);
        match self.post(body).await {
            Ok(()) => {
                METRICS.traces.record_exported(taken as u64);
                self.failures.recovered();
            }
            Err(why) => {
                METRICS.traces.record_dropped("export_failed", taken as u64);
                self.failures.warn(&why);
            }
        }
        taken
    }

    async fn post(&self, body: Vec<u8>) -> Result<(), String> {
        let mut request =
            Request::post(self.endpoint.clone()).header(CONTENT_TYPE, "application/x-protobuf");
        for (name, value) in &self.headers {
            request = request.header(name, value.clone());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| error.to_string())?;
        let answer = http_client::send(&self.client, request, self.timeout, ANSWER_BYTES)
            .await
            .map_err(|error| error.to_string())?;
        if answer.status.is_success() {
            return Ok(());
        }
        Err(format!(
            "the collector answered {}: {}",
            answer.status,
            crate::logging::Escaped(String::from_utf8_lossy(&answer.body).trim())
        ))
    }
}

/// One OTLP request of `spans`, under a resource named `service_name`.
pub fn encode(service_name: &str, spans: Vec<SpanData>) -> Vec<u8> {
    let resource = Resource {
        attributes: vec![key_value(
            "service.name",
            Value::Text(service_name.to_owned()),
        )],
        ..Default::default()
    };
    let scope = InstrumentationScope {
        name: env!("CARGO_PKG_NAME").to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..Default::default()
    };
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope),
                spans: spans.into_iter().map(span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    request.encode_to_vec()
}

fn span(data: SpanData) -> Span {
    let status = data.error.map(|message| Status {
        message,
        code: opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32,
    });
    Span {
        trace_id: data.context.trace_id.to_vec(),
        span_id: data.context.span_id.to_vec(),
        trace_state: data.context.trace_state.clone(),
        parent_span_id: data
            .parent_span_id
            .map(|id| id.to_vec())
            .unwrap_or_default(),
        flags: flags(&data.context),
        name: data.name,
        kind: data.kind as i32,
        start_time_unix_nano: data.start_unix_nanos,
        end_time_unix_nano: data.end_unix_nanos,
        attributes: data
            .attributes
            .into_iter()
            .map(|(key, value)| key_value(key, value))
            .collect(),
        links: data.links.iter().map(link).collect(),
        status,
        ..Default::default()
    }
}

fn link(linked: &SpanContext) -> span::Link {
    span::Link {
        trace_id: linked.trace_id.to_vec(),
        span_id: linked.span_id.to_vec(),
        trace_state: linked.trace_state.clone(),
        flags: flags(linked),
        ..Default::default()
    }
}

/// The W3C flags (sampled) in OTLP's `flags` field.
fn flags(context: &SpanContext) -> u32 {
    u32::from(context.sampled)
}

fn key_value(key: &str, value: Value) -> KeyValue {
    let value = match value {
        Value::Text(text) => any_value::Value::StringValue(text),
        Value::Int(number) => any_value::Value::IntValue(number),
        Value::Bool(flag) => any_value::Value::BoolValue(flag),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traces::span::Kind;

    #[test]
    fn encodes_what_the_protocol_decodes() {
        let context = SpanContext::root(true);
        let linked = SpanContext::root(true);
        let data = SpanData {
            name: "attempt".into(),
            kind: Kind::Consumer,
            context: context.clone(),
            parent_span_id: Some([7; 8]),
            links: vec![linked.clone()],
            start_unix_nanos: 1,
            end_unix_nanos: 2,
            attributes: vec![("sume.attempt", Value::Int(2))],
            error: Some("exited with status 1".into()),
        };
        let bytes = encode("hooks", vec![data]);
        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let resource = decoded.resource_spans[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "service.name");
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.trace_id, context.trace_id);
        assert_eq!(span.parent_span_id, [7; 8]);
        assert_eq!(span.kind, 5);
        assert_eq!(span.links[0].span_id, linked.span_id);
        assert_eq!(span.attributes[0].key, "sume.attempt");
        assert_eq!(span.status.as_ref().unwrap().code, 2);
    }
}
