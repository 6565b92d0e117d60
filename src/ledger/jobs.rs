//! The `jobs` table: typed rows and every statement that reads or changes them.
//!
//! Statements are in SQLite's `?N` form; those marked "shared" also run on PostgreSQL as they
//! are (see `postgres::pg`). The SQLite functions below run them on a rusqlite connection.

use std::fmt;
use std::str::FromStr;

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::Serialize;

use super::StorageError;
use crate::event_type::EventType;
use crate::job_id::JobId;
use crate::metrics::{AttemptResult, METRICS};

// The statements that must stay cheap however large the ledger grows; tests check that each
// reads only its partial index (EXPLAIN QUERY PLAN).
/// Shared.
pub const EXPIRED_LEASES_SQL: &str = "SELECT job_id, attempts FROM jobs
         WHERE state = 'running' AND lease_expires_at <= ?1";
/// Shared.
pub const DUE_JOBS_SQL: &str = "SELECT job_id FROM jobs
         WHERE state IN ('claimed', 'retrying') AND next_attempt_at <= ?1
         ORDER BY next_attempt_at LIMIT ?2";
/// Shared.
pub const NEXT_DUE_SQL: &str = "SELECT min(next_attempt_at) FROM jobs
         WHERE state IN ('claimed', 'retrying')";
/// INDEXED BY: the planner would otherwise pick jobs_finished, which also holds every
/// tombstone, and walk all of them on each run.
pub const PURGE_BODIES_SQL: &str = "UPDATE jobs SET body = NULL WHERE rowid IN (
    SELECT rowid FROM jobs INDEXED BY jobs_finished_with_body
    WHERE state IN ('done', 'dead') AND body IS NOT NULL AND finished_at < ?1 LIMIT ?2)";
pub const DELETE_FINISHED_SQL: &str = "DELETE FROM jobs WHERE rowid IN (
    SELECT rowid FROM jobs WHERE state IN ('done', 'dead') AND finished_at < ?1 LIMIT ?2)";

/// Shared. Parameters: job_id, attempt number, state, error, retry at, finished at, now.
pub const FINISH_ATTEMPT_SQL: &str =
    "UPDATE jobs SET state = ?3, last_error = coalesce(?4, last_error),
                     next_attempt_at = ?5, finished_at = ?6, lease_expires_at = NULL,
                     updated_at = ?7
     WHERE job_id = ?1 AND attempts = ?2 AND state = 'running'";
/// Shared. Parameters: job_id, attempt number, now.
pub const RELEASE_ATTEMPT_SQL: &str =
    "UPDATE jobs SET state = CASE WHEN attempts > 1 THEN 'retrying' ELSE 'claimed' END,
                     attempts = attempts - 1, next_attempt_at = ?3,
                     lease_expires_at = NULL, updated_at = ?3
     WHERE job_id = ?1 AND attempts = ?2 AND state = 'running'";
/// Shared. Parameters: job_id, now, max_attempts, error, cutoff, attempt number. The lease and
/// the attempt are checked again: another receiver may have taken it back, and started a new
/// attempt, since it was read. The casts tell PostgreSQL the type a `CASE` alone leaves open.
pub const TAKE_BACK_LEASE_SQL: &str = "UPDATE jobs SET
             state = CASE WHEN attempts >= ?3 THEN 'dead' ELSE 'retrying' END,
             next_attempt_at = CASE WHEN attempts >= ?3 THEN NULL ELSE CAST(?2 AS BIGINT) END,
             finished_at = CASE WHEN attempts >= ?3 THEN CAST(?2 AS BIGINT) ELSE NULL END,
             lease_expires_at = NULL, last_error = ?4, updated_at = ?2
         WHERE job_id = ?1 AND state = 'running' AND lease_expires_at <= ?5 AND attempts = ?6
         RETURNING state";
/// Shared. Parameters: job_id, now, error.
pub const GIVE_UP_SQL: &str =
    "UPDATE jobs SET state = 'dead', next_attempt_at = NULL, finished_at = ?2,
                     last_error = ?3, updated_at = ?2
     WHERE job_id = ?1 AND state IN ('claimed', 'retrying')";
/// Shared. Parameters: state or NULL, limit.
pub const LIST_JOBS_SQL: &str = "SELECT job_id, state, source, event_type, attempts, received_at,
         next_attempt_at, finished_at, last_error
     FROM jobs WHERE CAST(?1 AS TEXT) IS NULL OR state = ?1
     ORDER BY received_at DESC, job_id LIMIT ?2";
/// Shared.
pub const SHOW_JOB_SQL: &str = "SELECT job_id, state, source, event_type, attempts, received_at,
         next_attempt_at, finished_at, last_error, lease_expires_at, updated_at, body
     FROM jobs WHERE job_id = ?1";
