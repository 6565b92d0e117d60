//! Whether the work side (worker, sweeper, retention, reconciler) can write the ledger, and since when.
//!
//! Receiving can work while the work side cannot (a claim batch reconnects at once, a pooled
//! connection of the worker may still sit on a server that turned read-only), so readiness,
//! which is about deliveries, does not say it: this does, for `/readyz`'s body, the metric
//! `sume_work_side_writable` and the console. A transition is logged once, not every failure.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::metrics::METRICS;

/// Shared by the ledger, which records its work side's writes, and whoever reports them.
#[derive(Clone)]
pub struct WorkSide(Arc<Mutex<WorkSideState>>);

/// The work side's last write, and since when that has been so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkSideState {
    /// The last write went through (`true` from the start, until one fails).
    pub can_write: bool,
    /// Since this write or failure: the first of the current run.
    pub since: SystemTime,
}

impl WorkSide {
    /// The work side of a ledger just opened: able to write until a write fails.
    pub fn started() -> WorkSide {
        METRICS.set_work_side_writable(true);
        WorkSide(Arc::new(Mutex::new(WorkSideState {
            can_write: true,
            since: SystemTime::now(),
        })))
    }

    pub fn state(&self) -> WorkSideState {
        *self.0.lock().expect("not poisoned")
    }

    /// A write went through, or failed with `error` (not a refusal of the data: the server did
    /// not take it, or could not be reached).
    pub fn record(&self, error: Option<&dyn std::fmt::Display>) {
        let can_write = error.is_none();
        let mut state = self.0.lock().expect("not poisoned");
        if state.can_write == can_write {
            return;
        }
        let now = SystemTime::now();
        let lasted = now.duration_since(state.since).unwrap_or_default();
        match error {
            Some(error) => {
                tracing::error!(%error, "the work side cannot write the ledger: jobs neither start nor finish until it can")
            }
            None => {
                tracing::info!(
                    failed_ms = lasted.as_millis() as u64,
                    "the work side writes the ledger again"
                )
            }
        }
        *state = WorkSideState {
            can_write,
            since: now,
        };
        METRICS.set_work_side_writable(can_write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_and_a_recovery_each_change_the_state_once() {
        let side = WorkSide::started();
        assert!(side.state().can_write);
        side.record(Some(&"read-only"));
        let failing = side.state();
        assert!(!failing.can_write);
        side.record(Some(&"read-only again"));
        assert_eq!(
            side.state(),
            failing,
            "a repeated failure keeps its first time"
        );
        side.record(None);
        assert!(side.state().can_write);
        assert!(side.state().since >= failing.since);
    }
}
