//! The HTTPS listeners' metrics: whether each has a certificate and its expiry, failed loads,
//! refused handshakes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config::Listener;

type OfListener = [(&'static str, &'static str); 1];
type ListenerAnd = [(&'static str, &'static str); 2];

#[derive(Default)]
pub struct TlsMetrics {
    present: Family<OfListener, Gauge>,
    expiry: Family<OfListener, Gauge>,
    certificate_failures: Family<ListenerAnd, Counter>,
    handshakes_refused: Family<ListenerAnd, Counter>,
}

impl TlsMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "sume_tls_certificate_present",
            "Whether a listener (webhook, admin) has a TLS certificate to serve (1) or refuses every handshake for want of one (0: an ACME listener before its first order succeeds)",
            self.present.clone(),
        );
        registry.register(
            "sume_tls_certificate_expiry_timestamp_seconds",
            "When the certificate served on a listener (webhook, admin) expires, in seconds since the Unix epoch",
            self.expiry.clone(),
        );
        registry.register(
            "sume_tls_certificate_failures",
            "Certificates that could not be loaded or reloaded, by listener and operation (reload, obtain, renew): the one in use stays",
            self.certificate_failures.clone(),
        );
        registry.register(
            "sume_tls_handshakes_refused",
            "TLS connections closed before a request, by listener and reason (timeout, unknown_name, no_certificate, plain_http, failed)",
            self.handshakes_refused.clone(),
        );
    }

    /// Whether `listener` has a certificate to serve.
    pub fn set_present(&self, listener: Listener, present: bool) {
        self.present
            .get_or_create(&[("listener", listener.as_str())])
            .set(present.into());
    }

    /// The certificate now served on `listener` expires at `unix_seconds`.
    pub fn set_expiry(&self, listener: Listener, unix_seconds: i64) {
        self.expiry
            .get_or_create(&[("listener", listener.as_str())])
            .set(unix_seconds);
    }

    pub fn record_certificate_failure(&self, listener: Listener, operation: &'static str) {
        self.certificate_failures
            .get_or_create(&[("listener", listener.as_str()), ("operation", operation)])
            .inc();
    }

    pub fn record_handshake_refused(&self, listener: Listener, reason: &'static str) {
        self.handshakes_refused
            .get_or_create(&[("listener", listener.as_str()), ("reason", reason)])
            .inc();
    }
}
