//! Where a certificate is chosen for each connection: the store rustls asks at every handshake.
//!
//! A listener serves one certificate at a time, replaced whole when a new one is loaded or
//! ordered, so that a new certificate is served from the next handshake on and open
//! connections keep theirs. An ACME listener's store also answers the CA's TLS-ALPN-01
//! validations while an order is open.

use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::certificate::Certificate;
use super::challenges::{Challenges, ACME_TLS_ALPN};
use crate::config::Listener;
use crate::metrics::METRICS;

/// The certificate a listener serves.
pub(super) struct CertificateStore {
    listener: Listener,
    current: RwLock<Option<Arc<Certificate>>>,
    /// An ACME listener's challenges: TLS-ALPN-01 validations are answered here.
    challenges: Option<Arc<Challenges>>,
}

/// Why no certificate fits a client's hello: the handshake is refused before it begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unserved {
    /// The listener has no certificate yet (an ACME listener before its first order succeeds).
    NoCertificate,
    /// The client asked for a name the certificate does not cover, or a CA validates a name
    /// with no open challenge.
    UnknownName,
}

impl Unserved {
    /// The label of `sume_tls_handshakes_refused`.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Unserved::NoCertificate => "no_certificate",
            Unserved::UnknownName => "unknown_name",
        }
    }

    /// The fatal alert the client hears (RFC 8446 6.2): `unrecognized_name` (RFC 6066 3) for a
    /// host this listener is not, so that a client says "unrecognized name" rather than
    /// "access denied" (rustls's answer when its resolver finds nothing); `internal_error`
    /// while the listener has no certificate at all, which is the server's fault.
    pub(super) fn alert(self) -> u8 {
        match self {
            Unserved::NoCertificate => 80,
            Unserved::UnknownName => 112,
        }
    }
}

/// Whether a hello offering these ALPN protocols is a CA's TLS-ALPN-01 validation.
pub(super) fn is_validation<'a>(mut alpn: Option<impl Iterator<Item = &'a [u8]>>) -> bool {
    alpn.as_mut()
        .is_some_and(|offered| offered.any(|protocol| protocol == ACME_TLS_ALPN))
}

impl CertificateStore {
    /// A store serving `certificate` (none yet: every handshake refused until one comes).
    pub(super) fn new(
        listener: Listener,
        certificate: Option<Certificate>,
        challenges: Option<Arc<Challenges>>,
    ) -> CertificateStore {
        let store = CertificateStore {
            listener,
            current: RwLock::new(None),
            challenges,
        };
        match certificate {
            Some(certificate) => store.replace(certificate),
            None => METRICS.tls.set_present(listener, false),
        }
        store
    }

    pub(super) fn current(&self) -> Option<Arc<Certificate>> {
        self.current.read().expect("not poisoned").clone()
    }

    /// Serves `certificate` from the next handshake on.
    pub(super) fn replace(&self, certificate: Certificate) {
        METRICS
            .tls
            .set_expiry(self.listener, certificate.about.not_after_unix());
        METRICS.tls.set_present(self.listener, true);
        *self.current.write().expect("not poisoned") = Some(Arc::new(certificate));
    }

    /// The key to serve a client asking for `server_name` (its SNI), or why there is none: the
    /// certificate, for a name it covers or for no name (a client connecting by IP address); a
    /// CA's TLS-ALPN-01 validation (`validation`) gets the challenge's certificate for its name.
    pub(super) fn choose(
        &self,
        server_name: Option<&str>,
        validation: bool,
    ) -> Result<Arc<CertifiedKey>, Unserved> {
        if validation {
            return self
                .challenges
                .as_ref()
                .zip(server_name)
                .and_then(|(challenges, name)| challenges.tls_alpn(name))
                .ok_or(Unserved::UnknownName);
        }
        let current = self.current().ok_or(Unserved::NoCertificate)?;
        match server_name {
            Some(name) if !current.about.covers(name) => Err(Unserved::UnknownName),
            _ => Ok(current.key.clone()),
        }
    }
}

impl std::fmt::Debug for CertificateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateStore")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CertificateStore {
    /// What [`CertificateStore::choose`] chose when the handshake began (`Tls::handshake`
    /// refuses the hellos it finds nothing for, with their own alert); asked again here
    /// because rustls takes the key from its resolver.
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.choose(hello.server_name(), is_validation(hello.alpn()))
            .ok()
    }
}
