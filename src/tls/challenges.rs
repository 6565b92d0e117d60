//! The answers to an ACME CA's validations while an order is open.
//!
//! TLS-ALPN-01 certificates are served by the listener's store, HTTP-01 key authorizations on
//! `http_listen`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

/// The ALPN protocol of TLS-ALPN-01 validations (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The open challenges of a listener's order; at most one per name.
#[derive(Default)]
pub(super) struct Challenges {
    /// TLS-ALPN-01: the self-signed certificate carrying the key authorization, by name.
    tls_alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    pub(super) http: Arc<HttpChallenges>,
}

/// HTTP-01 answers: the key authorization of each token, served at
/// `/.well-known/acme-challenge/{token}` on the http-01 listener.
#[derive(Default)]
pub struct HttpChallenges(Mutex<HashMap<String, String>>);

impl HttpChallenges {
    /// The answer to a request for `path`, if it is an open challenge's.
    pub fn answer(&self, path: &str) -> Option<String> {
        let token = path.strip_prefix("/.well-known/acme-challenge/")?;
        self.0.lock().expect("not poisoned").get(token).cloned()
    }
}

impl Challenges {
    /// The TLS-ALPN-01 certificate for `name`, while its challenge is open.
    pub(super) fn tls_alpn(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let name = name.to_ascii_lowercase();
        self.tls_alpn
            .lock()
            .expect("not poisoned")
            .get(&name)
            .cloned()
    }

    /// Opens the challenges of one order; they are forgotten when the guard drops, however
    /// the order ends.
    pub(super) fn open(&self) -> OpenChallenges<'_> {
        OpenChallenges(self)
    }

    fn clear(&self) {
        self.tls_alpn.lock().expect("not poisoned").clear();
        self.http.0.lock().expect("not poisoned").clear();
    }
}

/// The challenges of an order under way.
pub(super) struct OpenChallenges<'a>(&'a Challenges);

impl OpenChallenges<'_> {
    /// Answers TLS-ALPN-01 for `name` with a certificate carrying the key authorization's
    /// `digest`.
    pub(super) fn tls_alpn(&self, name: &str, digest: &[u8]) -> anyhow::Result<()> {
        let certificate = alpn_certificate(name, digest)?;
        self.0
            .tls_alpn
            .lock()
            .expect("not poisoned")
            .insert(name.to_ascii_lowercase(), Arc::new(certificate));
        Ok(())
    }

    /// Answers HTTP-01 for `token` with `key_authorization`.
    pub(super) fn http(&self, token: &str, key_authorization: &str) {
        self.0
            .http
            .0
            .lock()
            .expect("not poisoned")
            .insert(token.to_owned(), key_authorization.to_owned());
    }
}

impl Drop for OpenChallenges<'_> {
    fn drop(&mut self) {
        self.0.clear();
    }
}

/// The TLS-ALPN-01 answer for `name`: a self-signed certificate with the key authorization's
/// digest in its acmeIdentifier extension (RFC 8737).
fn alpn_certificate(name: &str, digest: &[u8]) -> anyhow::Result<CertifiedKey> {
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()])?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate()?;
    let certificate = params.self_signed(&key)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let chain = vec![CertificateDer::from(certificate.der().to_vec())];
    // Not `from_der`: its check of the pair parses the certificate with webpki, which refuses
    // the critical acmeIdentifier extension; the key was made for it here.
    let key = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)?;
    Ok(CertifiedKey::new(chain, key))
}
