//! The `jobs` table: typed rows and every statement that reads or changes them.

use std::fmt;
use std::str::FromStr;

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::Serialize;

use crate::job_id::JobId;
use crate::metrics::{AttemptResult, METRICS};

// The statements that must stay cheap however large the ledger grows; tests check that each
// reads only its partial index (EXPLAIN QUERY PLAN).
pub const EXPIRED_LEASES_SQL: &str = "SELECT job_id FROM jobs
         WHERE state = 'running' AND lease_expires_at <= ?1";
pub const DUE_JOBS_SQL: &str = "SELECT job_id FROM jobs
         WHERE state IN ('claimed', 'retrying') AND next_attempt_at <= ?1
         ORDER BY next_attempt_at LIMIT ?2";
pub const NEXT_DUE_SQL: &str = "SELECT min(next_attempt_at) FROM jobs
         WHERE state IN ('claimed', 'retrying')";
/// INDEXED BY: the planner would otherwise pick jobs_finished, which also holds every
/// tombstone, and walk all of them on each run.
pub const PURGE_BODIES_SQL: &str = "UPDATE jobs SET body = NULL WHERE rowid IN (
    SELECT rowid FROM jobs INDEXED BY jobs_finished_with_body
    WHERE state IN ('done', 'dead') AND body IS NOT NULL AND finished_at < ?1 LIMIT ?2)";
