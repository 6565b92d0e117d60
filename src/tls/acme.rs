//! Certificates from an ACME CA (RFC 8555): ordered, kept across restarts and renewed.
//!
//! The protocol is instant-acme's; this is the manager around it. The account key and the
//! certificate live in `cache_dir` (written whole, by rename), so a restart serves the cached
//! certificate and orders nothing. A certificate is renewed when a third of its lifetime is
//! left; a failed order is tried again after 2 minutes, then after twice as long each time up
//! to 6 hours (five failures in the first hour at most: Let's Encrypt allows five failed
//! validations per name and hour), while the certificate in use keeps serving.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::certificate::{About, Certificate};
use super::challenges::Challenges;
use super::store::CertificateStore;
use super::{fit, Hangups};
use crate::config::{redact_url, AcmeChallenge, AcmeConfig, Listener};
use crate::http_client::AcmeClient;
use crate::metrics::METRICS;

/// The longest one order may take, validations included.
const ORDER_DEADLINE: Duration = Duration::from_secs(300);
/// The first wait after a failed order; it doubles per failure up to `LONGEST_RETRY`.
const FIRST_RETRY: Duration = Duration::from_secs(120);
const LONGEST_RETRY: Duration = Duration::from_secs(6 * 3600);
/// How long the maintenance sleeps at most before it looks at the certificate again (a
/// suspended machine or a clock set forward must not sleep through a renewal).
const LOOK_AGAIN: Duration = Duration::from_secs(3600);

/// An ACME listener's certificates and their challenges.
pub(super) struct Acme {
    listener: Listener,
    config: AcmeConfig,
    pub(super) challenges: Arc<Challenges>,
}

impl Acme {
    pub(super) fn new(config: AcmeConfig, listener: Listener) -> Acme {
        Acme {
            listener,
            config,
            challenges: Arc::default(),
        }
    }

    /// Makes the cache directory (mode 0700) if it is not there.
    pub(super) fn make_cache_dir(&self) -> anyhow::Result<()> {
        let cache = &self.config.cache_dir;
        let table = self.listener.table();
        std::fs::create_dir_all(cache).with_context(|| {
            format!("{table}.acme.cache_dir: cannot create {}", cache.display())
        })?;
        std::fs::set_permissions(cache, std::fs::Permissions::from_mode(0o700)).with_context(|| {
            format!(
                "{table}.acme.cache_dir: cannot set {} to mode 0700",
                cache.display()
            )
        })
    }

    pub(super) fn directory(&self) -> &str {
        &self.config.directory
    }

    pub(super) fn challenge(&self) -> AcmeChallenge {
        self.config.challenge
    }

    pub(super) fn http_listen(&self) -> SocketAddr {
        self.config.http_listen
    }

    /// `<first domain>-<12 hex digits>`: one name per directory and set of domains, so that
    /// a change of either orders anew instead of serving a certificate for other names.
    fn cache_name(&self) -> String {
        let mut domains = self.config.domains.clone();
        domains.sort();
        let mut hash = Sha256::new();
        hash.update(self.config.directory.as_bytes());
        for domain in &domains {
            hash.update(b"\n");
            hash.update(domain.as_bytes());
        }
        let digest = hex::encode(hash.finalize());
        format!("{}-{}", self.config.domains[0], &digest[..12])
    }

    fn cert_path(&self) -> PathBuf {
        self.config
            .cache_dir
            .join(format!("{}.crt.pem", self.cache_name()))
    }

    fn key_path(&self) -> PathBuf {
        self.config
            .cache_dir
            .join(format!("{}.key.pem", self.cache_name()))
    }

    fn account_path(&self) -> PathBuf {
        let digest = hex::encode(Sha256::digest(self.config.directory.as_bytes()));
        self.config
            .cache_dir
            .join(format!("account-{}.json", &digest[..12]))
    }

    /// The cached certificate, if it is there, covers every domain and is fit to serve.
    pub(super) fn cached(&self) -> Option<Certificate> {
        self.read_cached()
            .inspect_err(|error| {
                tracing::warn!(
                    listener = %self.listener,
                    error = format!("{error:#}"),
                    "the cached TLS certificate cannot be served; ordering a new one"
                );
            })
            .ok()
            .flatten()
    }

    /// The cached certificate: `None` if none was obtained yet; an error if it is there but
    /// cannot be served (unreadable, not a pair, expired, or not for every domain).
    fn read_cached(&self) -> anyhow::Result<Option<Certificate>> {
        let (cert, key) = (self.cert_path(), self.key_path());
        if !cert.exists() {
            return Ok(None);
        }
        let certificate = Certificate::from_files(&cert, &key).and_then(fit)?;
        let domains = &self.config.domains;
        if let Some(uncovered) = domains.iter().find(|d| !certificate.about.covers(d)) {
            bail!("{}: it does not cover {uncovered}", cert.display());
        }
        Ok(Some(certificate))
    }

