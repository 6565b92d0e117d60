//! Traces (OpenTelemetry): spans of deliveries, attempts and handlers, exported over OTLP/HTTP.
//!
//! Off by default ([`Tracer::default`] starts spans that are nothing: no allocation, no
//! clock read). On, each ended span goes into a bounded queue without waiting ([`span`]); a
//! task exports the queue in batches ([`export`]), so that a collector that is down, slow or
//! refusing costs spans (dropped and counted), never a delivery or an attempt. The W3C trace
//! context ([`context`]) is read from a delivery, kept with its job in the ledger, and passed
//! on to the handler; [`job`] says how an attempt relates to its job's trace.

mod context;
mod export;
mod job;
mod span;

use tokio::sync::mpsc;

pub use context::SpanContext;
pub use export::Exporter;
pub use job::{attempt_span, delivery_parent};
pub use span::{Kind, Parent, Span, Tracer, Within};

use span::Sampler;

use crate::config::{Secret, TracingConfig};

/// The tracer and its exporter (to run as a task) for `config`, sending `headers` with each
/// export; with tracing off, a tracer that is off and no exporter.
pub fn start(
    config: Option<&TracingConfig>,
    headers: &[(String, Secret)],
) -> anyhow::Result<(Tracer, Option<Exporter>)> {
    let Some(config) = config else {
        return Ok((Tracer::default(), None));
    };
    let (queue, spans) = mpsc::channel(export::QUEUE);
    let sampler = Sampler {
        ratio: config.sample_ratio,
        parent_based: config.parent_based,
    };
    let exporter = Exporter::new(
        spans,
        config.endpoint.clone(),
        headers,
        config.service_name.clone(),
        config.timeout,
    )?;
    Ok((Tracer::new(sampler, queue), Some(exporter)))
}
