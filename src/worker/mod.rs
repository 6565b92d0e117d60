//! The worker: runs each claimed job's handler outside the request, under a lease, with retries.
//!
//! One worker per route, with the route's handler, limits and hold: a route whose downstream
//! is down holds its own worker, and the others run.
//!
//! A job_id enters the in-process [`Queue`] when its claim commits; whenever that queue runs dry
//! with a slot free, the worker takes due jobs from the ledger itself (claimed while the queue
//! was full, left from before a restart, retries whose time has come, leases the sweeper took
//! back). It starts each through the ledger writer (`claimed`/`retrying` -> `running`, which also
//! stops a second start), runs the handler, and records `done`, `retrying` or `dead`.

mod crew;
mod queue;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::HandlerConfig;
use crate::handler::{AttemptError, Handler};
use crate::hold::{Breaker, Outcome, Ticket, Turn};
use crate::job_id::JobId;
use crate::ledger::{
    duration_ms, now_ms, Attempt, AttemptEnd, Dispatch, Failure, Ledger, Release, State,
    StorageError,
};
use crate::logging::Escaped;
use crate::metrics::{AttemptResult, METRICS};
use crate::route_name::RouteName;
use crate::throttle::Throttled;
use crate::traces::{self, Span, Tracer, Within};
pub use crew::{Changes, Crew};
pub use queue::{InForce, Queue, Queues};

/// Most due jobs taken from the ledger at once when the in-memory queue runs dry.
const PULL_BATCH: usize = 1_000;
/// An idle worker looks in the ledger at least this often where the ledger cannot tell it of
/// another process's changes (`jobs retry`): those jobs start within it. Where it can (SQLite's
/// WAL watch), an idle worker sleeps until its next job is due.
pub const IDLE_LOOK: Duration = Duration::from_secs(1);
/// When every due job found is already being started here: look again this soon.
const STARTING_LOOK: Duration = Duration::from_millis(20);

pub struct Worker {
    route: RouteName,
    ledger: Arc<Ledger>,
    handler: Arc<Handler>,
    config: HandlerConfig,
    /// Lease slack past the handler timeout (the sweeper's `stale_after`).
    lease_slack: Duration,
    queue: Queue,
    receiver: mpsc::Receiver<JobId>,
    /// A ledger that cannot be read is retried every [`IDLE_LOOK`]: logged once, then rarely.
    read_failures: Throttled,
    /// Likewise a job that cannot be started (the ledger takes no changes).
    start_failures: Arc<Mutex<Throttled>>,
    /// Whether an operator paused dispatch, as last read from the ledger, and when.
    dispatch: Option<(Dispatch, std::time::Instant)>,
    /// Woken by another process's write since the last look: that look may have come before
    /// its commit was visible, so the next one comes within [`IDLE_LOOK`].
    woken_from_elsewhere: bool,
    breaker: Arc<Breaker>,
    tracer: Tracer,
}

impl Worker {
    pub fn new(
        route: RouteName,
        ledger: Arc<Ledger>,
        config: HandlerConfig,
        lease_slack: Duration,
    ) -> anyhow::Result<(Worker, Queue)> {
        let handler = Arc::new(Handler::new(
            config.kind.clone(),
            config.ca_file.as_deref(),
        )?);
        let breaker = Breaker::new(route.clone(), &config, lease_slack);
        let (queue, receiver) = Queue::new(breaker.clone());
        METRICS.routes.declare(&route);
        let worker = Worker {
            route,
            ledger,
            handler,
            config,
            lease_slack,
            queue: queue.clone(),
            receiver,
            read_failures: Throttled::new("cannot read due jobs from the ledger; trying again"),
            start_failures: Arc::new(Mutex::new(Throttled::new(
                "cannot start jobs: the ledger takes no changes; each stays due and is tried again every second",
            ))),
            dispatch: None,
            woken_from_elsewhere: false,
            breaker,
            tracer: Tracer::default(),
        };
        Ok((worker, queue))
    }

    /// Records each attempt's span with `tracer` (see `src/traces/`).
    pub fn traced_by(self, tracer: Tracer) -> Worker {
        Worker { tracer, ..self }
    }

