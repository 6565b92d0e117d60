//! The sweeper: takes back the leases of attempts that will never end.
//!
//! An attempt whose lease expired (its handler overran, or its receiver died) is recorded as
//! failed and its job made due again (or `dead` on its last attempt); the worker then takes it
//! from the ledger like any other due job.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ledger::{now_ms, Ledger, StorageError};
use crate::metrics::METRICS;
use crate::worker::Queue;

pub struct Sweeper {
    ledger: Arc<Ledger>,
    queue: Queue,
    max_attempts: u32,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub leases_expired: usize,
}

impl Sweeper {
    pub fn new(ledger: Arc<Ledger>, queue: Queue, max_attempts: u32) -> Self {
        Self {
            ledger,
            queue,
            max_attempts,
        }
    }

    /// At start: on a ledger of our own every `running` row belongs to a process that is gone
    /// (we hold the instance lock), so all of them are taken back at once instead of waiting
    /// for their leases. On a shared ledger other receivers run jobs right now: only expired
    /// leases are taken back, as at every sweep.
    pub async fn recover(&self) -> Result<SweepReport, StorageError> {
        if self.ledger.is_shared() {
            return self.sweep_once().await;
        }
        self.sweep(
            i64::MAX,
            "interrupted: the receiver stopped during this attempt",
        )
        .await
    }

    pub async fn sweep_once(&self) -> Result<SweepReport, StorageError> {
        self.sweep(
            now_ms(),
            "lease expired: the handler neither finished nor failed in time",
        )
        .await
    }

    async fn sweep(
        &self,
        leases_before: i64,
        reason: &'static str,
    ) -> Result<SweepReport, StorageError> {
        let max_attempts = self.max_attempts;
        let now = now_ms();
        let queue = self.queue.clone();
        let expired = self
            .ledger
            .expire_leases(leases_before, now, max_attempts, reason, move |job_id| {
                queue.holds(job_id)
            })
            .await?;
        if expired > 0 {
            METRICS.record_swept(expired);
            tracing::info!(leases_expired = expired, "sweep took back expired leases");
            self.queue.look_in_ledger();
        }
        Ok(SweepReport {
            leases_expired: expired,
        })
    }

    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        crate::repeat_every("sweeper", interval, &shutdown, || self.sweep_once()).await;
    }
}
