//! The trace exporter's metrics: spans exported, and spans dropped (a full queue, a failed export).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

type Reason = [(&'static str, &'static str); 1];

#[derive(Default)]
pub struct TraceMetrics {
    exported: Counter,
    dropped: Family<Reason, Counter>,
}

impl TraceMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        // Served at 0 from the start, so that a rate over them needs no first drop.
        for reason in ["queue_full", "export_failed"] {
            self.dropped.get_or_create(&[("reason", reason)]).inc_by(0);
        }
        registry.register(
            "sume_trace_spans_exported",
            "Spans the OTLP collector accepted",
            self.exported.clone(),
        );
        registry.register(
            "sume_trace_spans_dropped",
            "Spans not exported, by reason (queue_full: the exporter fell behind; export_failed: the collector was down, slow or refusing): no delivery or attempt waits for the exporter",
            self.dropped.clone(),
        );
    }

    pub fn record_exported(&self, spans: u64) {
        self.exported.inc_by(spans);
    }

    pub fn record_dropped(&self, reason: &'static str, spans: u64) {
        self.dropped
            .get_or_create(&[("reason", reason)])
            .inc_by(spans);
    }

    /// Spans dropped so far for `reason`, for the tests.
    #[cfg(test)]
    pub fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&[("reason", reason)]).get()
    }
}