    /// Runs jobs until `shutdown`; then lets running handlers finish for up to `grace` before
    /// stopping them (they stay `running` in the ledger, and the next start recovers them).
    pub async fn run(mut self, shutdown: CancellationToken, grace: Duration) {
        let slots = Arc::new(Semaphore::new(self.config.concurrency));
        let ends = Arc::new(Semaphore::new(self.config.concurrency));
        let stop_handlers = CancellationToken::new();
        let mut running = JoinSet::new();
        loop {
            let slot = tokio::select! {
                slot = slots.clone().acquire_owned() => slot.expect("semaphore never closes"),
                () = shutdown.cancelled() => break,
            };
            let Some(job_id) = self.next_job(&shutdown).await else {
                break;
            };
            // A pause that came while it waited for this job, or a hold: the job waits (queued)
            // until dispatch resumes, or its turn comes.
            let Some(ticket) = self.wait_for_turn(&shutdown).await else {
                break;
            };
            let job = JobRun {
                route: self.route.clone(),
                ends: ends.clone(),
                ledger: self.ledger.clone(),
                handler: self.handler.clone(),
                config: self.config.clone(),
                lease_slack: self.lease_slack,
                queue: self.queue.clone(),
                stop_handlers: stop_handlers.clone(),
                start_failures: self.start_failures.clone(),
                breaker: self.breaker.clone(),
                tracer: self.tracer.clone(),
            };
            // Boxed: tokio copies a task's future whole when it spawns it and again when it
            // ends (the run's is a few KB); boxed, it is copied once, into the box, and the
            // task holds a pointer (perf, bench/work.sh: 3 % of a drain's CPU went to those
            // copies).
            running.spawn(Box::pin(job.run(job_id, ticket, slot)));
            while running.try_join_next().is_some() {}
        }
        while running.try_join_next().is_some() {}
        if !running.is_empty() {
            tracing::info!(running = running.len(), grace = ?grace, "waiting for running handlers");
        }
        let drained = tokio::time::timeout(grace, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                running = running.len(),
                "shutdown grace over: stopping handlers; their jobs run again at the next start"
            );
            stop_handlers.cancel();
            while running.join_next().await.is_some() {}
        }
    }
}

impl Worker {
    /// Returns once dispatch is not paused (at once, almost always: the ledger is read at most
    /// every [`IDLE_LOOK`]); `false` at shutdown.
    async fn wait_while_paused(&mut self, shutdown: &CancellationToken) -> bool {
        loop {
            let changed_here = self.queue.dispatch_changed.swap(false, Ordering::SeqCst);
            let fresh = !changed_here
                && self
                    .dispatch
                    .as_ref()
                    .is_some_and(|(_, read_at)| read_at.elapsed() < IDLE_LOOK);
            if !fresh {
                self.read_dispatch().await;
            }
            if !self.dispatch.as_ref().is_some_and(|(d, _)| d.paused) {
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep(IDLE_LOOK) => {}
                () = self.queue.ledger_changed.notified() => {}
                () = self.ledger.work_added_elsewhere() => {}
                () = shutdown.cancelled() => return false,
            }
        }
    }

