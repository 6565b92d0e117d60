//! `Credentials`: the secrets the configuration names in files, each read once per start.

use std::path::Path;

use super::{
    CertificateSource, Config, LedgerConfig, Listener, PostgresUrl, PostgresUrlSource, Secret,
    TokenRole,
};
use crate::tls::certificate::Certificate;

/// What the service starts with: every credential the configuration names, as read once (by
/// the start-up check, which judges these very values: a file replaced afterwards changes
/// nothing until the next start, or, for the signing secrets, a SIGHUP).
#[derive(Debug)]
pub struct Credentials {
    /// `signature.secrets` and the lines of `signature.secrets_file`, newest first.
    pub signing_secrets: Vec<Secret>,
    /// `sume_api.api_key_file`'s key, with `[sume_api]`.
    pub api_key: Option<Secret>,
    /// The admin listener's tokens, with `[admin]`.
    pub admin_tokens: Option<AdminTokens>,
    /// The PostgreSQL ledger's URL (`database.url`, or read from `database.url_file`).
    pub database_url: Option<PostgresUrl>,
    /// The certificate and key of each listener that serves them from files (an ACME
    /// listener's come from its cache and its CA).
    pub certificates: Vec<(Listener, Certificate)>,
    /// The headers sent with each trace export (`tracing.headers_file`'s), with tracing on.
    pub trace_headers: Vec<(String, Secret)>,
}

/// The tokens of `[admin]`, as read from their files.
#[derive(Debug)]
pub struct AdminTokens {
    /// `token_file`'s: without it, no admin listener.
    pub operator: Option<Secret>,
    /// `read_token_file`'s.
    pub read: Option<Secret>,
    /// `[[admin.tokens]]`, in the file's order: name, role, token.
    pub named: Vec<(String, TokenRole, Secret)>,
}

/// A credential that could not be read, under the name the check reports it by.
#[derive(Debug)]
pub struct Unread {
    pub key: &'static str,
    pub error: anyhow::Error,
}

impl Credentials {
    /// Reads every credential; the first that cannot be read is the error (tests, and callers
    /// that start the service without the start-up check).
    pub fn read(config: &Config) -> anyhow::Result<Credentials> {
        let (credentials, unread) = Credentials::read_each(config);
        match unread.into_iter().next() {
            Some(unread) => Err(unread.error),
            None => Ok(credentials),
        }
    }

    /// Reads each credential on its own, so that one that cannot be read hides none of the
    /// others: those read (the others left empty), and each that could not be.
    pub fn read_each(config: &Config) -> (Credentials, Vec<Unread>) {
        let mut unread = Vec::new();
        let mut keep = Keep(&mut unread);
        let signing_secrets = keep
            .value("signing secrets", config.signing_secrets())
            .unwrap_or_default();
        let api_key = config
            .sume_api
            .as_ref()
            .and_then(|api| keep.value("sume_api.api_key_file", api.api_key()));
        let admin_tokens = config.admin.as_ref().map(|admin| AdminTokens {
            operator: keep.value("admin.token_file", admin.token()).flatten(),
            read: keep
                .value("admin.read_token_file", admin.read_token())
                .flatten(),
            named: keep
                .value("admin.tokens", admin.named_tokens())
                .unwrap_or_default(),
        });
        let database_url = match &config.database {
            LedgerConfig::Postgres(postgres) => keep.value("database.url_file", postgres.url()),
            LedgerConfig::Sqlite(_) => None,
        };
        let certificates = config
            .tls_listeners()
            .filter_map(|(listener, tls)| match &tls.source {
                CertificateSource::Files { cert, key } => keep
                    .value(listener.table(), Certificate::from_files(cert, key))
                    .map(|certificate| (listener, certificate)),
                CertificateSource::Acme(_) => None,
            })
            .collect();
        let trace_headers = config
            .tracing
            .as_ref()
            .and_then(|tracing| keep.value("tracing.headers_file", tracing.headers()))
            .unwrap_or_default();
        let credentials = Credentials {
            trace_headers,
            signing_secrets,
            api_key,
            admin_tokens,
            database_url,
            certificates,
        };
        (credentials, unread)
    }

    /// The certificate `listener` serves from files, read at start, for its TLS setup.
    pub fn take_certificate(&mut self, listener: Listener) -> Option<Certificate> {
        let at = self
            .certificates
            .iter()
            .position(|(of, _)| *of == listener)?;
        Some(self.certificates.swap_remove(at).1)
    }
}

impl Config {
    /// Every file that holds a secret, under its key: the listeners' private keys, the signing
    /// secrets, Sume's API key, the PostgreSQL URL (its password) and the admin tokens.
    pub fn secret_files(&self) -> Vec<(String, &Path)> {
        let mut files: Vec<(String, &Path)> = Vec::new();
        for (listener, tls) in self.tls_listeners() {
            if let CertificateSource::Files { key, .. } = &tls.source {
                files.push((format!("{}.key_file", listener.table()), key));
            }
        }
        if let Some(file) = self.signature.secrets_file.as_deref() {
            files.push(("signature.secrets_file".into(), file));
        }
        if let Some(api) = &self.sume_api {
            files.push(("sume_api.api_key_file".into(), &api.api_key_file));
        }
        if let Some(file) = self
            .tracing
            .as_ref()
            .and_then(|t| t.headers_file.as_deref())
        {
            files.push(("tracing.headers_file".into(), file));
        }
        if let LedgerConfig::Postgres(postgres) = &self.database {
            if let PostgresUrlSource::File(file) = &postgres.url {
                files.push(("database.url_file".into(), file));
            }
        }
        if let Some(admin) = &self.admin {
            if let Some(file) = admin.token_file.as_deref() {
                files.push(("admin.token_file".into(), file));
            }
            if let Some(file) = admin.read_token_file.as_deref() {
                files.push(("admin.read_token_file".into(), file));
            }
            for named in &admin.tokens {
                files.push((format!("admin.tokens {:?}", named.name), &named.file));
            }
        }
        files
    }
}

/// Keeps each value read, and each error under its key.
struct Keep<'a>(&'a mut Vec<Unread>);

impl Keep<'_> {
    fn value<T>(&mut self, key: &'static str, read: anyhow::Result<T>) -> Option<T> {
        read.map_err(|error| self.0.push(Unread { key, error }))
            .ok()
    }
}