pub const DELETE_FINISHED_SQL: &str = "DELETE FROM jobs WHERE rowid IN (
    SELECT rowid FROM jobs WHERE state IN ('done', 'dead') AND finished_at < ?1 LIMIT ?2)";

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

    fn parse(text: &str) -> Source {
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
    pub event_type: Option<String>,
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
            claim.event_type,
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

/// Records how a running attempt ended. Returns the job's new state, or `None` if this attempt
/// no longer owns the job: the row is not `running`, or a later attempt has started since (the
/// attempt number is the fencing token).
pub fn finish_attempt(
    conn: &Connection,
    attempt: &Attempt,
    end: &AttemptEnd,
    now: i64,
) -> rusqlite::Result<Option<State>> {
    let (state, error, retry_at) = match end {
        AttemptEnd::Done => (State::Done, None, None),
        AttemptEnd::Failed {
            error,
            retry_at: Some(at),
        } => (State::Retrying, Some(error), Some(*at)),
        AttemptEnd::Failed {
            error,
            retry_at: None,
        } => (State::Dead, Some(error), None),
    };
    let finished_at = matches!(state, State::Done | State::Dead).then_some(now);
    let changed = conn
        .prepare_cached(
            "UPDATE jobs SET state = ?3, last_error = coalesce(?4, last_error),
                             next_attempt_at = ?5, finished_at = ?6, lease_expires_at = NULL,
                             updated_at = ?7
             WHERE job_id = ?1 AND attempts = ?2 AND state = 'running'",
        )?
        .execute(params![
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
    let changed = conn
        .prepare_cached(
            "UPDATE jobs SET state = CASE WHEN attempts > 1 THEN 'retrying' ELSE 'claimed' END,
                             attempts = attempts - 1, next_attempt_at = ?3,
                             lease_expires_at = NULL, updated_at = ?3
             WHERE job_id = ?1 AND attempts = ?2 AND state = 'running'",
        )?
        .execute(params![attempt.job_id, attempt.number, now])?;
    Ok(changed == 1)
}

/// Takes back the leases of running jobs that expired before `cutoff`, except those for which
/// `still_running` says this process is still running them (their handler timeout is enforced
/// on the monotonic clock, so a jump of the wall clock must not hand them out twice). Each
/// attempt taken back counts as failed with `error`; the job is due again at `now`, or dead if
/// it used its last attempt. Returns how many leases it took back.
pub fn expire_leases(
    conn: &Connection,
    cutoff: i64,
    now: i64,
    max_attempts: u32,
    error: &str,
    still_running: impl Fn(&str) -> bool,
) -> rusqlite::Result<usize> {
    let expired: Vec<String> = conn
        .prepare_cached(EXPIRED_LEASES_SQL)?
        .query_map([cutoff], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut take_back = conn.prepare_cached(
        "UPDATE jobs SET
             state = CASE WHEN attempts >= ?3 THEN 'dead' ELSE 'retrying' END,
             next_attempt_at = CASE WHEN attempts >= ?3 THEN NULL ELSE ?2 END,
             finished_at = CASE WHEN attempts >= ?3 THEN ?2 ELSE NULL END,
             lease_expires_at = NULL, last_error = ?4, updated_at = ?2
         WHERE job_id = ?1 AND state = 'running'
         RETURNING state",
    )?;
    let mut taken_back = 0;
    for job_id in expired.iter().filter(|id| !still_running(id)) {
        let state: String =
            take_back.query_row(params![job_id, now, max_attempts, error], |row| row.get(0))?;
        taken_back += 1;
        let dead = state == State::Dead.as_str();
        let result = if dead {
            AttemptResult::Dead
        } else {
            AttemptResult::Failed
        };
        METRICS.record_attempt_end(result, None);
        if dead {
            tracing::error!(job_id = ?job_id, error, "job dead: its last attempt never finished");
        }
    }
    Ok(taken_back)
}

/// Jobs waiting to run whose time has come, oldest first, split into those that can run and
/// stored ids that are not a valid [`JobId`] (written before ids were checked).
pub fn due_jobs(conn: &Connection, now: i64, limit: usize) -> rusqlite::Result<DueJobs> {
    let mut statement = conn.prepare_cached(DUE_JOBS_SQL)?;
    let rows = statement.query_map(params![now, limit as i64], |row| row.get::<_, String>(0))?;
    let mut due = DueJobs::default();
    for text in rows {
        let text = text?;
        match JobId::parse(&text) {
            Ok(job_id) => due.runnable.push(job_id),
            Err(error) => due.unrunnable.push((text, error.to_string())),
        }
    }
    due.next_at = conn
        .prepare_cached(NEXT_DUE_SQL)?
        .query_row([], |row| row.get(0))?;
    Ok(due)
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

/// Makes jobs whose stored id can never run `dead`, with the reason as their last error, so
/// that they stop coming back as due work. No attempt ran: only the finished count changes
/// ([`crate::ledger::Ledger::recount_finished`]).
pub fn give_up_unrunnable(
    conn: &Connection,
    unrunnable: &[(String, String)],
    now: i64,
) -> rusqlite::Result<()> {
    let mut give_up = conn.prepare_cached(
        "UPDATE jobs SET state = 'dead', next_attempt_at = NULL, finished_at = ?2,
                         last_error = ?3, updated_at = ?2
         WHERE job_id = ?1 AND state IN ('claimed', 'retrying')",
    )?;
    for (job_id, reason) in unrunnable {
        let error = format!("the stored job_id cannot run: {reason}");
        if give_up.execute(params![job_id, now, error])? == 1 {
            tracing::error!(job_id = ?job_id, reason, "job dead: its stored job_id cannot run");
        }
    }
    Ok(())
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

const SUMMARY_COLUMNS: &str = "job_id, state, source, event_type, attempts, received_at, \
                               next_attempt_at, finished_at, last_error";

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
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM jobs WHERE ?1 IS NULL OR state = ?1
         ORDER BY received_at DESC, job_id LIMIT ?2"
    );
    let mut statement = conn.prepare(&sql)?;
    let rows = statement.query_map(
        params![state.map(State::as_str), limit as i64],
        summary_from_row,
    )?;
    rows.collect()
}

pub fn show_job(conn: &Connection, job_id: &str) -> rusqlite::Result<Option<JobDetail>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS}, lease_expires_at, updated_at, body FROM jobs WHERE job_id = ?1"
    );
    conn.query_row(&sql, [job_id], |row| {
        Ok(JobDetail {
            summary: summary_from_row(row)?,
            lease_expires_at: row.get(9)?,
            updated_at: row.get(10)?,
            body: row.get(11)?,
        })
    })
    .optional()
}

/// How many jobs wait or run, per state. Reads only the partial indexes of unfinished rows, so a
/// scrape costs the same however much history the ledger holds.
pub fn count_unfinished(conn: &Connection) -> rusqlite::Result<Vec<(State, u64)>> {
    let mut statement = conn.prepare_cached(
        "SELECT state, count(*) FROM jobs WHERE state IN ('claimed', 'retrying') GROUP BY state
         UNION ALL
         SELECT 'running', count(*) FROM jobs WHERE state = 'running'",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
    })?;
    let mut counts: Vec<(State, u64)> = [State::Claimed, State::Running, State::Retrying]
        .map(|state| (state, 0))
        .to_vec();
    for row in rows {
        let (name, count) = row?;
        if let Some(entry) = counts.iter_mut().find(|(state, _)| state.as_str() == name) {
            entry.1 = count.unsigned_abs();
        }
    }
    Ok(counts)
}

