//! The ledger's domain: jobs, attempts, expectations and what the operations take and return.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::error::StorageError;
use crate::config::{unmatched_error, Selection};
use crate::event_type::EventType;
use crate::job_id::JobId;
use crate::raw_body::RawBody;
use crate::route_name::RouteName;

/// Milliseconds since the Unix epoch: the unit of every time column.
pub fn now_ms() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

pub fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Claimed,
    Running,
    Retrying,
    Done,
    Dead,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Claimed,
        State::Running,
        State::Retrying,
        State::Done,
        State::Dead,
    ];

    pub fn is_finished(self) -> bool {
        matches!(self, State::Done | State::Dead)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Claimed => "claimed",
            State::Running => "running",
            State::Retrying => "retrying",
            State::Done => "done",
            State::Dead => "dead",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        State::ALL.into_iter().find(|state| state.as_str() == text).ok_or_else(|| {
            format!("unknown state {text:?}; expected one of claimed, running, retrying, done, dead")
        })
    }
}

/// How a job reached the ledger; handlers see it as `SUME_DELIVERY_SOURCE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Webhook,
    Poll,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Webhook => "webhook",
            Source::Poll => "poll",
        }
    }

    pub fn parse(text: &str) -> Source {
        if text == "poll" {
            Source::Poll
        } else {
            Source::Webhook
        }
    }
}

#[derive(Debug, Clone)]
pub struct NewClaim {
    pub job_id: JobId,
    pub event_type: Option<EventType>,
    pub body: RawBody,
    pub source: Source,
    /// The delivery's W3C trace context (`traceparent`, then `tracestate` on a second line),
    /// kept so that every attempt joins its trace; `None` with tracing off.
    pub trace_context: Option<String>,
    /// The work the claim writes with it, decided by the routes when it was received.
    pub routing: Routing,
}

/// The work a claim writes in its own transaction: the routes the event takes, or, when none
/// takes it, the job finished at once as the config says, never dropped unseen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routing {
    /// A row of work per route, each run, retried and held on its own (at least one).
    Routes(Vec<RouteName>),
    /// No route takes the event: the job is recorded `done` (no work) or `dead` with `error`.
    Unrouted { state: FinishedState, error: String },
}

impl Routing {
    /// The one route of `[handler]` (and of a receiver with no handler, whose jobs wait for
    /// an external consumer).
    pub fn default_route() -> Routing {
        Routing::Routes(vec![RouteName::default_route()])
    }

    /// The work the routes' `selection` gives an event of `event_type`.
    pub fn chosen(selection: &Selection<'_>, event_type: Option<&EventType>) -> Routing {
        let unmatched = || unmatched_error(event_type.map(EventType::as_str));
        match selection {
            Selection::Matched(_) | Selection::Fallback(_) => Routing::Routes(
                selection
                    .routes()
                    .iter()
                    .map(|route| route.name.clone())
                    .collect(),
            ),
            Selection::Done => Routing::Unrouted {
                state: FinishedState::Done,
                error: format!("{} (routing.unmatched = \"done\")", unmatched()),
            },
            Selection::Dead => Routing::Unrouted {
                state: FinishedState::Dead,
                error: unmatched(),
            },
            // Waiting for an external consumer, as before routes.
            Selection::NoRoutes => Routing::default_route(),
        }
    }

    /// The routes the claim starts work on.
    pub fn routes(&self) -> &[RouteName] {
        match self {
            Routing::Routes(routes) => routes,
            Routing::Unrouted { .. } => &[],
        }
    }

    /// The job's state as the claim writes it, and its error and finish time.
    pub fn claimed_state(&self) -> (&'static str, Option<&str>) {
        match self {
            Routing::Routes(_) => ("claimed", None),
            Routing::Unrouted { state, error } => (state.as_str(), Some(error)),
        }
    }
}

/// A job finished at its claim: the two ends of [`State`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedState {
    Done,
    Dead,
}

impl FinishedState {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishedState::Done => "done",
            FinishedState::Dead => "dead",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    Claimed,
    Duplicate,
}

/// What a handler needs to run one attempt of a job.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub job_id: JobId,
    /// The route this attempt runs for; its number counts that route's attempts.
    pub route: RouteName,
    /// 1-based number of this attempt.
    pub number: u32,
    pub event_type: Option<String>,
    pub source: Source,
    pub body: String,
    /// Where the start wrote the attempt, for the ledger that wrote it (see [`AttemptRows`]).
    pub rows: Option<AttemptRows>,
}

