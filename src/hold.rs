//! The hold: while the handler's downstream is down, no attempt starts but one probe at a time.
//!
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
use crate::ledger::{duration_ms, now_ms, Failure, Hold, Ledger};
use crate::logging::Escaped;
use crate::metrics::METRICS;

/// The longest sample error a hold keeps (the journal line and the console show it).
const SAMPLE_ERROR_BYTES: usize = 512;

/// What the worker may do with the job it has in hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    Start,
    /// Held, and the next probe is due: take it in the ledger (this hold's `next_probe_at`).
    ProbeDue(Hold),
    /// Not yet: wait at most this long (or until [`Breaker::changed`]); the worker bounds it by
    /// its own idle look.
    Wait(Duration),
}

/// A change to the hold in the ledger, decided from an attempt's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldChange {
    None,
    Open(Hold),
    End {
        since: i64,
    },
    MoveProbe {
        since: i64,
        from: i64,
        to: i64,
        interval_ms: i64,
    },
}

/// How to record an attempt's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the attempt uses up one of the job's `max_attempts` (else it is given back).
    pub counts: bool,
    pub change: HoldChange,
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
    pub fn new(config: &HandlerConfig, lease_slack: Duration) -> Arc<Breaker> {
        Arc::new(Breaker {
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

    /// Takes in the hold as read from the ledger (the read asked at `asked`); logs one that
    /// another receiver (or `jobs resume`) opened or ended.
    fn observe(&self, read: Option<Hold>, asked: Instant) {
        let mut local = self.local();
        let stale = local.written_at.is_some_and(|written| asked < written);
        if stale || (read.is_none() && local.unrecorded.is_some()) {
            return;
        }
        count_held_time(&mut local);
        match (&local.held, &read) {
            (None, Some(hold)) => {
                tracing::warn!(reason = %Escaped(&hold.reason), sample_error = %Escaped(&hold.sample_error), "handler hold found in the ledger (opened by another receiver, or before a restart): no attempt starts but one probe at a time");
                local.counted_until = Some(Instant::now());
            }
            (Some(hold), None) => {
                let held_for =
                    Duration::from_millis(u64::try_from(now_ms() - hold.since).unwrap_or(0));
                tracing::info!(held_for = %humantime::format_duration(round_secs(held_for)), "handler hold ended elsewhere (another receiver's probe, or `jobs resume`); starting again with a ramp");
                local.ramp_since = Some(Instant::now());
                local.counted_until = None;
                local.probing = false;
            }
            _ => {}
        }
        METRICS.set_hold(read.is_some());
        local.held = read;
        drop(local);
        self.changed.notify_waiters();
    }

    /// Whether the job in hand may start now.
    pub fn turn(&self) -> Turn {
        let mut local = self.local();
        let now = Instant::now();
        if let Some(hold) = &local.held {
            if local.probing {
                // Until the probe ends (its end notifies `changed`); the worker looks again
                // within its own idle bound anyway.
                return Turn::Wait(Duration::MAX);
            }
            let wait = hold.next_probe_at - now_ms();
            if wait > 0 {
                return Turn::Wait(Duration::from_millis(wait.unsigned_abs()));
            }
            return Turn::ProbeDue(hold.clone());
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
                return Turn::Wait(next.saturating_sub(since.elapsed()));
            }
        }
        match local.next_start {
            Some(at) if at > now => Turn::Wait(at - now),
            _ => Turn::Start,
        }
    }

    /// Records a start (a probe's, or an attempt's): it takes a slot of the ramp and a place
    /// in the `max_per_second` spacing.
    pub fn started(&self, probe: bool) {
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
    pub fn unused(&self, probe: Option<(&Hold, i64)>) -> HoldChange {
        let mut local = self.local();
        local.running = local.running.saturating_sub(1);
        let Some((hold, taken_to)) = probe else {
            return HoldChange::None;
        };
        local.probing = false;
        drop(local);
        self.changed.notify_waiters();
        HoldChange::MoveProbe {
            since: hold.since,
            from: taken_to,
            to: now_ms(),
            interval_ms: hold.probe_interval_ms,
        }
    }

    /// The next probe's time to set when this process takes the probe of `hold`: no sooner
    /// than this probe has surely ended.
    pub fn probe_until(&self, hold: &Hold) -> i64 {
        let wait = Duration::from_millis(hold.probe_interval_ms.unsigned_abs());
        now_ms() + duration_ms(wait.max(self.probe_lease))
    }

    /// This process took the probe of `hold` in the ledger, moving the next one to `to`.
    pub fn probe_taken(&self, hold: &Hold, to: i64) {
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
    pub fn finished(
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
                change: HoldChange::MoveProbe {
                    since: hold.since,
                    from,
                    to: now_ms() + wait,
                    interval_ms: interval,
                },
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
        METRICS.set_hold(true);
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
    pub async fn apply(&self, ledger: &Ledger, change: HoldChange) {
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
                        tracing::warn!(reason = %Escaped(&hold.reason), sample_error = %Escaped(&hold.sample_error), first_probe_in = %humantime::format_duration(first_probe_in), "handler hold: the downstream looks down; no attempt starts but one probe at a time, and attempts failing meanwhile are not counted");
                        METRICS.record_hold_opened();
                    }
                    Ok(false) => self.reread(ledger).await,
                    Err(error) => {
                        tracing::warn!(%error, "cannot record a handler hold in the ledger")
                    }
                }
            }
            HoldChange::End { since } => match ledger.end_hold(since, now_ms()).await {
                Ok(Some(hold)) => {
                    let held_for = Duration::from_millis((now_ms() - hold.since).unsigned_abs());
                    let waiting = waiting_jobs(ledger).await;
                    tracing::info!(held_for = %humantime::format_duration(round_secs(held_for)), waiting, reason = %Escaped(&hold.reason), "handler hold ended: an attempt succeeded; the backlog resumes with a ramp");
                    let mut local = self.local();
                    count_held_time(&mut local);
                    local.written_at = Some(Instant::now());
                    local.held = None;
                    local.counted_until = None;
                    local.ramp_since = Some(Instant::now());
                    METRICS.set_hold(false);
                }
                Ok(None) => self.reread(ledger).await,
                Err(error) => tracing::warn!(%error, "cannot end the handler hold in the ledger"),
            },
            HoldChange::MoveProbe {
                since,
                from,
                to,
                interval_ms,
            } => match ledger.move_probe(since, from, to, interval_ms).await {
                Ok(true) => {
                    if let Some(held) = self.local().held.as_mut().filter(|h| h.since == since) {
                        held.next_probe_at = to;
                        held.probe_interval_ms = interval_ms;
                    }
                }
                Ok(false) => self.reread(ledger).await,
                Err(error) => tracing::warn!(%error, "cannot move the handler hold's next probe"),
            },
        }
        self.changed.notify_waiters();
    }

    /// Reads the hold again: another receiver (or an operator) changed it first.
    pub async fn reread(&self, ledger: &Ledger) {
        let asked = Instant::now();
        match ledger.hold().await {
            Ok(read) => self.observe(read, asked),
            Err(error) => tracing::warn!(%error, "cannot read the handler hold"),
        }
    }
}

