//! Each job's history on SQLite: its attempts and the operators' actions, appended in the
//! transaction of the change they record, at most [`HISTORY_PER_JOB`] of each per job.

use rusqlite::{params, Connection, Row};

use crate::ledger::model::{ActionRecord, AttemptRecord, Failure, HISTORY_PER_JOB};
use crate::ledger::params::Actor;

/// Parameters: job_id, kept. Keeps the newest `kept` attempts of the job; reads only the job's
/// own entries of the index, so it costs what the job's history holds.
const TRIM_ATTEMPTS_SQL: &str = "DELETE FROM job_attempts WHERE job_id = ?1 AND id < (
    SELECT id FROM job_attempts WHERE job_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2 - 1)";
const TRIM_ACTIONS_SQL: &str = "DELETE FROM job_actions WHERE job_id = ?1 AND id < (
    SELECT id FROM job_actions WHERE job_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2 - 1)";
pub const ATTEMPTS_OF_JOB_SQL: &str = "SELECT route, number, cause, receiver, started_at,
        ended_at, outcome, exit_status, http_status, error
    FROM job_attempts WHERE job_id = ?1 ORDER BY id";
pub const ACTIONS_OF_JOB_SQL: &str =
    "SELECT at, action, actor, reason FROM job_actions WHERE job_id = ?1 ORDER BY id";

/// Records the start of attempt `number` of the job's work on `route`; the entry's row.
pub fn record_start(
    conn: &Connection,
    job_id: &str,
    route: &str,
    number: u32,
    cause: &str,
    now: i64,
) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO job_attempts (job_id, route, number, cause, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![job_id, route, number, cause, now])?;
    let row = conn.last_insert_rowid();
    // Trimmed at every start but a route's first (cause `first`: every later one has a cause
    // of its own), which most jobs' only start is: the job's history then passes its bound by
    // at most one row per route until its next start trims it. Spares those jobs a look into
    // the index by their random job_id: 5-12 µs a job when added to bench/floors' work-floor.
    if cause != "first" {
        conn.prepare_cached(TRIM_ATTEMPTS_SQL)?
            .execute(params![job_id, HISTORY_PER_JOB])?;
    }
    Ok(row)
}

/// A running attempt's entry in its job's history: attempt `number` of the job's work on
/// `route`, at `row` when its start's row is known.
pub struct HistoryEntry<'a> {
    pub job_id: &'a str,
    pub route: &'a str,
    pub number: i64,
    pub row: Option<i64>,
}

/// Records how a running attempt ended. With its row known, the entry is read by that number
/// (the job's other columns still checked), not looked for by the job's random job_id.
pub fn record_end(
    conn: &Connection,
    entry: HistoryEntry<'_>,
    outcome: &str,
    failure: Option<&Failure>,
    now: i64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE job_attempts SET ended_at = ?3, outcome = ?4, exit_status = ?5,
                                 http_status = ?6, error = ?7
         WHERE id = coalesce(?9, (SELECT id FROM job_attempts
                                  WHERE job_id = ?1 AND route = ?8 AND number = ?2
                                    AND ended_at IS NULL ORDER BY id DESC LIMIT 1))
           AND job_id = ?1 AND route = ?8 AND number = ?2 AND ended_at IS NULL",
    )?
    .execute(params![
        entry.job_id,
        entry.number,
        now,
        outcome,
        failure.and_then(|f| f.exit_status),
        failure.and_then(|f| f.http_status),
        failure.map(|f| f.error.as_str()),
        entry.route,
        entry.row,
    ])?;
    Ok(())
}

/// Records an action on the job: who, and why.
pub fn record_action(
    conn: &Connection,
    job_id: &str,
    action: &str,
    actor: &Actor,
    now: i64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO job_actions (job_id, at, action, actor, reason) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![job_id, now, action, actor.by, actor.reason()])?;
    conn.prepare_cached(TRIM_ACTIONS_SQL)?
        .execute(params![job_id, HISTORY_PER_JOB])?;
    Ok(())
}

/// [`record_action`] for a job that may not be in the ledger; `false` if it is not.
pub fn record_action_if_known(
    conn: &Connection,
    job_id: &str,
    action: &str,
    actor: &Actor,
    now: i64,
) -> rusqlite::Result<bool> {
    let known = conn
        .prepare_cached("SELECT 1 FROM jobs WHERE job_id = ?1")?
        .exists([job_id])?;
    if known {
        record_action(conn, job_id, action, actor, now)?;
    }
    Ok(known)
}

fn attempt_from_row(row: &Row<'_>) -> rusqlite::Result<AttemptRecord> {
    Ok(AttemptRecord {
        route: row.get(0)?,
        number: row.get(1)?,
        cause: row.get(2)?,
        receiver: row.get(3)?,
        started_at: row.get(4)?,
        ended_at: row.get(5)?,
        outcome: row.get(6)?,
        exit_status: row.get(7)?,
        http_status: row.get(8)?,
        error: row.get(9)?,
    })
}

/// The job's attempts and actions, oldest first.
pub fn history_of(
    conn: &Connection,
    job_id: &str,
) -> rusqlite::Result<(Vec<AttemptRecord>, Vec<ActionRecord>)> {
    let attempts = conn
        .prepare_cached(ATTEMPTS_OF_JOB_SQL)?
        .query_map([job_id], attempt_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    let actions = conn
        .prepare_cached(ACTIONS_OF_JOB_SQL)?
        .query_map([job_id], |row| {
            Ok(ActionRecord {
                at: row.get(0)?,
                action: row.get(1)?,
                actor: row.get(2)?,
                reason: row.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok((attempts, actions))
}