    /// Orders a certificate when there is none, renews it when a third of its lifetime is
    /// left, and retries failures with a growing delay, until `stop`.
    pub(super) async fn maintain(
        self: Arc<Self>,
        store: &CertificateStore,
        stop: CancellationToken,
    ) {
        let listener = self.listener;
        let mut failures = 0u32;
        let mut retry_at: Option<SystemTime> = None;
        let mut hangups =
            Hangups::new("a failed certificate order is retried on its schedule only");
        loop {
            let current = store.current().map(|current| current.about.clone());
            let due = match (retry_at, &current) {
                (Some(at), _) => at,
                (None, Some(about)) => renewal_due(about),
                (None, None) => SystemTime::now(),
            };
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            if !wait.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(wait.min(LOOK_AGAIN)) => continue,
                    // `systemctl reload` after fixing what made an order fail (DNS, a port):
                    // the next order now, not after the backoff. A due renewal stays due.
                    () = hangups.next() => {
                        if retry_at.take().is_some() {
                            tracing::info!(%listener, "SIGHUP: ordering the TLS certificate again now");
                        }
                        continue;
                    }
                    () = stop.cancelled() => break,
                }
            }
            let started = Instant::now();
            let ordered = tokio::select! {
                ordered = tokio::time::timeout(ORDER_DEADLINE, self.order()) => {
                    ordered.unwrap_or_else(|_| Err(anyhow::anyhow!("no certificate within {}s", ORDER_DEADLINE.as_secs())))
                }
                () = stop.cancelled() => break,
            };
            let operation = if current.is_some() { "renew" } else { "obtain" };
            match ordered {
                Ok(certificate) => {
                    (failures, retry_at) = (0, None);
                    tracing::info!(
                        %listener,
                        directory = %redact_url(&self.config.directory),
                        names = %certificate.about.names.join(","),
                        not_after = %humantime::format_rfc3339_seconds(certificate.about.not_after),
                        took_ms = started.elapsed().as_millis() as u64,
                        "{}",
                        if operation == "renew" { "TLS certificate renewed" } else { "TLS certificate obtained" }
                    );
                    store.replace(certificate);
                }
                Err(error) => {
                    failures += 1;
                    retry_at = Some(SystemTime::now() + retry_delay(failures));
                    METRICS.tls.record_certificate_failure(listener, operation);
                    tracing::error!(
                        %listener,
                        directory = %redact_url(&self.config.directory),
                        error = format!("{error:#}"),
                        retry_in_s = retry_delay(failures).as_secs(),
                        serving = current.is_some(),
                        "TLS certificate order failed; the certificate in use, if any, keeps serving"
                    );
                }
            }
        }
    }

    /// One order, from the account to the certificate written in the cache.
    async fn order(&self) -> anyhow::Result<Certificate> {
        let account = self.account().await?;
        let identifiers: Vec<Identifier> = self
            .config
            .domains
            .iter()
            .map(|domain| Identifier::Dns(domain.clone()))
            .collect();
        let mut order = account
            .new_order(&NewOrder::new(&identifiers))
            .await
            .context("the CA refused the order")?;
        let challenges = self.challenges.open();
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization = authorization.context("cannot read an authorization")?;
            match authorization.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                status => bail!("an authorization is {status:?}"),
            }
            let wanted = match self.config.challenge {
                AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
                AcmeChallenge::Http01 => ChallengeType::Http01,
            };
            let mut challenge = authorization
                .challenge(wanted.clone())
                .with_context(|| format!("the CA offers no {wanted:?} challenge"))?;
            let name = challenge.identifier().to_string();
            let key_authorization = challenge.key_authorization();
            match self.config.challenge {
                AcmeChallenge::TlsAlpn01 => {
                    challenges.tls_alpn(&name, key_authorization.digest().as_ref())?
                }
                AcmeChallenge::Http01 => {
                    challenges.http(&challenge.token, key_authorization.as_str())
                }
            }
            challenge
                .set_ready()
                .await
                .context("cannot tell the CA the challenge is ready")?;
        }
        let retries = RetryPolicy::new().timeout(Duration::from_secs(120));
        let status = order
            .poll_ready(&retries)
            .await
            .context("validation failed")?;
        if status != OrderStatus::Ready {
            bail!("the order is {status:?} after validation");
        }
        let key_pem = order
            .finalize()
            .await
            .context("the CA refused to finalize")?;
        let chain_pem = order
            .poll_certificate(&retries)
            .await
            .context("no certificate from the CA")?;
        write_whole(&self.key_path(), key_pem.as_bytes(), 0o600)?;
        write_whole(&self.cert_path(), chain_pem.as_bytes(), 0o600)?;
        let certificate = Certificate::from_files(&self.cert_path(), &self.key_path())?;
        fit(certificate)
    }

    /// The cached account, or a new one (written in the cache before it is used).
    async fn account(&self) -> anyhow::Result<Account> {
        let client = AcmeClient::trusting(self.config.directory_ca_file.as_deref())
            .context("tls.acme.directory_ca_file")?;
        let builder = Account::builder_with_http(Box::new(client));
        let path = self.account_path();
        if path.exists() {
            let text = std::fs::read(&path)
                .with_context(|| format!("cannot read the ACME account {}", path.display()))?;
            let credentials: AccountCredentials = serde_json::from_slice(&text)
                .with_context(|| format!("{}: not an ACME account", path.display()))?;
            return builder
                .from_credentials(credentials)
                .await
                .context("cannot reach the ACME directory");
        }
        let contact: Vec<&str> = self.config.contact.iter().map(String::as_str).collect();
        let (account, credentials) = builder
            .create(
                &NewAccount {
                    contact: &contact,
                    terms_of_service_agreed: true,
                    only_return_existing: false,
                },
                self.config.directory.clone(),
                None,
            )
            .await
            .context("cannot create an ACME account")?;
        write_whole(&path, &serde_json::to_vec(&credentials)?, 0o600)?;
        tracing::info!(listener = %self.listener, directory = %redact_url(&self.config.directory), "ACME account created");
        Ok(account)
    }
}