/// Adds the time held since it was last counted to `sume_handler_held_seconds`.
fn count_held_time(local: &mut Local) {
    if let Some(from) = local.counted_until.as_mut() {
        let now = Instant::now();
        METRICS.add_held_seconds((now - *from).as_secs_f64());
        *from = now;
    }
}

/// Jobs waiting to run (claimed or retrying), for the journal line of a hold's end.
async fn waiting_jobs(ledger: &Ledger) -> u64 {
    ledger
        .metrics_snapshot()
        .await
        .map_or(0, |snapshot| snapshot.waiting_jobs())
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
mod tests {
    use super::*;
    use crate::config::HandlerKind;

    fn breaker() -> Arc<Breaker> {
        let config = HandlerConfig {
            kind: HandlerKind::Command(vec!["true".into()]),
            ca_file: None,
            timeout: Duration::from_secs(1),
            concurrency: 4,
            max_attempts: 5,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(8),
            hold: HoldConfig::default(),
        };
        Breaker::new(&config, Duration::ZERO)
    }

    fn failed(breaker: &Breaker, job_id: &str, failure: Failure, sign: Sign) -> Verdict {
        breaker.started(false);
        let job_id = JobId::parse(job_id).unwrap();
        breaker.finished(&job_id, None, Err((&failure, sign)))
    }

    fn status(code: u16) -> Failure {
        Failure {
            http_status: Some(code),
            ..Failure::new(format!("handler answered {code}"))
        }
    }

    #[test]
    fn content_failures_never_blame_the_downstream() {
        let config = HoldConfig::default();
        for code in [400, 404, 409, 422] {
            assert_eq!(
                blame(&config, &status(code), Sign::Failed),
                Blame::Job,
                "{code}"
            );
        }
        for code in [408, 500, 502] {
            assert_eq!(
                blame(&config, &status(code), Sign::Failed),
                Blame::Maybe,
                "{code}"
            );
        }
        let exit = |code| Failure {
            exit_status: Some(code),
            ..Failure::new("exited")
        };
        assert_eq!(blame(&config, &exit(65), Sign::Failed), Blame::Job);
        assert_eq!(blame(&config, &exit(1), Sign::Failed), Blame::Maybe);
        assert_eq!(
            blame(&config, &exit(75), Sign::Failed),
            Blame::Downstream(None)
        );
        let after = Some(Duration::from_secs(7));
        assert_eq!(
            blame(&config, &status(503), Sign::Busy(after)),
            Blame::Downstream(after)
        );
    }

    #[test]
    fn one_job_failing_again_and_again_is_not_an_outage() {
        let breaker = breaker();
        for _ in 0..10 {
            let verdict = failed(&breaker, "poison", status(500), Sign::Failed);
            assert_eq!(verdict.change, HoldChange::None);
            assert!(verdict.counts);
        }
        for i in 0..3 {
            let verdict = failed(&breaker, &format!("job-{i}"), status(500), Sign::Failed);
            assert_eq!(
                verdict.change,
                HoldChange::None,
                "only {} different jobs",
                i + 2
            );
        }
        // A success between clears the streak.
        breaker.started(false);
        breaker.finished(&JobId::parse("fine").unwrap(), None, Ok(()));
        for i in 0..4 {
            let verdict = failed(&breaker, &format!("again-{i}"), status(502), Sign::Failed);
            assert_eq!(verdict.change, HoldChange::None);
        }
        let verdict = failed(&breaker, "again-4", status(502), Sign::TimedOut);
        assert!(verdict.counts, "the failure that reveals the outage counts");
        let HoldChange::Open(hold) = verdict.change else {
            panic!("5 different jobs in a row open a hold: {verdict:?}");
        };
        assert_eq!(hold.next_probe_at - hold.since, 5_000);
        assert!(hold.reason.contains("5 different jobs"), "{}", hold.reason);
    }

    #[test]
    fn once_held_outage_failures_are_given_back_and_a_failed_probe_doubles_the_wait() {
        let breaker = breaker();
        let verdict = failed(&breaker, "a", Failure::new("refused"), Sign::Unreachable);
        let HoldChange::Open(hold) = verdict.change else {
            panic!("an unreachable downstream opens a hold at once: {verdict:?}");
        };
        breaker.observe(Some(hold.clone()), Instant::now());
        let during = failed(&breaker, "b", status(500), Sign::Failed);
        assert_eq!((during.counts, during.change), (false, HoldChange::None));
        let content = failed(&breaker, "c", status(422), Sign::Failed);
        assert!(
            content.counts,
            "a content failure is the job's own, held or not"
        );

        let taken_to = breaker.probe_until(&hold);
        breaker.probe_taken(&hold, taken_to);
        let probe = breaker.finished(
            &JobId::parse("d").unwrap(),
            Some(taken_to),
            Err((&status(503), Sign::Busy(Some(Duration::from_secs(3600))))),
        );
        assert!(!probe.counts, "a failed probe costs no attempt");
        let HoldChange::MoveProbe {
            from,
            to,
            interval_ms,
            ..
        } = probe.change
        else {
            panic!("{probe:?}");
        };
        assert_eq!((from, interval_ms), (taken_to, 10_000));
        // A Retry-After of an hour is bounded by max_probe_interval (5 min).
        assert!((to - now_ms() - 300_000).abs() < 1_000, "{}", to - now_ms());

        breaker.started(false);
        let success = breaker.finished(&JobId::parse("e").unwrap(), None, Ok(()));
        assert_eq!(success.change, HoldChange::End { since: hold.since });
    }
}
