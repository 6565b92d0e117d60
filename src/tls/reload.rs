//! Certificate files read again on SIGHUP and when they change; a bad new pair keeps the old one.
//!
//! A change is seen by looking at both paths every `watch_interval`, following symlinks: an
//! edit in place, a rename over the file (cert-manager, `install`), certbot's `live/` links
//! moved to a new archive and Kubernetes' `..data` swap each change what a path leads to. No
//! watch of inodes, which misses the last two.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{load, Tls};
use crate::metrics::METRICS;

/// The key and the certificate are written at different moments: a change that does not load
/// is read once more after this, before it counts as a failure.
const SETTLE: Duration = Duration::from_secs(1);

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
pub enum Cause {
    /// SIGHUP (`systemctl reload`).
    Asked,
    /// One of the files changed.
    Changed,
}

impl Tls {
    fn fingerprints(&self) -> [Option<Fingerprint>; 2] {
        [
            fingerprint(&self.config.cert_file),
            fingerprint(&self.config.key_file),
        ]
    }

    /// Reads the files again on SIGHUP and whenever they change, until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())
            .inspect_err(|error| {
                tracing::warn!(%error, "cannot handle SIGHUP: certificates reload when their files change");
            })
            .ok();
        let mut seen = self.fingerprints();
        let mut ticker = tokio::time::interval(self.config.watch_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            let cause = tokio::select! {
                _ = ticker.tick() => Cause::Changed,
                Some(()) = async { hangups.as_mut()?.recv().await } => Cause::Asked,
                () = stop.cancelled() => break,
            };
            let now = self.fingerprints();
            if cause == Cause::Changed && now == seen {
                continue;
            }
            seen = now;
            let loaded = self.reload_once(cause, cause == Cause::Asked);
            if loaded.is_err() && cause == Cause::Changed {
                tokio::select! {
                    () = tokio::time::sleep(SETTLE) => {}
                    () = stop.cancelled() => break,
                }
                seen = self.fingerprints();
                let _ = self.reload_once(cause, true);
            }
        }
    }

    /// Reads the pair again and serves it from the next handshake on, if it loads and is fit
    /// to serve; otherwise the one in use stays. With `report`, a failure is logged and
    /// counted (a change may be read again first: see `SETTLE`).
    pub fn reload_once(&self, cause: Cause, report: bool) -> anyhow::Result<()> {
        let listener = self.listener;
        match load(&self.config, listener) {
            Ok(certificate) => {
                let about = certificate.about.clone();
                self.store.replace(certificate);
                METRICS.tls.set_expiry(listener, about.not_after_unix());
                tracing::info!(
                    listener,
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
                    let serving = self.about();
                    tracing::error!(
                        listener,
                        cause = ?cause,
                        error = format!("{error:#}"),
                        serving_not_after = %humantime::format_rfc3339_seconds(serving.not_after),
                        "TLS certificate reload failed; the certificate in use keeps serving"
                    );
                }
                Err(error)
            }
        }
    }
}