    /// Waits until the job in hand may start: dispatch not paused, and the hold's turn (see
    /// `src/hold/`); the ticket it starts under, `None` at shutdown.
    async fn wait_for_turn(&mut self, shutdown: &CancellationToken) -> Option<Ticket> {
        loop {
            if !self.wait_while_paused(shutdown).await {
                return None;
            }
            let wait = match self.breaker.take_turn(&self.ledger).await {
                Ok(Turn::Start(ticket)) => return Some(ticket),
                Ok(Turn::Wait(wait)) => wait.min(IDLE_LOOK),
                Err(error) => {
                    self.read_failures.warn(&error.to_string());
                    IDLE_LOOK
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.breaker.changed.notified() => {}
                () = self.queue.ledger_changed.notified() => {}
                () = shutdown.cancelled() => return None,
            }
        }
    }

    /// Reads whether dispatch is paused; logs a change. A ledger that cannot be read leaves
    /// the last answer in force (running, at first).
    async fn read_dispatch(&mut self) {
        let now = std::time::Instant::now();
        let read = match self.ledger.route_dispatch(&self.route).await {
            Ok(read) => read,
            Err(error) => {
                self.read_failures.warn(&error.to_string());
                let last = self
                    .dispatch
                    .take()
                    .map(|(last, _)| last)
                    .unwrap_or_default();
                self.dispatch = Some((last, now));
                return;
            }
        };
        let was_paused = self.dispatch.as_ref().is_some_and(|(d, _)| d.paused);
        let by = Escaped(read.changed_by.as_deref().unwrap_or("?")).to_string();
        let route = &self.route;
        match (was_paused, read.paused, read.route.is_some()) {
            (false, true, false) => {
                tracing::warn!(%by, %route, "dispatch paused: deliveries are claimed, no job runs until `jobs resume`")
            }
            (false, true, true) => {
                tracing::warn!(%by, %route, "route paused: its deliveries are claimed, none of its jobs runs until `jobs resume --route`; other routes run")
            }
            (true, false, _) => tracing::info!(%by, %route, "dispatch resumed"),
            _ => {}
        }
        // The gauge says whether every route is paused; a route's own pause shows in /readyz.
        if read.route.is_none() {
            METRICS.set_dispatch_paused(read.paused);
        }
        self.queue.paused.store(read.paused, Ordering::SeqCst);
        self.dispatch = Some((read, now));
        self.breaker.reread(&self.ledger).await;
    }

    /// The next job to start: from the in-memory queue, or else from the ledger. `None` at
    /// shutdown.
    async fn next_job(&mut self, shutdown: &CancellationToken) -> Option<JobId> {
        loop {
            // Idle, it still looks at least every IDLE_LOOK: a pause shows at once.
            if !self.wait_while_paused(shutdown).await {
                return None;
            }
            match self.receiver.try_recv() {
                Ok(job_id) => return Some(job_id),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            let mut wait = self.take_due_jobs().await;
            if wait.is_zero() {
                continue;
            }
            if std::mem::take(&mut self.woken_from_elsewhere) {
                wait = wait.min(IDLE_LOOK);
            }
            tokio::select! {
                job_id = self.receiver.recv() => return job_id,
                () = self.queue.ledger_changed.notified() => {}
                () = self.ledger.work_added_elsewhere() => self.woken_from_elsewhere = true,
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return None,
            }
        }
    }

    /// Queues due jobs from the ledger that this process does not hold yet. Returns zero if it
    /// queued some, else how long until one may be due.
    async fn take_due_jobs(&mut self) -> Duration {
        let now = now_ms();
        // Jobs being started here are still due in the ledger for a moment: ask for enough
        // that they cannot fill the batch.
        let limit = PULL_BATCH + self.config.concurrency;
        let due = match self.ledger.due_jobs(&self.route, now, limit).await {
            Ok(due) => {
                self.read_failures.recovered();
                due
            }
            Err(error) => {
                self.read_failures.warn(&error.to_string());
                return IDLE_LOOK;
            }
        };
        if !due.unrunnable.is_empty() {
            let given_up = self
                .ledger
                .give_up_unrunnable(due.unrunnable, now_ms())
                .await;
            return match given_up {
                Ok(()) => Duration::ZERO,
                Err(error) => {
                    tracing::warn!(%error, "cannot give up jobs whose stored job_id cannot run");
                    IDLE_LOOK
                }
            };
        }
        let queued = due
            .runnable
            .iter()
            .filter(|job_id| self.queue.enqueue(job_id))
            .count();
        if queued > 0 {
            return Duration::ZERO;
        }
        if !due.runnable.is_empty() {
            return STARTING_LOOK;
        }
        due.next_at.map_or(self.idle_look(), |at| {
            Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).min(self.idle_look())
        })
    }

    /// How long an idle worker waits with no news: [`IDLE_LOOK`], or until woken where the
    /// ledger sees other processes' changes (a sleep that never ends).
    fn idle_look(&self) -> Duration {
        if self.ledger.sees_work_added_elsewhere() {
            Duration::MAX
        } else {
            IDLE_LOOK
        }
    }
}

/// What an attempt leaves to do for its job once the job's slot is given back.
enum AfterAttempt {
    /// Nothing: done, dead, given back, or no longer this attempt's.
    Settled,
    /// A retry is due later: the worker looks in the ledger for its due time.
    Retrying,
    /// Its row may stay `running` with no attempt of it here (a start whose outcome is
    /// unknown, an end or a release not recorded): the sweeper takes it back.
    LeaseLeftBehind,
}

/// Everything one job's run needs, detached from the worker loop.
struct JobRun {
    route: RouteName,
    /// As many places as the route has slots, one held by each end being written: while the
    /// ledger is slow to take ends (or refuses them), the handlers whose ends wait keep their
    /// slots, and no more jobs start than before.
    ends: Arc<Semaphore>,
    ledger: Arc<Ledger>,
    handler: Arc<Handler>,
    config: HandlerConfig,
    lease_slack: Duration,
    queue: Queue,
    stop_handlers: CancellationToken,
    start_failures: Arc<Mutex<Throttled>>,
    breaker: Arc<Breaker>,
    tracer: Tracer,
}

/// An attempt started under the hold's ticket: what its record needs.
struct Started {
    attempt: Attempt,
    ticket: Ticket,
    lease_until: i64,
    at: std::time::Instant,
}

impl JobRun {
    /// Runs the job's attempt under the hold's `ticket` (see [`Worker::wait_for_turn`]) in
    /// `slot`, one of the route's `concurrency`.
    async fn run(self, job_id: JobId, ticket: Ticket, slot: OwnedSemaphorePermit) {
        let after = self.attempt(&job_id, ticket, slot).await;
        self.queue.release(&job_id);
        match after {
            // The ledger holds the retry's due time; the worker may be waiting past it.
            AfterAttempt::Retrying => self.queue.look_in_ledger(),
            // Said only once the job is no longer held here: the sweeper passes over the jobs
            // this process holds, so a sweep between the failure and the release (the slot
            // is held a while after a failed start) would have spent the news on nothing.
            AfterAttempt::LeaseLeftBehind => self.queue.lease_left_behind(),
            AfterAttempt::Settled => {}
        }
    }