/// Shared. Reads only the partial indexes of unfinished rows, so a scrape costs the same
/// however much history the ledger holds.
pub const COUNT_UNFINISHED_SQL: &str =
    "SELECT state, count(*) FROM jobs WHERE state IN ('claimed', 'retrying') GROUP BY state
     UNION ALL
     SELECT 'running', count(*) FROM jobs WHERE state = 'running'";
/// Shared.
pub const OLDEST_UNFINISHED_SQL: &str = "SELECT min(received_at) FROM (
         SELECT received_at FROM jobs WHERE state IN ('claimed', 'retrying')
         UNION ALL SELECT received_at FROM jobs WHERE state = 'running') AS unfinished";
/// Shared. Walks the index of finished jobs: for the start and the retention runs, not for
/// every scrape.
pub const COUNT_FINISHED_SQL: &str =
    "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'dead')
     FROM jobs WHERE state IN ('done', 'dead')";
/// Shared: the four counts of `jobs stats` (a table scan: a command for people). Parameters:
/// an hour ago, a day ago.
pub const STATS_SQL: &str = "SELECT
         (SELECT min(received_at) FROM jobs WHERE state IN ('claimed', 'running', 'retrying')),
         (SELECT count(*) FROM jobs WHERE received_at >= ?1),
         (SELECT count(*) FROM jobs WHERE state = 'dead' AND finished_at >= ?2)";
/// Shared.
pub const COUNT_BY_STATE_SQL: &str = "SELECT state, count(*) FROM jobs GROUP BY state";
/// Shared. Parameters: job_id, now.
pub const RETRY_JOB_SQL: &str =
    "UPDATE jobs SET state = 'claimed', attempts = 0, next_attempt_at = ?2, finished_at = NULL,
                     updated_at = ?2
     WHERE job_id = ?1 AND state IN ('done', 'dead') AND body IS NOT NULL";
/// Shared: job_ids matching a LIKE pattern (the load generator's check of its run).
pub const JOB_IDS_LIKE_SQL: &str = "SELECT job_id FROM jobs WHERE job_id LIKE ?1";
/// Shared: why [`RETRY_JOB_SQL`] changed nothing.
pub const RETRY_REFUSAL_SQL: &str = "SELECT state, body IS NULL FROM jobs WHERE job_id = ?1";

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
    pub body: String,
    pub source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    Claimed,
    Duplicate,
}

/// Records a job unless its job_id is already known. The one idempotency check there is.
pub fn insert_claim(
    conn: &Connection,
    claim: &NewClaim,
    now: i64,
) -> rusqlite::Result<ClaimOutcome> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO jobs (job_id, state, source, event_type, body, received_at,
                               next_attempt_at, updated_at)
             VALUES (?1, 'claimed', ?2, ?3, ?4, ?5, ?5, ?5)
             ON CONFLICT (job_id) DO NOTHING",
        )?
        .execute(params![
            claim.job_id,
            claim.source.as_str(),
            claim.event_type.as_ref().map(EventType::as_str),
            claim.body,
            now
        ])?;
    Ok(if inserted == 1 {
        ClaimOutcome::Claimed
    } else {
        ClaimOutcome::Duplicate
    })
}

/// What a handler needs to run one attempt of a job.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub job_id: JobId,
    /// 1-based number of this attempt.
    pub number: u32,
    pub event_type: Option<String>,
    pub source: Source,
    pub body: String,
}

/// Moves a due job to `running` under a lease and counts the attempt. `None` when the job is not
/// waiting to run (already running, finished, or unknown), so a job is never started twice.
pub fn start_attempt(
    conn: &Connection,
    job_id: &JobId,
    now: i64,
    lease_expires_at: i64,
) -> rusqlite::Result<Option<Attempt>> {
    conn.prepare_cached(
        "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_expires_at = ?2,
                         next_attempt_at = NULL, updated_at = ?3
         WHERE job_id = ?1 AND state IN ('claimed', 'retrying') AND body IS NOT NULL
         RETURNING attempts, event_type, source, body",
    )?
    .query_row(params![job_id, lease_expires_at, now], |row| {
        Ok(Attempt {
            job_id: job_id.clone(),
            number: row.get(0)?,
            event_type: row.get(1)?,
            source: Source::parse(&row.get::<_, String>(2)?),
            body: row.get(3)?,
        })
    })
    .optional()
}

/// The end of one attempt, as the worker decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    Done,
    /// Failed; retry at the given time, or never (`None`: the job is dead).
    Failed {
        error: String,
        retry_at: Option<i64>,
    },
}

impl AttemptEnd {
    /// The job's new state, the error to record and when to retry.
    pub fn outcome(&self) -> (State, Option<&str>, Option<i64>) {
        match self {
            AttemptEnd::Done => (State::Done, None, None),
            AttemptEnd::Failed {
                error,
                retry_at: Some(at),
            } => (State::Retrying, Some(error), Some(*at)),
            AttemptEnd::Failed {
                error,
                retry_at: None,
            } => (State::Dead, Some(error), None),
        }
    }
}

