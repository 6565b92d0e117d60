//! The hold: while a route's downstream is down, no attempt of that route starts but one probe at a time.
//!
//! One [`Breaker`] per route: a route's hold holds that route alone, every other route runs.
//! A circuit breaker on the work side. It opens when `hold_after` different jobs fail in a row
//! with no success between, or at once when an attempt cannot reach the downstream, or the
//! downstream answers 429 or 503 (its `Retry-After` delays the first probe). Failures that
//! blame the job (HTTP 4xx but 408 and 429; a command's `content_exit_statuses`) neither open
//! nor feed it. The hold is a row in the ledger, so every receiver sharing it holds (each reads
//! it with the dispatch pause, at most every `worker::IDLE_LOOK` while idle) and a
//! restart keeps it.
//!
//! While held, one due job at a time is tried (the probe), first `probe_interval` after the
//! hold opened, then at doubling waits up to `max_probe_interval`; the receiver that moves the
//! next probe's time in the ledger first runs it. A failed probe is given back uncounted, and
//! so is every attempt that fails for the outage once the hold is open: the failures that
//! revealed the outage (those before the hold opened) are the only ones a job pays for. The
//! first success ends the hold; slots then open one at a time, doubling every `ramp` up to
//! `concurrency`. `max_per_second`, when set, spaces every start, held or not.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::config::{HandlerConfig, HoldConfig};
use crate::handler::Sign;
use crate::job_id::JobId;
use crate::ledger::{duration_ms, now_ms, Failure, Hold, Ledger, ProbeMove, StorageError};
use crate::logging::Escaped;
use crate::metrics::METRICS;
use crate::route_name::RouteName;

/// The longest sample error a hold keeps (the journal line and the console show it).
const SAMPLE_ERROR_BYTES: usize = 512;

/// What the worker may do with the job it has in hand (see [`Breaker::take_turn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Start it under this ticket, which goes back to the hold when the attempt is settled.
    Start(Ticket),
    /// Not yet: wait at most this long (or until [`Breaker::changed`]); the worker bounds it by
    /// its own idle look.
    Wait(Duration),
}

/// A start the hold allowed: the worker hands it back with [`Breaker::settle`], or with
/// [`Breaker::give_back`] if no attempt ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticket {
    /// An attempt like any other.
    Attempt,
    /// The hold's probe, taken in the ledger: the hold, and the next probe's time this process
    /// set when it took it.
    Probe { hold: Hold, taken_to: i64 },
}

impl Ticket {
    pub fn is_probe(&self) -> bool {
        matches!(self, Ticket::Probe { .. })
    }
}

/// How an attempt's handler run ended, as the hold reads it.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    Succeeded,
    Failed(&'a Failure, Sign),
    /// Our own shutdown stopped it: it says nothing of the downstream.
    Interrupted,
}

/// Whether the job in hand may start now, before the ledger is asked for a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    Start,
    /// Held, and the next probe is due: take it in the ledger (this hold's `next_probe_at`).
    ProbeDue(Hold),
    Wait(Duration),
}

/// A change to the hold in the ledger, decided from an attempt's end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HoldChange {
    None,
    Open(Hold),
    End { since: i64 },
    MoveProbe(ProbeMove),
}

/// How to record an attempt's end.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    /// Whether the attempt uses up one of the job's `max_attempts` (else it is given back).
    counts: bool,
    change: HoldChange,
}

/// What a failure says about the downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// The job's own content: not the downstream's.
    Job,
    /// Maybe the downstream: `hold_after` different jobs in a row make an outage.
    Maybe,
    /// Surely the downstream (unreachable, or it said so), with when it said to come back.
    Downstream(Option<Duration>),
}

fn blame(config: &HoldConfig, failure: &Failure, sign: Sign) -> Blame {
    match sign {
        Sign::Unreachable => return Blame::Downstream(None),
        Sign::Busy(retry_after) => return Blame::Downstream(retry_after),
        Sign::TimedOut | Sign::Failed => {}
    }
    if failure
        .http_status
        .is_some_and(|status| (400..500).contains(&status) && status != 408 && status != 429)
    {
        return Blame::Job;
    }
    match failure.exit_status {
        Some(status) if config.content_exit_statuses.contains(&status) => Blame::Job,
        // EX_TEMPFAIL (sysexits.h): "try again later", the command's way to say 503.
        Some(75) => Blame::Downstream(None),
        _ => Blame::Maybe,
    }
}

