//! The in-process queues of job_ids to run, one per route, and what the worker's helpers tell
//! them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{mpsc, Notify};

use crate::config::Routes;
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

/// Every route's [`Queue`], in the config's order, with the routes they come from: what the
/// request path, the sweeper, the operators' actions and `/readyz` hold of the work side. Each
/// route has a worker of its own. Swapped whole when the routes change on SIGHUP (see
/// [`super::Crew`]): a delivery chooses its routes and offers its work from one snapshot.
#[derive(Clone, Default)]
pub struct Queues {
    in_force: Arc<RwLock<Arc<InForce>>>,
    /// Work waiting on routes not in force, by route, as last read from the ledger.
    not_run: Arc<Mutex<Vec<(String, u64)>>>,
}

/// The routes in force and their queues, as one snapshot.
#[derive(Default)]
pub struct InForce {
    /// What a new claim's routes are chosen by.
    pub routes: Arc<Routes>,
    queues: Vec<(RouteName, Queue)>,
}

impl Queues {
    /// The queues of `routes`, each route's worker started beside it.
    pub fn new(routes: Arc<Routes>, queues: Vec<(RouteName, Queue)>) -> Queues {
        let made = Queues::default();
        made.replace(routes, queues);
        made
    }

    pub(super) fn replace(&self, routes: Arc<Routes>, queues: Vec<(RouteName, Queue)>) {
        *self.in_force.write().expect("not poisoned") = Arc::new(InForce { routes, queues });
    }

    /// The routes in force and their queues, as one snapshot.
    pub fn in_force(&self) -> Arc<InForce> {
        self.in_force.read().expect("not poisoned").clone()
    }

    /// The route's queue, if this process runs the route.
    pub fn route(&self, route: &str) -> Option<Queue> {
        self.in_force().route(route).cloned()
    }

    /// Offers a claimed job to the queue of each route it takes; a route this process does
    /// not run leaves the work in the ledger.
    pub fn enqueue(&self, job_id: &JobId, routes: &[RouteName]) {
        self.in_force().enqueue(job_id, routes);
    }

    /// Every worker looks in the ledger now.
    pub fn look_in_ledger(&self) {
        self.in_force().each().for_each(Queue::look_in_ledger);
    }

    /// Dispatch was paused or resumed (every route's).
    pub fn dispatch_changed(&self, paused: bool) {
        self.in_force()
            .each()
            .for_each(|queue| queue.dispatch_changed(paused));
    }

    /// Whether every route's dispatch is paused, as this process last knew it.
    pub fn dispatch_paused(&self) -> bool {
        let in_force = self.in_force();
        !in_force.queues.is_empty() && in_force.each().all(Queue::dispatch_paused)
    }

    /// One route's pause or resume: its worker reads it again before its next start.
    pub fn route_dispatch_changed(&self, route: &str, paused: bool) {
        if let Some(queue) = self.route(route) {
            queue.dispatch_changed(paused);
        }
    }

    /// The routes' holds, as this process last read them from the ledger.
    pub fn holds(&self) -> Vec<Hold> {
        self.in_force().each().filter_map(Queue::hold).collect()
    }

    /// Whether nothing is queued or running here, on any route.
    pub fn is_idle(&self) -> bool {
        self.in_force().each().all(Queue::is_idle)
    }

    /// A lease may have been left behind (the sweeper's own step failed): it looks again.
    pub fn lease_left_behind(&self) {
        self.in_force().each().for_each(Queue::lease_left_behind);
    }

    /// Whether a lease was left behind on some route since the last call.
    pub fn take_lease_left_behind(&self) -> bool {
        // Every route's flag is taken, not only up to the first that was set.
        let mut left_behind = false;
        for queue in self.in_force().each() {
            left_behind |= queue.take_lease_left_behind();
        }
        left_behind
    }

    /// Whether the job's work on `route` is queued or running in this process.
    pub fn holds_work(&self, job_id: &str, route: &str) -> bool {
        self.route(route).is_some_and(|queue| queue.holds(job_id))
    }

    /// The routes this process runs, in the config's order.
    pub fn names(&self) -> Vec<RouteName> {
        self.in_force().names().cloned().collect()
    }

    /// Takes each route's waiting work as just read from the ledger (route, waiting,
    /// running); returns the work of routes not in force (taken out of the config), which
    /// waits, unrun, until a route of its name comes back.
    pub fn note_work(&self, work: &[(String, u64, u64)]) -> Vec<(String, u64)> {
        let not_run = self.in_force().routes.work_not_here(work);
        *self.not_run.lock().expect("not poisoned") = not_run.clone();
        not_run
    }

    /// Work waiting on routes not in force, as last read (at the start, at each reload, at
    /// each scrape of `/metrics`).
    pub fn work_not_run(&self) -> Vec<(String, u64)> {
        self.not_run.lock().expect("not poisoned").clone()
    }

    /// The most attempts the route's work gets. Unlimited for a route no longer in the config:
    /// its work is kept (a lease taken back goes back to waiting), never made dead by a limit
    /// that is no longer anybody's.
    pub fn max_attempts(&self, route: &str) -> u32 {
        self.in_force()
            .routes
            .list()
            .iter()
            .find(|known| known.name.as_str() == route)
            .map_or(u32::MAX, |known| known.handler.max_attempts)
    }
}

impl InForce {
    /// The route's queue, if this process runs the route.
    pub fn route(&self, route: &str) -> Option<&Queue> {
        self.queues
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

    /// The routes this process runs, in the config's order.
    pub fn names(&self) -> impl Iterator<Item = &RouteName> {
        self.queues.iter().map(|(name, _)| name)
    }

    fn each(&self) -> impl Iterator<Item = &Queue> {
        self.queues.iter().map(|(_, queue)| queue)
    }
}