/// Records how a running attempt ended. Returns the job's new state, or `None` if this attempt
/// no longer owns the job: the row is not `running`, or a later attempt has started since (the
/// attempt number is the fencing token).
pub fn finish_attempt(
    conn: &Connection,
    attempt: &Attempt,
    end: &AttemptEnd,
    now: i64,
) -> rusqlite::Result<Option<State>> {
    let (state, error, retry_at) = end.outcome();
    let finished_at = state.is_finished().then_some(now);
    let changed = conn.prepare_cached(FINISH_ATTEMPT_SQL)?.execute(params![
        attempt.job_id,
        attempt.number,
        state.as_str(),
        error,
        retry_at,
        finished_at,
        now
    ])?;
    Ok((changed == 1).then_some(state))
}

/// Gives back an attempt our own shutdown interrupted: it does not count, and the job is due
/// again at once (at the next start). `false` if the attempt no longer owned the job.
pub fn release_attempt(conn: &Connection, attempt: &Attempt, now: i64) -> rusqlite::Result<bool> {
    let changed = conn.prepare_cached(RELEASE_ATTEMPT_SQL)?.execute(params![
        attempt.job_id,
        attempt.number,
        now
    ])?;
    Ok(changed == 1)
}

/// Running jobs whose lease expired before `cutoff`: candidates for [`take_back_lease`] once
/// the caller has left out those it is still running itself (their handler timeout is enforced
/// on the monotonic clock, so a jump of the wall clock must not hand them out twice).
pub fn expired_leases(conn: &Connection, cutoff: i64) -> rusqlite::Result<Vec<LeasedAttempt>> {
    conn.prepare_cached(EXPIRED_LEASES_SQL)?
        .query_map([cutoff], |row| {
            Ok(LeasedAttempt {
                job_id: row.get(0)?,
                number: row.get(1)?,
            })
        })?
        .collect()
}

/// A running attempt found by its lease: the job and the attempt's number (the fencing token).
#[derive(Debug, Clone)]
pub struct LeasedAttempt {
    pub job_id: String,
    pub number: i64,
}

/// Takes back one expired lease: the attempt counts as failed with `error`; the job is due
/// again at `now`, or dead if it used its last attempt. `None` if the lease is no longer
/// expired (taken back by someone else first).
pub fn take_back_lease(
    conn: &Connection,
    lease: &LeasedAttempt,
    cutoff: i64,
    now: i64,
    max_attempts: u32,
    error: &str,
) -> rusqlite::Result<Option<State>> {
    let state = conn
        .prepare_cached(TAKE_BACK_LEASE_SQL)?
        .query_row(
            params![lease.job_id, now, max_attempts, error, cutoff, lease.number],
            |row| row.get::<_, String>(0),
        )
        .optional()?;
    Ok(state.map(|state| State::from_str(&state).unwrap_or(State::Retrying)))
}

/// Counts and logs one lease taken back; the job is now `state`.
pub fn record_lease_taken_back(job_id: &str, state: State) {
    if state == State::Dead {
        METRICS.record_attempt_end(AttemptResult::Dead, None);
        tracing::error!(job_id = ?job_id, "job dead: its last attempt never finished");
    } else {
        METRICS.record_attempt_end(AttemptResult::Failed, None);
    }
}

/// Jobs waiting to run whose time has come, oldest first, split into those that can run and
/// stored ids that are not a valid [`JobId`] (written before ids were checked).
pub fn due_jobs(conn: &Connection, now: i64, limit: usize) -> rusqlite::Result<DueJobs> {
    let mut statement = conn.prepare_cached(DUE_JOBS_SQL)?;
    let rows = statement.query_map(params![now, limit as i64], |row| row.get::<_, String>(0))?;
    let next_at = conn
        .prepare_cached(NEXT_DUE_SQL)?
        .query_row([], |row| row.get(0))?;
    Ok(DueJobs::sort(
        rows.collect::<rusqlite::Result<_>>()?,
        next_at,
    ))
}

/// What [`due_jobs`] found.
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

/// Why a stored job_id cannot run, as its last error.
pub fn unrunnable_error(reason: &str) -> String {
    format!("the stored job_id cannot run: {reason}")
}

/// Makes jobs whose stored id can never run `dead`, with the reason as their last error, so
/// that they stop coming back as due work. No attempt ran: only the finished count changes
/// ([`crate::ledger::Ledger::recount_finished`]).
pub fn give_up_unrunnable(
    conn: &Connection,
    unrunnable: &[(String, String)],
    now: i64,
) -> rusqlite::Result<()> {
    let mut give_up = conn.prepare_cached(GIVE_UP_SQL)?;
    for (job_id, reason) in unrunnable {
        if give_up.execute(params![job_id, now, unrunnable_error(reason)])? == 1 {
            log_given_up(job_id, reason);
        }
    }
    Ok(())
}