/// This process's view of the hold, shared by the worker loop, its job runs and `/readyz`.
pub struct Breaker {
    route: RouteName,
    config: HoldConfig,
    concurrency: usize,
    /// A taken probe keeps the next one away this long at least: until it has surely ended.
    probe_lease: Duration,
    local: Mutex<Local>,
    /// Wakes a worker waiting for its turn: an attempt ended, or the hold changed.
    pub changed: Notify,
}

#[derive(Default)]
struct Local {
    /// Different jobs that failed in a row, no success between (at most `hold_after`).
    streak: Vec<JobId>,
    held: Option<Hold>,
    /// The hold this process opened, until the ledger has it: a read meanwhile does not end it.
    unrecorded: Option<i64>,
    /// When this process last wrote the hold to the ledger: a read asked before it is stale.
    written_at: Option<Instant>,
    /// Since when this process counts `sume_handler_held_seconds`.
    counted_until: Option<Instant>,
    probing: bool,
    ramp_since: Option<Instant>,
    running: usize,
    next_start: Option<Instant>,
}

impl Breaker {
    pub fn new(route: RouteName, config: &HandlerConfig, lease_slack: Duration) -> Arc<Breaker> {
        Arc::new(Breaker {
            route,
            config: config.hold.clone(),
            concurrency: config.concurrency,
            probe_lease: config.timeout + lease_slack,
            local: Mutex::default(),
            changed: Notify::new(),
        })
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().expect("not poisoned")
    }

    /// The hold as this process last read it from the ledger (the console reads the ledger's
    /// own: `Ledger::hold`).
    pub fn hold(&self) -> Option<Hold> {
        self.local().held.clone()
    }

    /// The route this breaker holds.
    pub fn route(&self) -> &RouteName {
        &self.route
    }

    /// Takes in the hold as read from the ledger (the read asked at `asked`); logs one that
    /// another receiver (or `jobs resume`) opened or ended.
    fn observe(&self, read: Option<Hold>, asked: Instant) {
        let mut local = self.local();
        let stale = local.written_at.is_some_and(|written| asked < written);
        if stale || (read.is_none() && local.unrecorded.is_some()) {
            return;
        }
        count_held_time(&self.route, &mut local);
        match (&local.held, &read) {
            (None, Some(hold)) => {
                tracing::warn!(route = %self.route, reason = %Escaped(&hold.reason), sample_error = %Escaped(&hold.sample_error), "handler hold found in the ledger (opened by another receiver, or before a restart): no attempt starts but one probe at a time");
                local.counted_until = Some(Instant::now());
            }
            (Some(hold), None) => {
                let held_for =
                    Duration::from_millis(u64::try_from(now_ms() - hold.since).unwrap_or(0));
                tracing::info!(route = %self.route, held_for = %humantime::format_duration(round_secs(held_for)), "handler hold ended elsewhere (another receiver's probe, or `jobs resume`); starting again with a ramp");
                local.ramp_since = Some(Instant::now());
                local.counted_until = None;
                local.probing = false;
            }
            _ => {}
        }
        METRICS.routes.set_hold(&self.route, read.is_some());
        local.held = read;
        drop(local);
        self.changed.notify_waiters();
    }

    /// Whether the job in hand may start now: at once, as the hold's probe (taken in the
    /// ledger here, so that one receiver runs it), or not yet. A ledger that cannot take the
    /// probe is the caller's to report and wait out.
    pub async fn take_turn(&self, ledger: &Ledger) -> Result<Turn, StorageError> {
        loop {
            let hold = match self.next() {
                Next::Start => {
                    self.started(false);
                    return Ok(Turn::Start(Ticket::Attempt));
                }
                Next::Wait(wait) => return Ok(Turn::Wait(wait)),
                Next::ProbeDue(hold) => hold,
            };
            let to = self.probe_until(&hold);
            let taken = ProbeMove {
                route: self.route.as_str().to_owned(),
                since: hold.since,
                from: hold.next_probe_at,
                to,
                interval_ms: hold.probe_interval_ms,
            };
            if ledger.move_probe(&taken).await? {
                self.probe_taken(&hold, to);
                return Ok(Turn::Start(Ticket::Probe { hold, taken_to: to }));
            }
            // Another receiver took it first.
            self.reread(ledger).await;
        }
    }

