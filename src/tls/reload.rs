//! Certificate files read again on SIGHUP and when they change; a bad new pair keeps the old one.
//!
//! A change is seen by looking at both paths every `watch_interval`, following symlinks: an
//! edit in place, a rename over the file (cert-manager, `install`), certbot's `live/` links
//! moved to a new archive and Kubernetes' `..data` swap each change what a path leads to. No
//! watch of inodes, which misses the last two.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::certificate::Certificate;
use super::store::CertificateStore;
use super::Hangups;
use crate::config::Listener;
use crate::metrics::METRICS;

/// The key and the certificate are written at different moments: a change that does not load
/// is read once more after this, before it counts as a failure.
const SETTLE: Duration = Duration::from_secs(1);

/// A listener's certificate and key files.
pub(super) struct Files {
    cert: PathBuf,
    key: PathBuf,
    watch_interval: Duration,
}

/// What a path leads to, and when that was last written: equal while the file is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    device: u64,
    inode: u64,
    size: u64,
    modified_ns: i64,
    changed_ns: i64,
}

fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let metadata = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        device: metadata.dev(),
        inode: metadata.ino(),
        size: metadata.size(),
        modified_ns: metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec(),
        changed_ns: metadata.ctime() * 1_000_000_000 + metadata.ctime_nsec(),
    })
}

/// Why the files were read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// SIGHUP (`systemctl reload`).
    Asked,
    /// One of the files changed.
    Changed,
}

impl Files {
    pub(super) fn new(cert: &Path, key: &Path, watch_interval: Duration) -> Files {
        Files {
            cert: cert.to_owned(),
            key: key.to_owned(),
            watch_interval,
        }
    }

    /// The pair as the files have it now, if it loads, is fit to serve, and covers every
    /// name `serving` covers: a certificate that drops a name would make every sender of that
    /// name fail its handshake, which is almost always a wrong file, not a wish (a restart
    /// serves whatever the files hold).
    fn load(
        &self,
        listener: Listener,
        serving: Option<&Certificate>,
    ) -> anyhow::Result<Certificate> {
        let loaded = Certificate::from_files(&self.cert, &self.key).and_then(super::fit);
        let loaded = loaded.and_then(|certificate| {
            let dropped = serving.map(|old| certificate.about.dropped_names(&old.about));
            match dropped.filter(|names| !names.is_empty()) {
                Some(names) => anyhow::bail!(
                    "{}: it does not cover {}, which the certificate in use covers: refused \
                     (restart the service to serve it anyway)",
                    self.cert.display(),
                    names.join(", ")
                ),
                None => Ok(certificate),
            }
        });
        loaded.with_context(|| format!("[{}]", listener.table()))
    }

    fn fingerprints(&self) -> [Option<Fingerprint>; 2] {
        [fingerprint(&self.cert), fingerprint(&self.key)]
    }

    /// Reads the files again on SIGHUP and whenever they change, until `stop`.
    pub(super) async fn watch(
        &self,
        store: &CertificateStore,
        listener: Listener,
        stop: CancellationToken,
    ) {
        let mut hangups = Hangups::new("certificates reload when their files change");
        let mut seen = self.fingerprints();
        let mut ticker = tokio::time::interval(self.watch_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            let cause = tokio::select! {
                _ = ticker.tick() => Cause::Changed,
                () = hangups.next() => Cause::Asked,
                () = stop.cancelled() => break,
            };
            let now = self.fingerprints();
            if cause == Cause::Changed && now == seen {
                continue;
            }
            seen = now;
            let loaded = self.reload_once(store, listener, cause, cause == Cause::Asked);
            if loaded.is_err() && cause == Cause::Changed {
                tokio::select! {
                    () = tokio::time::sleep(SETTLE) => {}
                    () = stop.cancelled() => break,
                }
                seen = self.fingerprints();
                let _ = self.reload_once(store, listener, cause, true);
            }
        }
    }

    /// Reads the pair again and serves it from the next handshake on, if it loads and is fit
    /// to serve; otherwise the one in use stays. With `report`, a failure is logged and
    /// counted (a change may be read again first: see `SETTLE`).
    fn reload_once(
        &self,
        store: &CertificateStore,
        listener: Listener,
        cause: Cause,
        report: bool,
    ) -> anyhow::Result<()> {
        let serving = store.current();
        match self.load(listener, serving.as_deref()) {
            Ok(certificate) => {
                let about = certificate.about.clone();
                store.replace(certificate);
                tracing::info!(
                    %listener,
                    cause = ?cause,
                    names = %about.names.join(","),
                    not_after = %humantime::format_rfc3339_seconds(about.not_after),
                    "TLS certificate reloaded"
                );
                Ok(())
            }
            Err(error) => {
                if report {
                    METRICS.tls.record_certificate_failure(listener, "reload");
                    let serving = serving.map(|current| current.about.not_after);
                    tracing::error!(
                        %listener,
                        cause = ?cause,
                        error = format!("{error:#}"),
                        serving_not_after = %serving.map(humantime::format_rfc3339_seconds).map(|at| at.to_string()).unwrap_or_default(),
                        "TLS certificate reload failed; the certificate in use keeps serving"
                    );
                }
                Err(error)
            }
        }
    }
}
