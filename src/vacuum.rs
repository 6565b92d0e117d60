//! The retention task: purges old bodies, forgets old job_ids and the console's old minutes,
//! and gives the space back.
//!
//! Every step is a bounded batch through the ledger writer, so a big purge is many short
//! transactions interleaved with claims, never one long write lock; after each batch it waits
//! as long as the batch took, so retention never takes more than about half of the writer.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::acknowledged::RecentlyAcknowledged;
use crate::config::RetentionConfig;
use crate::ledger::{duration_ms, now_ms, Ledger, RetentionStep, StorageError};
use crate::metrics::METRICS;

/// Rows changed per transaction: small enough to keep each write lock to a few milliseconds.
const ROWS_PER_BATCH: usize = 500;
/// How long the console's minutes are kept (it shows the last hour): a bad night can still be
/// read from the ledger (`minute_rollups`) the morning after.
pub const ROLLUPS_KEPT: Duration = Duration::from_secs(24 * 3600);
/// Free pages returned to the file system per transaction.
const PAGES_PER_BATCH: usize = 2000;

/// What one vacuum run removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VacuumReport {
    pub bodies_purged: usize,
    pub jobs_forgotten: usize,
    pub expectations_forgotten: usize,
    pub minutes_forgotten: usize,
}

pub struct Vacuum {
    ledger: Arc<Ledger>,
    retention: RetentionConfig,
    /// Checked between batches: a long purge must not hold up a shutdown.
    shutdown: CancellationToken,
    /// The service's memory of acknowledged job_ids, which must not outlive their rows.
    recent: Option<Arc<RecentlyAcknowledged>>,
}

impl Vacuum {
    pub fn new(
        ledger: Arc<Ledger>,
        retention: RetentionConfig,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            ledger,
            retention,
            shutdown,
            recent: None,
        }
    }

    /// Forgets `recent` whenever a run forgets job_ids, so that a delivery of one is a new claim.
    pub fn forgetting_in(self, recent: Arc<RecentlyAcknowledged>) -> Self {
        Self {
            recent: Some(recent),
            ..self
        }
    }

    pub async fn vacuum_once(&self) -> Result<VacuumReport, StorageError> {
        let now = now_ms();
        let body_cutoff = now - duration_ms(self.retention.ttl);
        let forget_cutoff = now - duration_ms(self.retention.dedupe_ttl);
        let report = VacuumReport {
            bodies_purged: self
                .in_batches(RetentionStep::PurgeBodies, body_cutoff)
                .await?,
            jobs_forgotten: self.forget_finished(forget_cutoff).await?,
            expectations_forgotten: self
                .in_batches(RetentionStep::DeleteResolvedExpectations, forget_cutoff)
                .await?,
            minutes_forgotten: self
                .in_batches(
                    RetentionStep::DeleteOldRollups,
                    now - duration_ms(ROLLUPS_KEPT),
                )
                .await?,
        };
        // The stops that may have delayed a job live as long as a job is remembered.
        self.in_batches(RetentionStep::DeleteEndedStops, forget_cutoff)
            .await?;
        loop {
            let started = Instant::now();
            let more = self.ledger.release_free_pages(PAGES_PER_BATCH).await?;
            if !more || !self.pause_after(started).await {
                break;
            }
        }
        METRICS.record_retention(
            report.bodies_purged,
            report.jobs_forgotten,
            report.expectations_forgotten,
        );
        self.ledger.fold_counts().await?;
        if report != VacuumReport::default() {
            tracing::info!(
                bodies_purged = report.bodies_purged,
                jobs_forgotten = report.jobs_forgotten,
                expectations_forgotten = report.expectations_forgotten,
                minutes_forgotten = report.minutes_forgotten,
                "retention removed old data"
            );
        }
        Ok(report)
    }

    async fn forget_finished(&self, before: i64) -> Result<usize, StorageError> {
        let forgotten = self.in_batches(RetentionStep::DeleteFinished, before).await;
        // After a failed batch too: the batches before it committed.
        if let Some(recent) = self.recent.as_ref().filter(|_| forgotten != Ok(0)) {
            recent.forget_all();
        }
        forgotten
    }

    /// Repeats a bounded statement until it changes fewer rows than a batch, or shutdown;
    /// returns the total.
    async fn in_batches(&self, step: RetentionStep, before: i64) -> Result<usize, StorageError> {
        let mut total = 0;
        loop {
            let started = Instant::now();
            let changed = self
                .ledger
                .retention_step(step, before, ROWS_PER_BATCH)
                .await?;
            total += changed;
            if changed < ROWS_PER_BATCH || !self.pause_after(started).await {
                return Ok(total);
            }
        }
    }

    /// Leaves the writer to claims for as long as the last batch (started at `started`) took.
    /// `false` if the service is shutting down.
    async fn pause_after(&self, started: Instant) -> bool {
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => false,
            () = tokio::time::sleep(started.elapsed()) => true,
        }
    }

    pub async fn run(self, interval: Duration) {
        crate::repeat::repeat_every("retention", interval, &self.shutdown, || self.vacuum_once())
            .await;
    }
}