pub fn log_given_up(job_id: &str, reason: &str) {
    tracing::error!(job_id = ?job_id, reason, "job dead: its stored job_id cannot run");
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
}

fn summary_from_row(row: &Row<'_>) -> rusqlite::Result<JobSummary> {
    Ok(JobSummary {
        job_id: row.get(0)?,
        state: row.get(1)?,
        source: row.get(2)?,
        event_type: row.get(3)?,
        attempts: row.get(4)?,
        received_at: row.get(5)?,
        next_attempt_at: row.get(6)?,
        finished_at: row.get(7)?,
        last_error: row.get(8)?,
    })
}

/// The most recently received jobs, optionally in one state.
pub fn list_jobs(
    conn: &Connection,
    state: Option<State>,
    limit: usize,
) -> rusqlite::Result<Vec<JobSummary>> {
    let mut statement = conn.prepare(LIST_JOBS_SQL)?;
    let rows = statement.query_map(
        params![state.map(State::as_str), limit as i64],
        summary_from_row,
    )?;
    rows.collect()
}

pub fn show_job(conn: &Connection, job_id: &str) -> rusqlite::Result<Option<JobDetail>> {
    conn.query_row(SHOW_JOB_SQL, [job_id], |row| {
        Ok(JobDetail {
            summary: summary_from_row(row)?,
            lease_expires_at: row.get(9)?,
            updated_at: row.get(10)?,
            body: row.get(11)?,
        })
    })
    .optional()
}

/// How many jobs wait or run, per state; every unfinished state named (0 when none).
pub fn count_unfinished(conn: &Connection) -> rusqlite::Result<Vec<(State, u64)>> {
    let mut statement = conn.prepare_cached(COUNT_UNFINISHED_SQL)?;
    let rows = statement.query_map([], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
    })?;
    Ok(unfinished_counts(rows.collect::<rusqlite::Result<_>>()?))
}

/// Names every unfinished state in `rows` of (state, count).
pub fn unfinished_counts(rows: Vec<(String, i64)>) -> Vec<(State, u64)> {
    let mut counts: Vec<(State, u64)> = [State::Claimed, State::Running, State::Retrying]
        .map(|state| (state, 0))
        .to_vec();
    for (name, count) in rows {
        if let Some(entry) = counts.iter_mut().find(|(state, _)| state.as_str() == name) {
            entry.1 = count.unsigned_abs();
        }
    }
    counts
}

/// The oldest job still waiting or running: when it was received (Unix ms).
pub fn oldest_unfinished(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(OLDEST_UNFINISHED_SQL)?
        .query_row([], |row| row.get(0))
}

/// How many jobs are done and dead.
pub fn count_finished(conn: &Connection) -> rusqlite::Result<(u64, u64)> {
    conn.query_row(COUNT_FINISHED_SQL, [], |row| {
        Ok((
            row.get::<_, i64>(0)?.unsigned_abs(),
            row.get::<_, i64>(1)?.unsigned_abs(),
        ))
    })
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
    /// Puts together what [`COUNT_BY_STATE_SQL`] and [`STATS_SQL`] returned.
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

    /// The parameters of [`STATS_SQL`] at `now`: an hour ago, a day ago.
    pub fn since(now: i64) -> (i64, i64) {
        (now - HOUR_MS, now - 24 * HOUR_MS)
    }
}

/// Counts for `jobs stats`.
pub fn job_stats(conn: &Connection, now: i64) -> rusqlite::Result<JobStats> {
    let mut statement = conn.prepare(COUNT_BY_STATE_SQL)?;
    let by_state = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let (hour_ago, day_ago) = JobStats::since(now);
    let counts = conn.query_row(STATS_SQL, [hour_ago, day_ago], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })?;
    Ok(JobStats::from_counts(by_state, counts))
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

impl From<rusqlite::Error> for RetryError {
    fn from(error: rusqlite::Error) -> Self {
        RetryError::Storage(error.into())
    }
}

impl RetryError {
    /// Why [`RETRY_JOB_SQL`] changed nothing, from what [`RETRY_REFUSAL_SQL`] found.
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

/// Makes a `done` or `dead` job due again with a fresh set of attempts.
pub fn retry_job(conn: &Connection, job_id: &str, now: i64) -> Result<(), RetryError> {
    if conn.execute(RETRY_JOB_SQL, params![job_id, now])? == 1 {
        return Ok(());
    }
    let found = conn
        .query_row(RETRY_REFUSAL_SQL, [job_id], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()?;
    Err(RetryError::refusal(job_id, found))
}
