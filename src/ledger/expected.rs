//! The `expected_jobs` table: jobs the application announced, and what polling Sume found.
//!
//! Statements marked "shared" also run on PostgreSQL as they are.

use rusqlite::{params, Connection};
use serde::Serialize;

use crate::job_id::JobId;

pub const DELETE_RESOLVED_SQL: &str = "DELETE FROM expected_jobs WHERE rowid IN (
    SELECT rowid FROM expected_jobs WHERE state <> 'waiting' AND resolved_at < ?1 LIMIT ?2)";
/// Shared. Parameters: job_id, now, first poll at.
pub const EXPECT_JOB_SQL: &str =
    "INSERT INTO expected_jobs (job_id, expected_at, next_poll_at) VALUES (?1, ?2, ?3)
     ON CONFLICT (job_id) DO NOTHING";
/// Shared.
pub const RESOLVE_ARRIVED_SQL: &str = "UPDATE expected_jobs SET state = 'arrived', resolved_at = ?1
     WHERE state = 'waiting' AND next_poll_at <= ?1
       AND EXISTS (SELECT 1 FROM jobs WHERE jobs.job_id = expected_jobs.job_id)";
/// Shared. Parameters: job_id, state, status, error, next poll at, resolved at.
pub const RECORD_POLL_SQL: &str = "UPDATE expected_jobs SET state = ?2, polls = polls + 1,
         last_status = coalesce(?3, last_status), last_error = ?4,
         next_poll_at = coalesce(?5, next_poll_at), resolved_at = ?6
     WHERE job_id = ?1 AND state = 'waiting'";
/// Shared.
pub const COUNT_EXPECTATIONS_SQL: &str = "SELECT state, count(*) FROM expected_jobs GROUP BY state";
/// Shared.
pub const LIST_EXPECTATIONS_SQL: &str =
    "SELECT job_id, state, expected_at, next_poll_at, polls, last_status, last_error
     FROM expected_jobs ORDER BY expected_at DESC, job_id LIMIT ?1";
pub const DUE_EXPECTATIONS_SQL: &str = "SELECT job_id, expected_at, polls FROM expected_jobs
    WHERE state = 'waiting' AND next_poll_at <= ?1 ORDER BY next_poll_at LIMIT ?2";

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

/// Registers a job to expect; `false` if it was registered already (registering is idempotent).
pub fn expect_job(
    conn: &Connection,
    job_id: &JobId,
    now: i64,
    first_poll_at: i64,
) -> rusqlite::Result<bool> {
    let inserted =
        conn.prepare_cached(EXPECT_JOB_SQL)?
            .execute(params![job_id, now, first_poll_at])?;
    Ok(inserted == 1)
}

/// Resolves due expectations whose webhook did arrive: no poll needed for those.
pub fn resolve_arrived(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    conn.prepare_cached(RESOLVE_ARRIVED_SQL)?.execute([now])
}

pub fn due_expectations(
    conn: &Connection,
    now: i64,
    limit: usize,
) -> rusqlite::Result<Vec<DueExpectation>> {
    let mut statement = conn.prepare_cached(DUE_EXPECTATIONS_SQL)?;
    let rows = statement.query_map(params![now, limit as i64], |row| {
        Ok(DueExpectation {
            job_id: row.get(0)?,
            expected_at: row.get(1)?,
            polls: row.get(2)?,
        })
    })?;
    rows.collect()
}

pub fn record_poll(
    conn: &Connection,
    job_id: &str,
    result: &PollResult,
    now: i64,
) -> rusqlite::Result<()> {
    let (state, status, error, next_poll_at, resolved_at) = result.columns(now);
    conn.prepare_cached(RECORD_POLL_SQL)?.execute(params![
        job_id,
        state,
        status,
        error,
        next_poll_at,
        resolved_at
    ])?;
    Ok(())
}

impl PollResult {
    /// What [`RECORD_POLL_SQL`] writes: state, status, error, next poll, resolved at.
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

/// Expected jobs by state, every state named (0 when none).
pub fn count_expectations(conn: &Connection) -> rusqlite::Result<Vec<(&'static str, u64)>> {
    let mut statement = conn.prepare_cached(COUNT_EXPECTATIONS_SQL)?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(expectation_counts(rows.collect::<rusqlite::Result<_>>()?))
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

pub fn list_expectations(conn: &Connection, limit: usize) -> rusqlite::Result<Vec<Expectation>> {
    let mut statement = conn.prepare(LIST_EXPECTATIONS_SQL)?;
    let rows = statement.query_map([limit as i64], |row| {
        Ok(Expectation {
            job_id: row.get(0)?,
            state: row.get(1)?,
            expected_at: row.get(2)?,
            next_poll_at: row.get(3)?,
            polls: row.get(4)?,
            last_status: row.get(5)?,
            last_error: row.get(6)?,
        })
    })?;
    rows.collect()
}