/// The certificate an ACME listener's cache holds for its directory and domains, which a start
/// serves at once: `None` if none was obtained yet (`check-config` says which). Only
/// `[server.tls]` orders from a CA.
pub fn cached_certificate(config: &AcmeConfig) -> anyhow::Result<Option<Certificate>> {
    Acme::new(config.clone(), Listener::Webhook).read_cached()
}

/// When a certificate is renewed: once a third of its lifetime is left.
fn renewal_due(about: &About) -> SystemTime {
    let lifetime = about
        .not_after
        .duration_since(about.not_before)
        .unwrap_or_default();
    about.not_after - lifetime / 3
}

/// The wait after the `failures`-th failure in a row.
fn retry_delay(failures: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1)))
        .min(LONGEST_RETRY)
}

/// Writes `bytes` to `path` whole or not at all: a temporary file, synced, renamed over it,
/// then the directory synced (a crash leaves the old file or the new one).
fn write_whole(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let temporary = path.with_extension("tmp");
    let written = (|| {
        // A temporary file left by a crash keeps its mode when opened: made anew, it has ours.
        match std::fs::remove_file(&temporary) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)?;
        std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
    })();
    written.with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a `.key.tmp` left at 0644 lent its mode to the new key.
    #[test]
    fn a_file_is_written_with_its_mode_whatever_was_left_before() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("hooks.example.key.pem");
        let leftover = key.with_extension("tmp");
        std::fs::write(&leftover, "half a key").unwrap();
        std::fs::set_permissions(&leftover, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_whole(&key, b"the key", 0o600).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&key).unwrap(), b"the key");
        assert!(!leftover.exists());
    }

    #[test]
    fn failed_orders_wait_longer_each_time_and_never_past_six_hours() {
        let waits: Vec<u64> = (1..=10).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(waits[..5], [120, 240, 480, 960, 1920]);
        assert_eq!(retry_delay(9).as_secs(), 6 * 3600);
        assert_eq!(retry_delay(1000).as_secs(), 6 * 3600);
        // Five orders in the first hour at most, the first one included.
        let mut at = 0;
        let mut in_first_hour = 1;
        for failures in 1.. {
            at += retry_delay(failures).as_secs();
            if at >= 3600 {
                break;
            }
            in_first_hour += 1;
        }
        assert_eq!(in_first_hour, 5);
    }

    #[test]
    fn a_certificate_is_renewed_when_a_third_of_its_lifetime_is_left() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let about = About {
            names: vec!["a.test".into()],
            issuer: "CN=ca".into(),
            not_before: start,
            not_after: start + Duration::from_secs(90 * 86_400),
        };
        assert_eq!(
            renewal_due(&about),
            start + Duration::from_secs(60 * 86_400)
        );
    }
}