    /// A ticket whose attempt did not run (the job was no longer due, or its start failed):
    /// a probe's lets the next probe start at once.
    pub async fn give_back(&self, ledger: &Ledger, ticket: Ticket) {
        let change = self.unused(&ticket);
        self.apply(ledger, change).await;
    }

    /// Settles the attempt that ran under `ticket`: the hold learns from `outcome`, changes in
    /// the ledger as it says, and answers whether the attempt counts (else the caller gives
    /// it back uncounted).
    pub async fn settle(
        &self,
        ledger: &Ledger,
        job_id: &JobId,
        ticket: Ticket,
        outcome: Outcome<'_>,
    ) -> bool {
        let result = match outcome {
            Outcome::Succeeded => Ok(()),
            Outcome::Failed(failure, sign) => Err((failure, sign)),
            Outcome::Interrupted => {
                // A probe stopped by shutdown stays taken until its time: this process stops.
                self.unused(&Ticket::Attempt);
                return false;
            }
        };
        if result.is_err() && ledger.is_shared() {
            // Another receiver may have opened a hold that this one has not read yet (each
            // reads it every second): a failure for an outage the ledger knows of costs the
            // job no attempt, whichever receiver ran it.
            self.reread(ledger).await;
        }
        let taken_to = match &ticket {
            Ticket::Probe { taken_to, .. } => Some(*taken_to),
            Ticket::Attempt => None,
        };
        let verdict = self.finished(job_id, taken_to, result);
        self.apply(ledger, verdict.change).await;
        verdict.counts
    }

    /// Whether the job in hand may start now, as this process knows the hold.
    fn next(&self) -> Next {
        let mut local = self.local();
        let now = Instant::now();
        if let Some(hold) = &local.held {
            if local.probing {
                // Until the probe ends (its end notifies `changed`); the worker looks again
                // within its own idle bound anyway.
                return Next::Wait(Duration::MAX);
            }
            let wait = hold.next_probe_at - now_ms();
            if wait > 0 {
                return Next::Wait(Duration::from_millis(wait.unsigned_abs()));
            }
            return Next::ProbeDue(hold.clone());
        }
        if let Some(since) = local.ramp_since {
            let ramp = self.config.ramp;
            let doublings = if ramp.is_zero() {
                u32::MAX
            } else {
                u32::try_from(since.elapsed().as_nanos() / ramp.as_nanos()).unwrap_or(u32::MAX)
            };
            let slots = 1usize.checked_shl(doublings.min(63)).unwrap_or(usize::MAX);
            if slots >= self.concurrency {
                local.ramp_since = None;
            } else if local.running >= slots {
                let next = ramp * (doublings + 1);
                return Next::Wait(next.saturating_sub(since.elapsed()));
            }
        }
        match local.next_start {
            Some(at) if at > now => Next::Wait(at - now),
            _ => Next::Start,
        }
    }

    /// Records a start (a probe's, or an attempt's): it takes a slot of the ramp and a place
    /// in the `max_per_second` spacing.
    fn started(&self, probe: bool) {
        let mut local = self.local();
        local.running += 1;
        local.probing |= probe;
        if let Some(rate) = self.config.max_per_second {
            let now = Instant::now();
            let from = local.next_start.map_or(now, |at| at.max(now));
            local.next_start = Some(from + Duration::from_secs_f64(1.0 / rate));
        }
    }

    /// An attempt counted by [`Breaker::started`] did not run (the job was no longer due, or
    /// shutdown stopped it). A probe that did not run lets the next one start at once.
    fn unused(&self, ticket: &Ticket) -> HoldChange {
        let mut local = self.local();
        local.running = local.running.saturating_sub(1);
        let Ticket::Probe { hold, taken_to } = ticket else {
            return HoldChange::None;
        };
        local.probing = false;
        drop(local);
        self.changed.notify_waiters();
        HoldChange::MoveProbe(ProbeMove {
            route: self.route.as_str().to_owned(),
            since: hold.since,
            from: *taken_to,
            to: now_ms(),
            interval_ms: hold.probe_interval_ms,
        })
    }

    /// The next probe's time to set when this process takes the probe of `hold`: no sooner
    /// than this probe has surely ended.
    fn probe_until(&self, hold: &Hold) -> i64 {
        let wait = Duration::from_millis(hold.probe_interval_ms.unsigned_abs());
        now_ms() + duration_ms(wait.max(self.probe_lease))
    }

