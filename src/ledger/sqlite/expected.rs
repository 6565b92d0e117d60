//! The `expected_jobs` table on SQLite: jobs the application announced, and what polling Sume
//! found.

use rusqlite::{params, Connection};

use crate::job_id::JobId;
use crate::ledger::model::{expectation_counts, DueExpectation, Expectation, PollResult};

pub const DELETE_RESOLVED_SQL: &str = "DELETE FROM expected_jobs WHERE rowid IN (
    SELECT rowid FROM expected_jobs WHERE state <> 'waiting' AND resolved_at < ?1 LIMIT ?2)";
/// Parameters: job_id, now, first poll at.
pub const EXPECT_JOB_SQL: &str =
    "INSERT INTO expected_jobs (job_id, expected_at, next_poll_at) VALUES (?1, ?2, ?3)
     ON CONFLICT (job_id) DO NOTHING";
pub const RESOLVE_ARRIVED_SQL: &str = "UPDATE expected_jobs SET state = 'arrived', resolved_at = ?1
     WHERE state = 'waiting' AND next_poll_at <= ?1
       AND EXISTS (SELECT 1 FROM jobs WHERE jobs.job_id = expected_jobs.job_id)";
/// Parameters: job_id, state, status, error, next poll at, resolved at.
pub const RECORD_POLL_SQL: &str = "UPDATE expected_jobs SET state = ?2, polls = polls + 1,
         last_status = coalesce(?3, last_status), last_error = ?4,
         next_poll_at = coalesce(?5, next_poll_at), resolved_at = ?6
     WHERE job_id = ?1 AND state = 'waiting'";
pub const COUNT_EXPECTATIONS_SQL: &str = "SELECT state, count(*) FROM expected_jobs GROUP BY state";
pub const LIST_EXPECTATIONS_SQL: &str =
    "SELECT job_id, state, expected_at, next_poll_at, polls, last_status, last_error
     FROM expected_jobs ORDER BY expected_at DESC, job_id LIMIT ?1";
pub const DUE_EXPECTATIONS_SQL: &str = "SELECT job_id, expected_at, polls FROM expected_jobs
    WHERE state = 'waiting' AND next_poll_at <= ?1 ORDER BY next_poll_at LIMIT ?2";

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

/// Expected jobs by state, every state named (0 when none).
pub fn count_expectations(conn: &Connection) -> rusqlite::Result<Vec<(&'static str, u64)>> {
    let mut statement = conn.prepare_cached(COUNT_EXPECTATIONS_SQL)?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(expectation_counts(rows.collect::<rusqlite::Result<_>>()?))
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