    /// Runs one attempt: start, run the handler, record; what it leaves to do for its job.
    async fn attempt(
        &self,
        job_id: &JobId,
        ticket: Ticket,
        slot: OwnedSemaphorePermit,
    ) -> AfterAttempt {
        let started = match self.start(job_id, ticket).await {
            Ok(started) => started,
            Err(after) => return after,
        };
        let mut span = traces::attempt_span(&self.tracer, &self.ledger, &started.attempt).await;
        if started.ticket.is_probe() {
            span.set("sume.hold_probe", true);
        }
        span.set("sume.route", self.route.as_str());
        let log_span = span.log_span();
        async {
            // Debug, not info: at thousands of jobs a second a line per start doubles the
            // journal's lines (and their cost); the end's line names the job, route and attempt.
            tracing::debug!(job_id = %job_id, route = %self.route, attempt = started.attempt.number, probe = started.ticket.is_probe(), "running handler");
            let within = Within {
                tracer: &self.tracer,
                parent: span.context(),
            };
            let timeout = self.config.timeout;
            let outcome = (self.handler)
                .run(&started.attempt, timeout, &self.stop_handlers, within)
                .await;
            record_outcome(&mut span, &outcome);
            self.record(started, outcome, slot).await
        }
        .instrument(log_span)
        .await
    }

    /// Moves the job to `running` under a lease; what is left to do if it did not start (the
    /// ticket then goes back to the hold unused).
    async fn start(&self, job_id: &JobId, ticket: Ticket) -> Result<Started, AfterAttempt> {
        let now = now_ms();
        let lease_until = now + duration_ms(self.config.timeout + self.lease_slack);
        match self
            .ledger
            .start_attempt(job_id, &self.route, now, lease_until)
            .await
        {
            Ok(Some(attempt)) => {
                self.start_failures
                    .lock()
                    .expect("not poisoned")
                    .recovered();
                Ok(Started {
                    attempt,
                    ticket,
                    lease_until,
                    at: std::time::Instant::now(),
                })
            }
            // Already started, finished, or purged: nothing to do.
            Ok(None) => {
                self.breaker.give_back(&self.ledger, ticket).await;
                Err(AfterAttempt::Settled)
            }
            Err(error) => {
                // The start may have committed unseen (its connection broke at the commit): the
                // sweeper then takes the row back, since no attempt of it runs here.
                self.breaker.give_back(&self.ledger, ticket).await;
                self.start_failures
                    .lock()
                    .expect("not poisoned")
                    .warn(&format!("{error} (job {job_id:?})"));
                // The job stays due, and would be taken again at once: holding its slot for a
                // while keeps a ledger that refuses changes from being hammered in a loop.
                tokio::time::sleep(IDLE_LOOK).await;
                Err(AfterAttempt::LeaseLeftBehind)
            }
        }
    }

