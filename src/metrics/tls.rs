//! The HTTPS listeners' metrics: each certificate's expiry, failed loads, refused handshakes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type ListenerAnd = [(&'static str, &'static str); 2];

#[derive(Default)]
pub struct TlsMetrics {
    expiry: Family<[(&'static str, &'static str); 1], Gauge>,
    certificate_failures: Family<ListenerAnd, Counter>,
    handshakes_refused: Family<ListenerAnd, Counter>,
}

impl TlsMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "sume_tls_certificate_expiry_timestamp_seconds",
            "When the certificate served on a listener (webhook, admin) expires, in seconds since the Unix epoch",
            self.expiry.clone(),
        );
        registry.register(
            "sume_tls_certificate_failures",
            "Certificates that could not be loaded or reloaded, by listener and operation (load, reload): the one in use stays",
            self.certificate_failures.clone(),
        );
        registry.register(
            "sume_tls_handshakes_refused",
            "TLS connections closed before a request, by listener and reason (timeout, unknown_name, plain_http, failed)",
            self.handshakes_refused.clone(),
        );
    }

    /// The certificate now served on `listener` expires at `unix_seconds`.
    pub fn set_expiry(&self, listener: &'static str, unix_seconds: i64) {
        self.expiry
            .get_or_create(&[("listener", listener)])
            .set(unix_seconds);
    }

    pub fn record_certificate_failure(&self, listener: &'static str, operation: &'static str) {
        self.certificate_failures
            .get_or_create(&[("listener", listener), ("operation", operation)])
            .inc();
    }

    pub fn record_handshake_refused(&self, listener: &'static str, reason: &'static str) {
        self.handshakes_refused
            .get_or_create(&[("listener", listener), ("reason", reason)])
            .inc();
    }
}