    /// This process took the probe of `hold` in the ledger, moving the next one to `to`.
    fn probe_taken(&self, hold: &Hold, to: i64) {
        if let Some(held) = self
            .local()
            .held
            .as_mut()
            .filter(|held| held.since == hold.since)
        {
            held.next_probe_at = to;
        }
        self.started(true);
    }

    /// An attempt ended: whether it counts, and what it changes of the hold. `probe` is the
    /// next probe's time this process set when it took the probe.
    fn finished(
        &self,
        job_id: &JobId,
        probe: Option<i64>,
        outcome: Result<(), (&Failure, Sign)>,
    ) -> Verdict {
        let mut local = self.local();
        local.running = local.running.saturating_sub(1);
        if probe.is_some() {
            local.probing = false;
        }
        let verdict = self.judge(&mut local, job_id, probe, outcome);
        drop(local);
        self.changed.notify_waiters();
        verdict
    }

    fn judge(
        &self,
        local: &mut Local,
        job_id: &JobId,
        probe: Option<i64>,
        outcome: Result<(), (&Failure, Sign)>,
    ) -> Verdict {
        let counts = |change| Verdict {
            counts: true,
            change,
        };
        let (failure, sign) = match outcome {
            Ok(()) => {
                local.streak.clear();
                return counts(match &local.held {
                    Some(hold) => HoldChange::End { since: hold.since },
                    None => HoldChange::None,
                });
            }
            Err(failed) => failed,
        };
        let blame = blame(&self.config, failure, sign);
        if let (Some(hold), Some(from)) = (&local.held, probe) {
            let (counts, interval, retry_after) = match blame {
                // The job's own fault: it pays, and the next probe may start at once.
                Blame::Job => (true, hold.probe_interval_ms, None),
                Blame::Maybe => (false, self.doubled(hold.probe_interval_ms), None),
                Blame::Downstream(after) => (false, self.doubled(hold.probe_interval_ms), after),
            };
            let wait = if counts {
                0
            } else {
                interval.max(duration_ms(self.bounded(retry_after)))
            };
            return Verdict {
                counts,
                change: HoldChange::MoveProbe(ProbeMove {
                    route: self.route.as_str().to_owned(),
                    since: hold.since,
                    from,
                    to: now_ms() + wait,
                    interval_ms: interval,
                }),
            };
        }
        if blame == Blame::Job {
            return counts(HoldChange::None);
        }
        if local.held.is_some() {
            // The outage, already known: not the job's attempt to pay.
            return Verdict {
                counts: false,
                change: HoldChange::None,
            };
        }
        if self.config.hold_after == 0 {
            return counts(HoldChange::None);
        }
        if !local.streak.contains(job_id) {
            local.streak.push(job_id.clone());
        }
        let (reason, retry_after) = match blame {
            Blame::Downstream(retry_after) => (
                match sign {
                    Sign::Unreachable => "the handler's downstream cannot be reached".to_owned(),
                    _ => "the handler's downstream says it is unavailable".to_owned(),
                },
                retry_after,
            ),
            _ if local.streak.len() >= self.config.hold_after as usize => (
                format!(
                    "{} different jobs failed in a row, no success between",
                    local.streak.len()
                ),
                None,
            ),
            _ => return counts(HoldChange::None),
        };
        local.streak.clear();
        let since = now_ms();
        let interval = duration_ms(self.config.probe_interval);
        let first_wait = interval.max(duration_ms(self.bounded(retry_after)));
        let hold = Hold {
            route: self.route.as_str().to_owned(),
            since,
            reason,
            sample_error: sample(&failure.error),
            next_probe_at: since + first_wait,
            probe_interval_ms: interval,
        };
        // Held here at once: this job's retry, due soon, must not start before the ledger has
        // the hold.
        local.held = Some(hold.clone());
        local.unrecorded = Some(hold.since);
        local.counted_until = Some(Instant::now());
        local.ramp_since = None;
        METRICS.routes.set_hold(&self.route, true);
        counts(HoldChange::Open(hold))
    }

    fn doubled(&self, interval_ms: i64) -> i64 {
        interval_ms
            .saturating_mul(2)
            .min(duration_ms(self.config.max_probe_interval))
    }