    /// Settles the handler's outcome with the hold, then records the attempt's end: counted
    /// (done, a retry, or dead), or given back uncounted.
    async fn record(
        &self,
        started: Started,
        outcome: Result<(), AttemptError>,
        slot: OwnedSemaphorePermit,
    ) -> AfterAttempt {
        let Started {
            attempt,
            ticket,
            lease_until,
            at,
        } = started;
        let read = match &outcome {
            Ok(()) => Outcome::Succeeded,
            Err(AttemptError::Failed(failure, sign)) => Outcome::Failed(failure, *sign),
            Err(AttemptError::Interrupted) => Outcome::Interrupted,
        };
        // The hold first: other receivers stop starting attempts as soon as it can be.
        let counts = self
            .breaker
            .settle(&self.ledger, &attempt.job_id, ticket, read)
            .await;
        // The handler is done and the hold knows: the slot takes the next job now, whose start
        // then goes to the ledger writer with this end, in the same commit (a job's end and the
        // next one's start in one commit instead of two: bench/work.sh). The job stays held in
        // the queue, and `running` in the ledger, until its end is recorded; so the ledger
        // shows at most twice `concurrency` jobs running.
        let _end_place = self.ends.acquire().await.expect("semaphore never closes");
        drop(slot);
        let failure = match outcome {
            Err(AttemptError::Interrupted) => {
                return self.release(attempt, Release::Shutdown).await
            }
            Err(AttemptError::Failed(failure, _)) => Some(failure),
            Ok(()) => None,
        };
        if !counts {
            return self
                .release(attempt, Release::Held(failure.unwrap_or_default()))
                .await;
        }
        let (end, retry_in) = self.end_of(&attempt, failure);
        let elapsed = at.elapsed();
        // Counted before the end is written, not after: a reader of /metrics who has seen the
        // job `done` (or dead) must find its attempt counted. The attempt ran either way, also
        // when the ledger then refuses its end.
        METRICS.record_attempt_end(
            self.route.as_str(),
            attempt_result(&end),
            Some(elapsed.as_secs_f64()),
        );
        let recorded = self.record_end(&attempt, &end, lease_until).await;
        after_end(&attempt, &end, recorded, elapsed, retry_in)
    }

    /// How a counted attempt ends: done, failed with a retry after its backoff (and that
    /// backoff), or failed for good after its last attempt.
    fn end_of(
        &self,
        attempt: &Attempt,
        failure: Option<Failure>,
    ) -> (AttemptEnd, Option<Duration>) {
        let Some(failure) = failure else {
            return (AttemptEnd::Done, None);
        };
        if attempt.number >= self.config.max_attempts {
            let end = AttemptEnd::Failed {
                failure,
                retry_at: None,
            };
            return (end, None);
        }
        let delay = backoff(&self.config, attempt.number);
        let end = AttemptEnd::Failed {
            failure,
            retry_at: Some(now_ms() + duration_ms(delay)),
        };
        (end, Some(delay))
    }

    /// Records the attempt's end, trying again every [`IDLE_LOOK`] while the ledger refuses it
    /// (a failover: the new primary takes it within seconds) until the lease runs out, after
    /// which the sweeper takes the job back and runs it again. The end is fenced by the attempt
    /// number, so a try whose outcome was unknown but committed makes the next one a no-op.
    async fn record_end(
        &self,
        attempt: &Attempt,
        end: &AttemptEnd,
        lease_until: i64,
    ) -> Result<Option<State>, StorageError> {
        loop {
            let result = self.ledger.finish_attempt(attempt, end, now_ms()).await;
            let Err(error) = &result else { return result };
            if now_ms() + duration_ms(IDLE_LOOK) >= lease_until || self.stop_handlers.is_cancelled()
            {
                return result;
            }
            tracing::debug!(job_id = %attempt.job_id, %error, "could not record the attempt's end yet; trying again");
            tokio::time::sleep(IDLE_LOOK).await;
        }
    }