/// The rows an attempt's start wrote, kept for its end: the ledger then changes them by their
/// numbers instead of looking the job up again by its job_id, a random key. Only the ledger
/// that made them reads them; `None` where it keeps no such numbers (PostgreSQL) and for an
/// attempt made elsewhere (a replay), whose end finds its rows by job_id, route and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptRows {
    /// The job's row (SQLite: `jobs.id`).
    pub job: i64,
    /// The attempt's entry in the job's history (SQLite: `job_attempts.id`).
    pub history: i64,
}

/// How an attempt failed, as the handler saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failure {
    /// What the ledger records as the job's last error, with the tail of the handler's stderr
    /// or of its HTTP answer.
    pub error: String,
    /// A command handler's exit status.
    pub exit_status: Option<i32>,
    /// An HTTP handler's answer.
    pub http_status: Option<u16>,
}

impl Failure {
    pub fn new(error: impl Into<String>) -> Failure {
        Failure {
            error: error.into(),
            ..Failure::default()
        }
    }
}

/// The end of one attempt, as the worker decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    Done,
    /// Failed; retry at the given time, or never (`None`: the job is dead).
    Failed {
        failure: Failure,
        retry_at: Option<i64>,
    },
}

impl AttemptEnd {
    /// The job's new state, the failure to record and when to retry.
    pub fn outcome(&self) -> (State, Option<&Failure>, Option<i64>) {
        match self {
            AttemptEnd::Done => (State::Done, None, None),
            AttemptEnd::Failed {
                failure,
                retry_at: Some(at),
            } => (State::Retrying, Some(failure), Some(*at)),
            AttemptEnd::Failed {
                failure,
                retry_at: None,
            } => (State::Dead, Some(failure), None),
        }
    }

    /// The `outcome` of the attempt's history row.
    pub fn history_outcome(&self) -> &'static str {
        match self.outcome().0 {
            State::Done => "done",
            State::Dead => "dead",
            _ => "failed",
        }
    }
}

/// Why an attempt is given back uncounted (`released` in its history) and its job due again at
/// once: what its history says, and the cause of the job's next attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// This receiver's shutdown stopped the handler.
    Shutdown,
    /// It failed while a hold (an outage of the handler's downstream) was open: a failed
    /// probe, or an attempt the outage caught.
    Held(Failure),
}

impl Release {
    /// The `cause` of the job's next attempt.
    pub fn next_cause(&self) -> &'static str {
        match self {
            Release::Shutdown => "restart",
            Release::Held(_) => "hold",
        }
    }

    /// What the released attempt's history row keeps: why, and the handler's own status.
    pub fn recorded(&self) -> Failure {
        match self {
            Release::Shutdown => Failure::new(
                "given back uncounted: the handler was stopped by this receiver's shutdown",
            ),
            Release::Held(failure) => Failure {
                error: format!(
                    "given back uncounted: failed during a handler hold (the downstream looks down): {}",
                    failure.error
                ),
                ..failure.clone()
            },
        }
    }
}

/// How many attempts and how many actions a job's history keeps (the oldest go first).
pub const HISTORY_PER_JOB: i64 = 100;

/// One attempt in a job's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    pub route: String,
    pub number: u32,
    /// first, poll, backoff, take_back, restart (after our shutdown gave the last one back),
    /// hold (after a hold gave the last one back), manual_retry, run_now
    pub cause: String,
    pub receiver: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    /// done, failed, dead, taken_back, released; `None` while it runs
    pub outcome: Option<String>,
    pub exit_status: Option<i32>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

/// One operator action in a job's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionRecord {
    pub at: i64,
    /// retry, run_now, cancel, give_up
    pub action: String,
    /// `cli:<user>`, `admin`, or `receiver` (the service itself)
    pub actor: String,
    pub reason: Option<String>,
}

/// The actor of actions the service takes on its own.
pub const RECEIVER_ACTOR: &str = "receiver";

/// A running attempt found by its lease: the job and the attempt's number (the fencing token).
#[derive(Debug, Clone)]
pub struct LeasedAttempt {
    pub job_id: String,
    pub route: String,
    pub number: i64,
}

