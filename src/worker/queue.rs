//! The in-process queues of job_ids to run, one per route, and what the worker's helpers tell
//! them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify};

use crate::hold::Breaker;
use crate::job_id::JobId;
use crate::ledger::Hold;
use crate::route_name::RouteName;

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

/// Every route's [`Queue`], in the config's order: what the request path, the sweeper, the
/// operators' actions and `/readyz` hold of the work side. Each route has a worker of its own.
#[derive(Clone, Default)]
pub struct Queues {
    routes: Arc<Vec<(RouteName, Queue)>>,
}

impl Queues {
    pub fn new(routes: Vec<(RouteName, Queue)>) -> Queues {
        Queues {
            routes: Arc::new(routes),
        }
    }

    /// The route's queue, if this process runs the route.
    pub fn route(&self, route: &str) -> Option<&Queue> {
        self.routes
            .iter()
            .find(|(name, _)| name.as_str() == route)
            .map(|(_, queue)| queue)
    }

    /// Offers a claimed job to the queue of each route it takes; a route this process does
    /// not run leaves the work in the ledger.
    pub fn enqueue(&self, job_id: &JobId, routes: &[RouteName]) {
        for route in routes {
            if let Some(queue) = self.route(route.as_str()) {
                queue.enqueue(job_id);
            }
        }
    }

    /// Every worker looks in the ledger now.
    pub fn look_in_ledger(&self) {
        self.each().for_each(Queue::look_in_ledger);
    }

    /// Dispatch was paused or resumed (every route's).
    pub fn dispatch_changed(&self, paused: bool) {
        self.each().for_each(|queue| queue.dispatch_changed(paused));
    }

    /// Whether dispatch is paused, as this process last knew it.
    pub fn dispatch_paused(&self) -> bool {
        self.each().any(Queue::dispatch_paused)
    }

    /// The routes' holds, as this process last read them from the ledger.
    pub fn holds(&self) -> Vec<Hold> {
        self.each().filter_map(Queue::hold).collect()
    }

    /// Whether nothing is queued or running here, on any route.
    pub fn is_idle(&self) -> bool {
        self.each().all(Queue::is_idle)
    }

    /// A lease may have been left behind (the sweeper's own step failed): it looks again.
    pub fn lease_left_behind(&self) {
        self.each().for_each(Queue::lease_left_behind);
    }

    /// Whether a lease was left behind on some route since the last call.
    pub fn take_lease_left_behind(&self) -> bool {
        // Every route's flag is taken, not only up to the first that was set.
        let mut left_behind = false;
        for queue in self.each() {
            left_behind |= queue.take_lease_left_behind();
        }
        left_behind
    }

    /// Whether the job's work on `route` is queued or running in this process.
    pub fn holds_work(&self, job_id: &str, route: &str) -> bool {
        self.route(route).is_some_and(|queue| queue.holds(job_id))
    }

    /// The routes this process runs, in the config's order.
    pub fn names(&self) -> impl Iterator<Item = &RouteName> {
        self.routes.iter().map(|(name, _)| name)
    }

    fn each(&self) -> impl Iterator<Item = &Queue> {
        self.routes.iter().map(|(_, queue)| queue)
    }
}