    /// A `Retry-After`, no longer than `max_probe_interval`.
    fn bounded(&self, retry_after: Option<Duration>) -> Duration {
        retry_after.map_or(Duration::ZERO, |after| {
            after.min(self.config.max_probe_interval)
        })
    }

    /// Makes `change` in the ledger and in this process, with its journal line. A ledger that
    /// takes no change leaves the hold as it was; the next read of it sets this process right.
    async fn apply(&self, ledger: &Ledger, change: HoldChange) {
        match change {
            HoldChange::None => {}
            HoldChange::Open(hold) => {
                let opened = ledger.open_hold(&hold).await;
                {
                    let mut local = self.local();
                    local.unrecorded = None;
                    local.written_at = Some(Instant::now());
                }
                match opened {
                    Ok(true) => {
                        let first_probe_in =
                            Duration::from_millis((hold.next_probe_at - hold.since).unsigned_abs());
                        tracing::warn!(route = %self.route, reason = %Escaped(&hold.reason), sample_error = %Escaped(&hold.sample_error), first_probe_in = %humantime::format_duration(first_probe_in), "handler hold: the downstream looks down; no attempt starts but one probe at a time, and attempts failing meanwhile are not counted");
                        METRICS.routes.record_hold_opened(&self.route);
                    }
                    Ok(false) => self.reread(ledger).await,
                    Err(error) => {
                        tracing::warn!(route = %self.route, %error, "cannot record a handler hold in the ledger")
                    }
                }
            }
            HoldChange::End { since } => {
                match ledger.end_hold(&self.route, since, now_ms()).await {
                    Ok(Some(hold)) => {
                        let held_for =
                            Duration::from_millis((now_ms() - hold.since).unsigned_abs());
                        let waiting = waiting_jobs(ledger, &self.route).await;
                        tracing::info!(route = %self.route, held_for = %humantime::format_duration(round_secs(held_for)), waiting, reason = %Escaped(&hold.reason), "handler hold ended: an attempt succeeded; the backlog resumes with a ramp");
                        let mut local = self.local();
                        count_held_time(&self.route, &mut local);
                        local.written_at = Some(Instant::now());
                        local.held = None;
                        local.counted_until = None;
                        local.ramp_since = Some(Instant::now());
                        METRICS.routes.set_hold(&self.route, false);
                    }
                    Ok(None) => self.reread(ledger).await,
                    Err(error) => {
                        tracing::warn!(route = %self.route, %error, "cannot end the handler hold in the ledger")
                    }
                }
            }
            HoldChange::MoveProbe(moved) => match ledger.move_probe(&moved).await {
                Ok(true) => {
                    if let Some(held) = self
                        .local()
                        .held
                        .as_mut()
                        .filter(|h| h.since == moved.since)
                    {
                        held.next_probe_at = moved.to;
                        held.probe_interval_ms = moved.interval_ms;
                    }
                }
                Ok(false) => self.reread(ledger).await,
                Err(error) => {
                    tracing::warn!(route = %self.route, %error, "cannot move the handler hold's next probe")
                }
            },
        }
        self.changed.notify_waiters();
    }

    /// Reads the hold again: another receiver (or an operator) changed it first.
    pub async fn reread(&self, ledger: &Ledger) {
        let asked = Instant::now();
        match ledger.hold(&self.route).await {
            Ok(read) => self.observe(read, asked),
            Err(error) => {
                tracing::warn!(route = %self.route, %error, "cannot read the handler hold")
            }
        }
    }
}

/// Adds the time held since it was last counted to the route's `sume_handler_held_seconds`.
fn count_held_time(route: &RouteName, local: &mut Local) {
    if let Some(from) = local.counted_until.as_mut() {
        let now = Instant::now();
        METRICS
            .routes
            .add_held_seconds(route, (now - *from).as_secs_f64());
        *from = now;
    }
}

/// Jobs waiting to run on `route` (claimed or retrying), for the journal line of a hold's end.
async fn waiting_jobs(ledger: &Ledger, route: &RouteName) -> u64 {
    ledger
        .metrics_snapshot()
        .await
        .map_or(0, |snapshot| snapshot.waiting_on(route.as_str()))
}

fn round_secs(duration: Duration) -> Duration {
    Duration::from_secs(duration.as_secs())
}

/// The head of an error, cut on a character boundary.
fn sample(error: &str) -> String {
    let mut end = error.len().min(SAMPLE_ERROR_BYTES);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end].to_owned()
}

#[cfg(test)]
mod tests;