/// Due work, as the worker takes it.
#[derive(Debug, Default)]
pub struct DueJobs {
    pub runnable: Vec<JobId>,
    /// Stored ids that can never run, with the reason.
    pub unrunnable: Vec<(String, String)>,
    /// When the earliest waiting job is due (it may be one of the above).
    pub next_at: Option<i64>,
}

impl DueJobs {
    /// Splits due job_ids into those that can run and those that cannot.
    pub fn sort(job_ids: Vec<String>, next_at: Option<i64>) -> DueJobs {
        let mut due = DueJobs {
            next_at,
            ..DueJobs::default()
        };
        for text in job_ids {
            match JobId::parse(&text) {
                Ok(job_id) => due.runnable.push(job_id),
                Err(error) => due.unrunnable.push((text, error.to_string())),
            }
        }
        due
    }
}

/// One row of `jobs list`.
#[derive(Debug, Clone, Serialize)]
pub struct JobSummary {
    pub job_id: String,
    pub state: String,
    pub source: String,
    pub event_type: Option<String>,
    pub attempts: u32,
    pub received_at: i64,
    pub next_attempt_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub last_error: Option<String>,
}

/// Everything `jobs show` prints.
#[derive(Debug, Clone, Serialize)]
pub struct JobDetail {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub lease_expires_at: Option<i64>,
    pub updated_at: i64,
    /// `None` once retention purged it.
    pub body: Option<String>,
    /// When retention purged the body.
    pub body_purged_at: Option<i64>,
    /// Deliveries after the first (written every second), and when the last came.
    pub duplicates: u32,
    pub last_duplicate_at: Option<i64>,
    /// Why the next attempt will run, while the job waits for it.
    pub next_attempt_cause: String,
    /// Every attempt kept, oldest first.
    pub history: Vec<AttemptRecord>,
    /// Every operator action kept, oldest first.
    pub actions: Vec<ActionRecord>,
}

/// Names every state in `rows` of (state, count), 0 for a state without a row.
pub fn state_counts(rows: Vec<(String, i64)>) -> Vec<(State, u64)> {
    let mut counts: Vec<(State, u64)> = State::ALL.iter().map(|&state| (state, 0)).collect();
    for (name, count) in rows {
        if let Some(entry) = counts.iter_mut().find(|(state, _)| state.as_str() == name) {
            entry.1 = count.unsigned_abs();
        }
    }
    counts
}

/// What `jobs stats` shows.
#[derive(Debug, Clone, Serialize)]
pub struct JobStats {
    pub by_state: std::collections::BTreeMap<String, u64>,
    /// When the oldest job still waiting or running was received (Unix ms).
    pub oldest_unfinished_received_at: Option<i64>,
    pub received_last_hour: u64,
    pub dead_last_day: u64,
}

const HOUR_MS: i64 = 3_600_000;

impl JobStats {
    /// Puts together the counts by state and the three figures of `jobs stats`.
    pub fn from_counts(
        by_state: Vec<(String, i64)>,
        (oldest, received_last_hour, dead_last_day): (Option<i64>, i64, i64),
    ) -> JobStats {
        let mut counts: std::collections::BTreeMap<String, u64> = State::ALL
            .iter()
            .map(|s| (s.as_str().to_owned(), 0))
            .collect();
        for (state, count) in by_state {
            counts.insert(state, count.unsigned_abs());
        }
        JobStats {
            by_state: counts,
            oldest_unfinished_received_at: oldest,
            received_last_hour: received_last_hour.unsigned_abs(),
            dead_last_day: dead_last_day.unsigned_abs(),
        }
    }

    /// The cutoffs of `jobs stats` at `now`: an hour ago, a day ago.
    pub fn since(now: i64) -> (i64, i64) {
        (now - HOUR_MS, now - 24 * HOUR_MS)
    }
}

