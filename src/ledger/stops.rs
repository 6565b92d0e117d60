//! The log of dispatch stops (operators' pauses and outage holds), and which delayed a job.
//!
//! Each stop is a row of `dispatch_stops`, begun and ended in the transaction that pauses,
//! resumes, opens or ends a hold, so the log and the state never disagree. A job's timeline
//! names the stops that overlapped the time it waited to run, also long after they ended.

use super::error::StorageError;
use super::model::{DispatchStop, JobDetail, StopKind};
use super::Ledger;

/// The most stops a job's timeline names (its first ones): the log is read by index ranges.
pub const STOPS_PER_JOB: usize = 20;

impl DispatchStop {
    /// Whether it was in force during some of `(from, to)`.
    fn overlaps(&self, (from, to): (i64, i64)) -> bool {
        self.started_at < to && self.ended_at.is_none_or(|ended| ended > from)
    }

    /// One line of a job's timeline, its times written by `time`.
    pub fn describe(&self, time: impl Fn(i64) -> String) -> String {
        let until = self.ended_at.map_or_else(|| "now".to_owned(), &time);
        let span = format!("{} to {until}", time(self.started_at));
        let mut line = match self.kind {
            StopKind::Pause => {
                let by = self.started_by.as_deref().unwrap_or("?");
                match &self.reason {
                    Some(reason) => format!("dispatch paused by {by} {span} ({reason})"),
                    None => format!("dispatch paused by {by} {span}"),
                }
            }
            StopKind::Hold => format!(
                "held: {} {span}",
                self.reason.as_deref().unwrap_or("the outage hold")
            ),
        };
        match (self.ended_at, &self.ended_by, self.kind) {
            (None, _, StopKind::Pause) => line.push_str(", still paused"),
            (None, _, StopKind::Hold) => line.push_str(", still held"),
            (Some(_), Some(by), StopKind::Pause) => line.push_str(&format!(", resumed by {by}")),
            (Some(_), Some(by), StopKind::Hold) => line.push_str(&format!(", ended by {by}")),
            (Some(_), None, _) => {}
        }
        line
    }
}

/// What happened to a job, as its waits read it.
///
/// Its order breaks a tie in time between an attempt's event and an action: within one
/// millisecond an attempt ends, a retry makes the job due, an attempt starts, an action ends
/// the wait.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Ended { again: bool },
    Due,
    Started,
    GivenUp,
}

/// The job's events in the order they happened. An attempt's events keep the order of its
/// history, not of their times: an attempt can start and end within one millisecond (a local
/// downstream answering at once), and its end must not come before its own start.
fn events(job: &JobDetail) -> Vec<(i64, Event)> {
    let attempts = job.history.iter().flat_map(|attempt| {
        let end = match (attempt.ended_at, &attempt.outcome) {
            (Some(ended), Some(outcome)) => {
                let again = !matches!(outcome.as_str(), "done" | "dead");
                Some((ended, Event::Ended { again }))
            }
            _ => None,
        };
        std::iter::once((attempt.started_at, Event::Started)).chain(end)
    });
    let mut actions: Vec<_> = job
        .actions
        .iter()
        .filter_map(|action| match action.action.as_str() {
            "retry" => Some((action.at, Event::Due)),
            "cancel" | "give_up" => Some((action.at, Event::GivenUp)),
            _ => None,
        })
        .collect();
    actions.sort();
    let mut actions = actions.into_iter().peekable();
    let mut events = Vec::with_capacity(job.history.len() * 2 + job.actions.len());
    for event in attempts {
        while let Some(action) = actions.next_if(|action| *action < event) {
            events.push(action);
        }
        events.push(event);
    }
    events.extend(actions);
    events
}

/// The spans of time `job` waited to run: from its receipt, or from when it was due again (an
/// attempt that will be retried ended, an operator's retry), until an attempt started, it was
/// cancelled or given up, or `now` while it still waits. A backoff counts as waiting: a stop
/// during it may have pushed the next attempt back.
pub fn waiting_spans(job: &JobDetail, now: i64) -> Vec<(i64, i64)> {
    let mut spans = Vec::new();
    let mut waiting_since = Some(job.summary.received_at);
    for (at, event) in events(job) {
        match event {
            Event::Started | Event::GivenUp => {
                if let Some(since) = waiting_since.take() {
                    spans.push((since, at));
                }
            }
            Event::Ended { again: true } | Event::Due => {
                waiting_since.get_or_insert(at);
            }
            Event::Ended { again: false } => waiting_since = None,
        }
    }
    if let Some(since) = waiting_since {
        let waiting = matches!(job.summary.state.as_str(), "claimed" | "retrying");
        let until = if waiting {
            now
        } else {
            job.summary.finished_at.unwrap_or(now)
        };
        spans.push((since, until.max(since)));
    }
    spans
}

/// The stops of `stops` that overlapped one of `spans`.
pub fn delaying(stops: Vec<DispatchStop>, spans: &[(i64, i64)]) -> Vec<DispatchStop> {
    stops
        .into_iter()
        .filter(|stop| spans.iter().any(|&span| stop.overlaps(span)))
        .collect()
}

