//! A value read from the ledger and kept for a while.

use std::time::Duration;

/// A value read from the ledger and shown as read for a while: however many viewers poll a
/// page, the ledger pays for it once per period.
pub(super) struct Fresh<T> {
    period: Duration,
    read: tokio::sync::Mutex<Option<(std::time::Instant, T)>>,
}

impl<T: Clone> Fresh<T> {
    pub(super) fn new(period: Duration) -> Fresh<T> {
        Fresh {
            period,
            read: tokio::sync::Mutex::new(None),
        }
    }

    /// The value read less than a period ago, or `read`'s (a failed read is not kept).
    pub(super) async fn get_or_read<F, E>(&self, read: impl FnOnce() -> F) -> Result<T, E>
    where
        F: std::future::Future<Output = Result<T, E>>,
    {
        let mut kept = self.read.lock().await;
        if let Some((at, value)) = kept.as_ref() {
            if at.elapsed() < self.period {
                return Ok(value.clone());
            }
        }
        let value = read().await?;
        *kept = Some((std::time::Instant::now(), value.clone()));
        Ok(value)
    }

    /// The next look reads afresh.
    pub(super) async fn forget(&self) {
        *self.read.lock().await = None;
    }
}