/// Why `jobs retry` refused.
#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error("no job {0:?} in the ledger")]
    Unknown(String),
    #[error("job {job_id:?} is {state}; only done or dead jobs can be retried")]
    NotFinished { job_id: String, state: String },
    #[error("job {0:?} has no stored body any more (retention purged it); it cannot run again")]
    BodyPurged(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl RetryError {
    /// Why a retry changed nothing, from the job's row if there is one: its state, and whether its
    /// body was purged.
    pub fn refusal(job_id: &str, found: Option<(String, bool)>) -> RetryError {
        match found {
            None => RetryError::Unknown(job_id.to_owned()),
            Some((_, true)) => RetryError::BodyPurged(job_id.to_owned()),
            Some((state, false)) => RetryError::NotFinished {
                job_id: job_id.to_owned(),
                state,
            },
        }
    }
}

/// An expected job whose poll is due.
#[derive(Debug, Clone)]
pub struct DueExpectation {
    pub job_id: String,
    pub expected_at: i64,
    pub polls: u32,
}

/// What one look at an expected job found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollResult {
    /// Terminal at Sume, and the poll's claim was the first: the poll recovered it.
    Recovered {
        status: String,
    },
    /// Terminal at Sume, but a webhook had claimed it already.
    Arrived {
        status: String,
    },
    /// Not terminal yet, or the call failed: look again at `next_poll_at`.
    Again {
        status: Option<String>,
        error: Option<String>,
        next_poll_at: i64,
    },
    GivenUp {
        error: Option<String>,
    },
}

impl PollResult {
    /// What a recorded poll writes: state, status, error, next poll, resolved at.
    pub fn columns(
        &self,
        now: i64,
    ) -> (
        &'static str,
        Option<&str>,
        Option<&str>,
        Option<i64>,
        Option<i64>,
    ) {
        match self {
            PollResult::Recovered { status } => ("recovered", Some(status), None, None, Some(now)),
            PollResult::Arrived { status } => ("arrived", Some(status), None, None, Some(now)),
            PollResult::Again {
                status,
                error,
                next_poll_at,
            } => (
                "waiting",
                status.as_deref(),
                error.as_deref(),
                Some(*next_poll_at),
                None,
            ),
            PollResult::GivenUp { error } => ("given_up", None, error.as_deref(), None, Some(now)),
        }
    }
}

/// Names every state in `rows` of (state, count).
pub fn expectation_counts(rows: Vec<(String, i64)>) -> Vec<(&'static str, u64)> {
    let mut counts: Vec<(&'static str, u64)> = ["waiting", "arrived", "recovered", "given_up"]
        .map(|state| (state, 0))
        .to_vec();
    for (state, count) in rows {
        if let Some(entry) = counts.iter_mut().find(|(name, _)| *name == state) {
            entry.1 = count.unsigned_abs();
        }
    }
    counts
}

/// One row of `jobs expected`.
#[derive(Debug, Clone, Serialize)]
pub struct Expectation {
    pub job_id: String,
    pub state: String,
    pub expected_at: i64,
    pub next_poll_at: i64,
    pub polls: u32,
    pub last_status: Option<String>,
    pub last_error: Option<String>,
}

/// Which leases [`Ledger::expire_leases`](super::Ledger::expire_leases) takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leases {
    /// Those that expired before this time (Unix ms): their holder overran or is gone.
    ExpiredBefore(i64),
    /// At start: those this receiver held when it stopped (its attempts were cut short), at
    /// once. On SQLite every running row; on PostgreSQL those leased under this receiver's
    /// name (`PostgresConfig::receiver`), while other receivers' leases wait for their expiry.
    HeldBeforeThisStart,
}

/// The bounded statements retention repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionStep {
    /// Drops the bodies of jobs finished before the cutoff (a tombstone row remains).
    PurgeBodies,
    /// Forgets jobs finished before the cutoff: a Redeliver of one is a new job.
    DeleteFinished,
    /// Forgets the stops of dispatch that ended before the cutoff.
    DeleteEndedStops,
    /// Forgets expectations resolved before the cutoff.
    DeleteResolvedExpectations,
    /// Forgets the console's minutes (every receiver's) from before the cutoff.
    DeleteOldRollups,
}

/// Dead jobs with the same error signature (see the console's dead letters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadGroup {
    pub signature: String,
    pub jobs: u64,
    pub last_finished_at: Option<i64>,
    /// One of them, to look at.
    pub example_job_id: String,
}

/// Whether the workers run jobs, and who said so last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dispatch {
    pub paused: bool,
    pub changed_at: Option<i64>,
    pub changed_by: Option<String>,
    /// The route whose own pause this is; `None` for the pause of every route (or none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
}