/// The oldest job still waiting or running: when it was received (Unix ms).
pub fn oldest_unfinished(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT min(received_at) FROM (
             SELECT received_at FROM jobs WHERE state IN ('claimed', 'retrying')
             UNION ALL SELECT received_at FROM jobs WHERE state = 'running')",
    )?
    .query_row([], |row| row.get(0))
}

/// How many jobs are done and dead. Walks the index of finished jobs: for the start and the
/// retention runs, not for every scrape.
pub fn count_finished(conn: &Connection) -> rusqlite::Result<(u64, u64)> {
    conn.query_row(
        "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'dead')
         FROM jobs WHERE state IN ('done', 'dead')",
        [],
        |row| {
            Ok((
                row.get::<_, i64>(0)?.unsigned_abs(),
                row.get::<_, i64>(1)?.unsigned_abs(),
            ))
        },
    )
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

/// Counts for `jobs stats`. Scans the table: a command for people, not for every scrape.
pub fn job_stats(conn: &Connection, now: i64) -> rusqlite::Result<JobStats> {
    const HOUR_MS: i64 = 3_600_000;
    let mut by_state: std::collections::BTreeMap<String, u64> = State::ALL
        .iter()
        .map(|s| (s.as_str().to_owned(), 0))
        .collect();
    let mut statement = conn.prepare("SELECT state, count(*) FROM jobs GROUP BY state")?;
    let rows = statement.query_map([], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
    })?;
    for row in rows {
        let (state, count) = row?;
        by_state.insert(state, count.unsigned_abs());
    }
    let count = |sql: &str, since: i64| -> rusqlite::Result<u64> {
        conn.query_row(sql, [since], |row| row.get::<_, i64>(0))
            .map(i64::unsigned_abs)
    };
    Ok(JobStats {
        by_state,
        oldest_unfinished_received_at: conn.query_row(
            "SELECT min(received_at) FROM jobs WHERE state IN ('claimed', 'running', 'retrying')",
            [],
            |row| row.get(0),
        )?,
        received_last_hour: count(
            "SELECT count(*) FROM jobs WHERE received_at >= ?1",
            now - HOUR_MS,
        )?,
        dead_last_day: count(
            "SELECT count(*) FROM jobs WHERE state = 'dead' AND finished_at >= ?1",
            now - 24 * HOUR_MS,
        )?,
    })
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
    Storage(#[from] rusqlite::Error),
}

/// Makes a `done` or `dead` job due again with a fresh set of attempts. The running service picks
/// it up at its next sweep.
pub fn retry_job(conn: &Connection, job_id: &str, now: i64) -> Result<(), RetryError> {
    let changed = conn.execute(
        "UPDATE jobs SET state = 'claimed', attempts = 0, next_attempt_at = ?2, finished_at = NULL,
                         updated_at = ?2
         WHERE job_id = ?1 AND state IN ('done', 'dead') AND body IS NOT NULL",
        params![job_id, now],
    )?;
    if changed == 1 {
        return Ok(());
    }
    let found: Option<(String, bool)> = conn
        .query_row(
            "SELECT state, body IS NULL FROM jobs WHERE job_id = ?1",
            [job_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    Err(match found {
        None => RetryError::Unknown(job_id.to_owned()),
        Some((_, true)) => RetryError::BodyPurged(job_id.to_owned()),
        Some((state, false)) => RetryError::NotFinished {
            job_id: job_id.to_owned(),
            state,
        },
    })
}

/// Retention, step one: drops the bodies of jobs finished before `before` (a tombstone row
/// remains), at most `limit` of them. Reads only the index of finished rows that have a body.
pub fn purge_bodies(conn: &Connection, before: i64, limit: usize) -> rusqlite::Result<usize> {
    conn.prepare_cached(PURGE_BODIES_SQL)?
        .execute(params![before, limit as i64])
}

/// Retention, step two: forgets jobs finished before `before`, at most `limit` of them. A
/// Redeliver of a forgotten job_id is a new job.
pub fn delete_finished(conn: &Connection, before: i64, limit: usize) -> rusqlite::Result<usize> {
    conn.prepare_cached(DELETE_FINISHED_SQL)?
        .execute(params![before, limit as i64])
}