impl Ledger {
    /// The stops of dispatch that delayed `job` (see [`waiting_spans`]), oldest first, at most
    /// [`STOPS_PER_JOB`].
    pub async fn stops_delaying(
        &self,
        job: &JobDetail,
        now: i64,
    ) -> Result<Vec<DispatchStop>, StorageError> {
        let spans = waiting_spans(job, now);
        let (Some(&(from, _)), Some(&(_, to))) = (spans.first(), spans.last()) else {
            return Ok(Vec::new());
        };
        let stops = self.dispatch_stops(from, to, STOPS_PER_JOB).await?;
        Ok(delaying(stops, &spans))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{ActionRecord, AttemptRecord, JobSummary};

    fn job(state: &str, received_at: i64) -> JobDetail {
        JobDetail {
            summary: JobSummary {
                job_id: "j".into(),
                state: state.into(),
                source: "webhook".into(),
                event_type: None,
                attempts: 0,
                received_at,
                next_attempt_at: None,
                finished_at: None,
                last_error: None,
            },
            lease_expires_at: None,
            updated_at: received_at,
            body: None,
            body_purged_at: None,
            duplicates: 0,
            last_duplicate_at: None,
            next_attempt_cause: "first".into(),
            history: Vec::new(),
            actions: Vec::new(),
        }
    }

    fn attempt(started_at: i64, ended_at: i64, outcome: &str) -> AttemptRecord {
        AttemptRecord {
            route: "default".into(),
            number: 1,
            cause: "first".into(),
            receiver: None,
            started_at,
            ended_at: Some(ended_at),
            outcome: Some(outcome.into()),
            exit_status: None,
            http_status: None,
            error: None,
        }
    }

    fn action(at: i64, action: &str) -> ActionRecord {
        ActionRecord {
            at,
            action: action.into(),
            actor: "cli:bob".into(),
            reason: None,
        }
    }

    fn stop(kind: StopKind, started_at: i64, ended_at: Option<i64>) -> DispatchStop {
        DispatchStop {
            route: None,
            kind,
            started_at,
            started_by: Some("console:alice".into()),
            reason: Some("deploy".into()),
            ended_at,
            ended_by: Some("cli:bob".into()),
        }
    }

    #[test]
    fn a_job_waits_until_each_start_and_again_after_a_failure_or_a_retry() {
        let mut retried = job("done", 100);
        retried.history = vec![
            attempt(200, 300, "failed"),
            attempt(400, 500, "done"),
            attempt(900, 950, "done"),
        ];
        retried.actions = vec![action(800, "retry"), action(850, "run_now")];
        retried.summary.finished_at = Some(950);
        assert_eq!(
            waiting_spans(&retried, 10_000),
            [(100, 200), (300, 400), (800, 900)]
        );
        let mut waiting = job("retrying", 100);
        waiting.history = vec![attempt(200, 300, "failed")];
        assert_eq!(waiting_spans(&waiting, 1_000), [(100, 200), (300, 1_000)]);
        let mut cancelled = job("dead", 100);
        cancelled.actions = vec![action(150, "cancel")];
        assert_eq!(waiting_spans(&cancelled, 1_000), [(100, 150)]);
    }

    /// Regression (tests/hold.rs's outage, now and then): a job's last attempt started and
    /// ended within one millisecond, its end was read before its start, and the wait before
    /// it (the backoff the outage's holds had delayed) was lost: its timeline named the pause
    /// it arrived in, and neither hold.
    #[test]
    fn an_attempt_that_ends_in_the_millisecond_it_started_ends_after_its_start() {
        let mut done_at_once = job("done", 181);
        done_at_once.history = vec![attempt(182, 187, "failed"), attempt(5_848, 5_848, "done")];
        done_at_once.summary.finished_at = Some(5_848);
        let spans = waiting_spans(&done_at_once, 10_000);
        assert_eq!(spans, [(181, 182), (187, 5_848)]);
        let stops = vec![
            stop(StopKind::Pause, 178, Some(493)),
            stop(StopKind::Hold, 220, Some(493)),
            stop(StopKind::Hold, 548, Some(5_687)),
        ];
        assert_eq!(delaying(stops, &spans).len(), 3);
        let mut failed_at_once = job("done", 100);
        failed_at_once.history = vec![attempt(200, 200, "released"), attempt(400, 450, "done")];
        failed_at_once.summary.finished_at = Some(450);
        assert_eq!(
            waiting_spans(&failed_at_once, 1_000),
            [(100, 200), (200, 400)]
        );
        // An operator's retry in the millisecond its attempt starts still comes first.
        let mut retried = job("done", 100);
        retried.history = vec![attempt(200, 300, "dead"), attempt(800, 800, "done")];
        retried.actions = vec![action(800, "retry")];
        retried.summary.finished_at = Some(800);
        assert_eq!(waiting_spans(&retried, 1_000), [(100, 200), (800, 800)]);
    }

    #[test]
    fn only_the_stops_during_a_wait_delayed_the_job() {
        let spans = [(100, 200), (300, 400)];
        let stops = vec![
            stop(StopKind::Pause, 10, Some(90)),
            stop(StopKind::Hold, 50, Some(120)),
            stop(StopKind::Pause, 210, Some(290)),
            stop(StopKind::Pause, 390, None),
            stop(StopKind::Hold, 400, None),
        ];
        let kept: Vec<_> = delaying(stops, &spans)
            .iter()
            .map(|stop| stop.started_at)
            .collect();
        assert_eq!(kept, [50, 390]);
    }

    #[test]
    fn a_stop_says_who_why_and_when() {
        let time = |ms: i64| format!("t{ms}");
        assert_eq!(
            stop(StopKind::Pause, 1, Some(2)).describe(time),
            "dispatch paused by console:alice t1 to t2 (deploy), resumed by cli:bob"
        );
        let mut hold = stop(StopKind::Hold, 1, None);
        hold.reason = Some("the handler's downstream cannot be reached".into());
        assert_eq!(
            hold.describe(time),
            "held: the handler's downstream cannot be reached t1 to now, still held"
        );
    }
}