    /// Gives an attempt back uncounted, due again now: our own shutdown stopped the handler (a
    /// job on its last attempt must not become `dead` because we stopped), or it failed for an
    /// outage that a hold already knows (see `src/hold/`). The job's history says which.
    async fn release(&self, attempt: Attempt, release: Release) -> AfterAttempt {
        let job_id = &attempt.job_id;
        match self
            .ledger
            .release_attempt(&attempt, &release, now_ms())
            .await
        {
            Ok(_) => {
                match &release {
                    Release::Shutdown => {
                        tracing::warn!(job_id = %job_id, route = %attempt.route, "handler stopped by shutdown; the job runs again at the next start, this attempt uncounted")
                    }
                    Release::Held(failure) => {
                        tracing::info!(job_id = %job_id, route = %attempt.route, error = %Escaped(&failure.error), "attempt failed during a handler hold; given back uncounted")
                    }
                }
                AfterAttempt::Settled
            }
            // The row stays `running` until the sweeper (or, after a shutdown, the next start)
            // takes it back, counted as after a crash.
            Err(error) => {
                tracing::error!(job_id = %job_id, %error, "could not give back an interrupted attempt");
                AfterAttempt::LeaseLeftBehind
            }
        }
    }
}

/// What a recorded end (or its failure to be recorded) leaves to do for its job.
fn after_end(
    attempt: &Attempt,
    end: &AttemptEnd,
    recorded: Result<Option<State>, StorageError>,
    elapsed: Duration,
    retry_in: Option<Duration>,
) -> AfterAttempt {
    match recorded {
        Ok(Some(state)) => {
            log_end(attempt, end, state, elapsed, retry_in);
            if state == State::Retrying {
                AfterAttempt::Retrying
            } else {
                AfterAttempt::Settled
            }
        }
        Ok(None) => {
            tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, "the attempt no longer owned the job when it ended (lease taken back)");
            AfterAttempt::Settled
        }
        Err(error) => {
            // The row stays `running` until the sweeper takes it back.
            tracing::error!(job_id = %attempt.job_id, %error, "could not record the attempt's end");
            AfterAttempt::LeaseLeftBehind
        }
    }
}

/// The handler's outcome on its attempt's span; the failure's text is the one the ledger keeps
/// (the tail of the handler's stderr or answer, never the body sent).
fn record_outcome(span: &mut Span, outcome: &Result<(), AttemptError>) {
    match outcome {
        Ok(()) => span.set("sume.outcome", "succeeded"),
        Err(AttemptError::Interrupted) => span.set("sume.outcome", "interrupted"),
        Err(AttemptError::Failed(failure, _)) => {
            span.set("sume.outcome", "failed");
            span.fail("handler_failed", || failure.error.clone());
        }
    }
}

/// What the metrics call an attempt that ends so.
fn attempt_result(end: &AttemptEnd) -> AttemptResult {
    match end.outcome().0 {
        State::Done => AttemptResult::Done,
        State::Dead => AttemptResult::Dead,
        _ => AttemptResult::Failed,
    }
}

/// Says a recorded end in the journal.
fn log_end(
    attempt: &Attempt,
    end: &AttemptEnd,
    state: State,
    elapsed: Duration,
    retry_in: Option<Duration>,
) {
    let elapsed_ms = elapsed.as_millis() as u64;
    let job_id = &attempt.job_id;
    match (end, state) {
        (_, State::Done) => {
            tracing::info!(job_id = %job_id, route = %attempt.route, attempt = attempt.number, elapsed_ms, "job done")
        }
        (AttemptEnd::Failed { failure, .. }, State::Dead) => {
            tracing::error!(job_id = %job_id, route = %attempt.route, attempt = attempt.number, error = %Escaped(&failure.error), "job dead: out of attempts")
        }
        (AttemptEnd::Failed { failure, .. }, _) => {
            // "8s 740ms", not Debug's "Some(8.74s)".
            let retry_in = retry_in.map_or_else(String::new, |delay| {
                let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                humantime::format_duration(Duration::from_millis(millis)).to_string()
            });
            tracing::warn!(job_id = %job_id, route = %attempt.route, attempt = attempt.number, error = %Escaped(&failure.error), %retry_in, "attempt failed; will retry")
        }
        _ => {}
    }
}

/// The delay before retry number `attempt` (1-based count of failures so far): `backoff`
/// doubled per failure, capped at `max_backoff`, then jittered by +-20% so a burst of failures
/// does not retry in lockstep.
fn backoff(config: &HandlerConfig, failures: u32) -> Duration {
    let doubled = config
        .backoff
        .saturating_mul(1u32 << (failures - 1).min(30));
    let capped = doubled.min(config.max_backoff);
    capped.mul_f64(0.8 + 0.4 * fastrand::f64())
}

#[cfg(test)]
mod tests;