/// What stopped dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StopKind {
    /// An operator's `jobs pause` (or the console's, or the admin API's).
    Pause,
    /// The outage hold (`src/hold/`).
    Hold,
}

impl StopKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StopKind::Pause => "pause",
            StopKind::Hold => "hold",
        }
    }

    /// The kind a row names; a hold for anything but `pause` (the column's CHECK allows two).
    pub fn from_column(text: &str) -> StopKind {
        if text == "pause" {
            StopKind::Pause
        } else {
            StopKind::Hold
        }
    }
}

/// One stop of dispatch, as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DispatchStop {
    pub kind: StopKind,
    /// A hold's route; `None` for a pause, which stops every route.
    pub route: Option<String>,
    pub started_at: i64,
    /// Who paused; `None` for a hold.
    pub started_by: Option<String>,
    /// Why: the operator's reason for a pause (if given), the cause of a hold.
    pub reason: Option<String>,
    /// `None` while it lasts.
    pub ended_at: Option<i64>,
    /// Who resumed; `None` for a hold that ended because an attempt succeeded.
    pub ended_by: Option<String>,
}

/// A route's hold (`src/hold/`): since when the workers of every receiver start no attempt of
/// that route but one probe at a time, why, and when the next probe may start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hold {
    pub route: String,
    pub since: i64,
    pub reason: String,
    /// One failure that opened it, as the job's last error has it.
    pub sample_error: String,
    pub next_probe_at: i64,
    /// The wait after the next failed probe, before doubling.
    pub probe_interval_ms: i64,
}

/// Which finished jobs a bulk retry takes: those in `state` that finished in
/// [`finished_since`, `finished_before`) and, with `error_contains`, whose last error contains
/// that text (case-sensitive). The upper bound keeps a job that fails again during the bulk
/// retry from being taken twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryFilter {
    pub state: State,
    pub finished_since: Option<i64>,
    pub finished_before: i64,
    pub error_contains: Option<String>,
}

/// What a bulk retry would take, counted exactly: those it can run again, and those whose body
/// retention purged (they cannot run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RetryCount {
    pub retryable: u64,
    pub body_purged: u64,
}

/// Where a page of `jobs list` ends: the next page starts after it. Written `<ms>:<job_id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The time the list is ordered by (Unix ms).
    pub at: i64,
    pub job_id: String,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.at, self.job_id)
    }
}

impl FromStr for Cursor {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let (at, job_id) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?} is not a cursor (<ms>:<job_id>, as a page ends)"))?;
        let at = at
            .parse()
            .map_err(|_| format!("{text:?} is not a cursor: {at:?} is not a time in ms"))?;
        Ok(Cursor {
            at,
            job_id: job_id.to_owned(),
        })
    }
}

impl Serialize for Cursor {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What a list of jobs shows: the state picks the index and the time it is ordered by
/// (received; due; lease expiry; finished), the times bound that index's range, and the event
/// type filters the rows read from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub state: Option<State>,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only jobs with work on this route.
    pub route: Option<RouteName>,
    /// Only jobs whose time is at or after this (Unix ms).
    pub since: Option<i64>,
    /// Only jobs whose time is before this (Unix ms).
    pub before: Option<i64>,
}

/// One page of `jobs list`, newest first; `next` continues it when the page is full, or when a
/// filtered page read its most rows and stopped short.
#[derive(Debug, Clone, Serialize)]
pub struct JobPage {
    pub jobs: Vec<JobSummary>,
    pub next: Option<Cursor>,
    /// Each job's time in the list's order (a cursor's time).
    #[serde(skip)]
    pub listed_at: Vec<i64>,
}

impl JobPage {
    /// A page from rows of (ordering time, job), `limit` asked for. A row without its time
    /// (`i64::MIN`: edited by hand) cannot be paged past.
    pub fn from_rows(rows: Vec<(i64, JobSummary)>, limit: usize) -> JobPage {
        let next = (rows.len() == limit && limit > 0)
            .then(|| rows.last())
            .flatten()
            .filter(|(at, _)| *at != i64::MIN)
            .map(|(at, job)| Cursor {
                at: *at,
                job_id: job.job_id.clone(),
            });
        let (listed_at, jobs) = rows.into_iter().unzip();
        JobPage {
            jobs,
            next,
            listed_at,
        }
    }
}
