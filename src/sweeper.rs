//! The sweeper: puts back to work the jobs nothing in this process is working on.
//!
//! It takes back expired leases (a handler's process died with the receiver, or overran), and
//! queues `claimed`/`retrying` jobs that are due but not held in memory (claimed while the queue
//! was full, retried by the CLI, or left over from before a restart).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ledger::{self, now_ms, Ledger, StorageError};
use crate::metrics::METRICS;
use crate::worker::Queue;

/// Most due jobs queued per sweep; the rest wait for the next one.
const SWEEP_BATCH: usize = 1000;

pub struct Sweeper {
    ledger: Arc<Ledger>,
    queue: Queue,
    max_attempts: u32,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub leases_expired: usize,
    pub queued: usize,
}

impl Sweeper {
    pub fn new(ledger: Arc<Ledger>, queue: Queue, max_attempts: u32) -> Self {
        Self {
            ledger,
            queue,
            max_attempts,
        }
    }

    /// At start: every `running` row belongs to a process that is gone (we hold the instance
    /// lock), so all of them are taken back at once instead of waiting for their leases.
    pub async fn recover(&self) -> Result<SweepReport, StorageError> {
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
            .write(move |conn| {
                ledger::expire_leases(conn, leases_before, now, max_attempts, reason, |job_id| {
                    queue.holds(job_id)
                })
            })
            .await?;
        // Ask for more than a batch so that jobs this process already holds do not crowd out
        // the ones it lost.
        let due = self
            .ledger
            .read(move |conn| ledger::due_jobs(conn, now, SWEEP_BATCH * 2))
            .await?;
        let queued = due
            .iter()
            .filter(|job_id| !self.queue.holds(job_id.as_str()))
            .take(SWEEP_BATCH)
            .filter(|job_id| self.queue.enqueue(job_id))
            .count();
        let report = SweepReport {
            leases_expired: expired,
            queued,
        };
        if queued > 0 || expired > 0 {
            METRICS.record_swept(queued);
            tracing::info!(
                leases_expired = report.leases_expired,
                queued,
                "sweep queued jobs again"
            );
        }
        Ok(report)
    }

    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        crate::repeat_every("sweeper", interval, &shutdown, || self.sweep_once()).await;
    }
}
