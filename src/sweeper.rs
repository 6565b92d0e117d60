//! The sweeper: takes back the leases of attempts that will never end.
//!
//! An attempt whose lease expired (its handler overran, or its receiver died) is recorded as
//! failed and its job made due again (or `dead` on its last attempt); the worker then takes it
//! from the ledger like any other due job.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ledger::{now_ms, Leases, Ledger, StorageError};
use crate::metrics::METRICS;
use crate::traces::{Kind, Parent, Tracer};
use crate::worker::Queues;

pub struct Sweeper {
    ledger: Arc<Ledger>,
    queue: Queues,
    /// Each route's `max_attempts`: a lease taken back on its last attempt makes its work dead.
    /// A route no longer in the config has no limit: its work stays, due, unrun.
    max_attempts: Arc<dyn Fn(&str) -> u32 + Send + Sync>,
    tracer: Tracer,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub leases_expired: usize,
}

impl Sweeper {
    pub fn new(
        ledger: Arc<Ledger>,
        queue: Queues,
        max_attempts: Arc<dyn Fn(&str) -> u32 + Send + Sync>,
    ) -> Self {
        Self {
            ledger,
            queue,
            max_attempts,
            tracer: Tracer::default(),
        }
    }

    /// Records a span of each sweep that takes leases back with `tracer`.
    pub fn traced_by(self, tracer: Tracer) -> Sweeper {
        Sweeper { tracer, ..self }
    }

    /// At start: takes back at once the attempts this receiver was running when it stopped
    /// (on a ledger of its own, every `running` row: no one else can be running them), then,
    /// on a shared ledger, the expired leases of others as at every sweep.
    pub async fn recover(&self) -> Result<SweepReport, StorageError> {
        let own = self
            .sweep(
                Leases::HeldBeforeThisStart,
                "interrupted: the receiver stopped during this attempt",
            )
            .await?;
        if !self.ledger.is_shared() {
            return Ok(own);
        }
        let others = self.sweep_once().await?;
        Ok(SweepReport {
            leases_expired: own.leases_expired + others.leases_expired,
        })
    }

    pub async fn sweep_once(&self) -> Result<SweepReport, StorageError> {
        self.sweep(
            Leases::ExpiredBefore(now_ms()),
            "lease expired: the handler neither finished nor failed in time",
        )
        .await
    }

    async fn sweep(
        &self,
        leases: Leases,
        reason: &'static str,
    ) -> Result<SweepReport, StorageError> {
        let max_attempts = self.max_attempts.clone();
        let now = now_ms();
        let queue = self.queue.clone();
        let mut span = self
            .tracer
            .start("take back leases", Kind::Internal, Parent::Root);
        let expired = self
            .ledger
            .expire_leases(
                leases,
                now,
                move |route| max_attempts(route),
                reason,
                move |job_id, route| queue.holds_work(job_id, route),
            )
            .await?;
        if expired == 0 {
            // Most sweeps find nothing: no span of them.
            span.discard();
        } else {
            span.set("sume.leases_taken_back", expired as i64);
            span.set("sume.reason", reason);
            METRICS.record_swept(expired);
            tracing::info!(leases_expired = expired, "sweep took back expired leases");
            self.queue.look_in_ledger();
        }
        Ok(SweepReport {
            leases_expired: expired,
        })
    }

    /// The loop's step. A sweep of the expired leases, unless it could find nothing: on a
    /// ledger of its own a lease can expire only on an attempt this process started (the ones
    /// from before its start were taken back by [`Sweeper::recover`]), so with nothing queued
    /// or running here and no attempt left behind there is none, and an idle receiver takes no
    /// lock on its ledger for it. After an attempt was left behind (its start's outcome unknown,
    /// or its end unrecorded: a failover), also the rows leased under this receiver's name
    /// that no attempt here runs, at once rather than when their lease ends. `None` when
    /// skipped.
    pub async fn sweep_if_needed(&self) -> Result<Option<SweepReport>, StorageError> {
        let left_behind = self.queue.take_lease_left_behind();
        if !left_behind && !self.ledger.is_shared() && self.queue.is_idle() {
            return Ok(None);
        }
        let swept = async {
            let mut report = self.sweep_once().await?;
            if left_behind {
                let own = self
                    .sweep(
                        Leases::HeldBeforeThisStart,
                        "left behind: its start or end could not be confirmed by the ledger",
                    )
                    .await?;
                report.leases_expired += own.leases_expired;
            }
            Ok(report)
        }
        .await;
        if swept.is_err() && left_behind {
            // Not swept: the next step must not skip what this one had to do.
            self.queue.lease_left_behind();
        }
        swept.map(Some)
    }

    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        crate::repeat::repeat_every("sweeper", interval, &shutdown, || self.sweep_if_needed())
            .await;
    }
}
