//! The in-process queue of job_ids to run, and what the worker's helpers tell it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify};

use crate::hold::Breaker;
use crate::job_id::JobId;
use crate::ledger::Hold;

/// Jobs waiting in memory for a free worker. Past this, new claims wait in the ledger until the
/// worker takes them from there: memory stays bounded under any backlog.
const QUEUE_CAPACITY: usize = 10_000;
/// The in-process queue of job_ids to run. It refuses a job_id that is already queued or running,
/// so the sweeper, the request path and retry timers can all offer the same job.
#[derive(Clone)]
pub struct Queue {
    sender: mpsc::Sender<JobId>,
    held: Arc<Mutex<HashSet<JobId>>>,
    /// Wakes an idle worker to look in the ledger now.
    pub(super) ledger_changed: Arc<Notify>,
    /// Set when dispatch was paused or resumed in this process: the worker reads it again
    /// before its next start.
    pub(super) dispatch_changed: Arc<AtomicBool>,
    /// Whether dispatch is paused, as this process last knew it (`/readyz` says so without a
    /// ledger read).
    pub(super) paused: Arc<AtomicBool>,
    /// The hold, as this process last knew it.
    breaker: Arc<Breaker>,
    /// Set when an attempt's start, end or release failed: its row may stay `running` until
    /// the sweeper takes it back.
    lease_left_behind: Arc<AtomicBool>,
}

impl Queue {
    pub(super) fn new(breaker: Arc<Breaker>) -> (Queue, mpsc::Receiver<JobId>) {
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        (
            Queue {
                sender,
                held: Arc::default(),
                ledger_changed: Arc::default(),
                dispatch_changed: Arc::default(),
                paused: Arc::default(),
                breaker,
                lease_left_behind: Arc::default(),
            },
            receiver,
        )
    }

    /// Tells the worker that the ledger has jobs due now or sooner than it thought (leases
    /// taken back, a retry scheduled).
    pub fn look_in_ledger(&self) {
        self.ledger_changed.notify_one();
    }

    /// Tells the worker that dispatch was paused or resumed: it starts nothing more before it
    /// has read the change.
    pub fn dispatch_changed(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
        self.dispatch_changed.store(true, Ordering::SeqCst);
        self.ledger_changed.notify_one();
    }

    /// Whether dispatch is paused, as this process last knew it.
    pub fn dispatch_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The hold (`src/hold/`), as this process last read it from the ledger.
    pub fn hold(&self) -> Option<Hold> {
        self.breaker.hold()
    }

    /// Whether nothing is queued or running here.
    pub fn is_idle(&self) -> bool {
        self.held.lock().expect("not poisoned").is_empty()
    }

    /// An attempt's row may have been left `running` with no attempt of it here (its start's
    /// outcome is unknown, or its end or release could not be recorded).
    pub fn lease_left_behind(&self) {
        self.lease_left_behind.store(true, Ordering::SeqCst);
    }

    /// Whether a lease was left behind since the last call.
    pub fn take_lease_left_behind(&self) -> bool {
        self.lease_left_behind.swap(false, Ordering::SeqCst)
    }

    /// Offers a job; `true` if it was queued now.
    pub fn enqueue(&self, job_id: &JobId) -> bool {
        let mut held = self.held.lock().expect("not poisoned");
        if !held.insert(job_id.clone()) {
            return false;
        }
        if self.sender.try_send(job_id.clone()).is_err() {
            held.remove(job_id);
            tracing::debug!(job_id = %job_id, "work queue full; the job waits in the ledger");
            return false;
        }
        true
    }

    /// Whether the job is queued or running in this process.
    pub fn holds(&self, job_id: &str) -> bool {
        self.held.lock().expect("not poisoned").contains(job_id)
    }

    pub(super) fn release(&self, job_id: &JobId) {
        self.held.lock().expect("not poisoned").remove(job_id);
    }
}
