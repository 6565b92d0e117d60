//! The `jobs` and `job_routes` tables on SQLite: every statement that reads or changes them,
//! and their row mappers. The work-side statements change a job's work on one route
//! (`job_routes`); its trigger keeps the job's summary in `jobs`, which the lists read.

use std::str::FromStr;

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::history::{history_of, record_action, record_end, record_start, HistoryEntry};
use super::hold;
use crate::event_type::EventType;
use crate::job_id::JobId;
use crate::ledger::model::Dispatch;
use crate::ledger::model::StopKind;
use crate::ledger::model::{
    state_counts, Attempt, AttemptEnd, AttemptRows, ClaimOutcome, Cursor, DueJobs, JobDetail,
    JobPage, JobStats, JobSummary, LeasedAttempt, NewClaim, Release, RetryCount, RetryError,
    RetryFilter, Source, State,
};
use crate::ledger::params::Actor;
use crate::ledger::portable_sql::{
    list_jobs_sql, stats_sql, Dialect, JOB_COUNTS_SQL, OLDEST_UNFINISHED_SQL, WORK_BY_ROUTE_SQL,
};
use crate::route_name::RouteName;

// The statements that must stay cheap however large the ledger grows; tests check that each
// reads only its partial index (EXPLAIN QUERY PLAN).
pub const EXPIRED_LEASES_SQL: &str = "SELECT jobs.job_id, r.route, r.attempts
         FROM job_routes AS r JOIN jobs ON jobs.id = r.job
         WHERE r.state = 'running' AND r.lease_expires_at <= ?1";
/// Parameters: now, limit, route.
pub const DUE_JOBS_SQL: &str = "SELECT jobs.job_id
         FROM job_routes AS r JOIN jobs ON jobs.id = r.job
         WHERE r.route = ?3 AND r.state IN ('claimed', 'retrying') AND r.next_attempt_at <= ?1
         ORDER BY r.next_attempt_at LIMIT ?2";
/// Parameters: route.
pub const NEXT_DUE_ON_ROUTE_SQL: &str = "SELECT min(next_attempt_at) FROM job_routes
         WHERE route = ?1 AND state IN ('claimed', 'retrying')";
pub const NEXT_DUE_SQL: &str = "SELECT min(next_attempt_at) FROM jobs
         WHERE state IN ('claimed', 'retrying')";
/// INDEXED BY: the planner would otherwise pick jobs_finished, which also holds every
/// tombstone, and walk all of them on each run.
pub const PURGE_BODIES_SQL: &str = "UPDATE jobs
    SET body = NULL, body_purged_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
    WHERE rowid IN (
    SELECT rowid FROM jobs INDEXED BY jobs_finished_with_body
    WHERE state IN ('done', 'dead') AND body IS NOT NULL AND finished_at < ?1 LIMIT ?2)";
pub const DELETE_FINISHED_SQL: &str = "DELETE FROM jobs WHERE rowid IN (
    SELECT rowid FROM jobs WHERE state IN ('done', 'dead') AND finished_at < ?1 LIMIT ?2)";

/// Parameters: job_id, attempt number, state, error, retry at, finished at, now, route, the
/// job's row when the start's is known (else it is looked up by job_id: `coalesce` evaluates
/// its second argument only when the first is NULL).
pub const FINISH_ATTEMPT_SQL: &str =
    "UPDATE job_routes SET state = ?3, last_error = coalesce(?4, last_error),
                     next_attempt_at = ?5, finished_at = ?6, lease_expires_at = NULL,
                     updated_at = ?7, next_attempt_cause = 'backoff'
     WHERE job = coalesce(?9, (SELECT id FROM jobs WHERE job_id = ?1)) AND route = ?8
       AND attempts = ?2 AND state = 'running'";
/// Parameters: job_id, attempt number, now, the next attempt's cause, route, the job's row
/// (as in [`FINISH_ATTEMPT_SQL`]).
pub const RELEASE_ATTEMPT_SQL: &str =
    "UPDATE job_routes SET state = CASE WHEN attempts > 1 THEN 'retrying' ELSE 'claimed' END,
                     attempts = attempts - 1, next_attempt_at = ?3,
                     lease_expires_at = NULL, updated_at = ?3, next_attempt_cause = ?4
     WHERE job = coalesce(?6, (SELECT id FROM jobs WHERE job_id = ?1)) AND route = ?5
       AND attempts = ?2 AND state = 'running'";
/// Parameters: job_id, now, max_attempts, error, cutoff, attempt number, route. The lease and
/// the attempt are checked again: the lease may have been taken back since it was read.
pub const TAKE_BACK_LEASE_SQL: &str = "UPDATE job_routes SET
             state = CASE WHEN attempts >= ?3 THEN 'dead' ELSE 'retrying' END,
             next_attempt_at = CASE WHEN attempts >= ?3 THEN NULL ELSE CAST(?2 AS BIGINT) END,
             finished_at = CASE WHEN attempts >= ?3 THEN CAST(?2 AS BIGINT) ELSE NULL END,
             lease_expires_at = NULL, last_error = ?4, updated_at = ?2,
             next_attempt_cause = 'take_back'
         WHERE job = (SELECT id FROM jobs WHERE job_id = ?1) AND route = ?7 AND state = 'running'
           AND lease_expires_at <= ?5
           AND attempts = ?6
         RETURNING state";
/// Parameters: job_id, now, error, route. The route's waiting work, or every route's (NULL).
pub const GIVE_UP_SQL: &str =
    "UPDATE job_routes SET state = 'dead', next_attempt_at = NULL, finished_at = ?2,
                     last_error = ?3, updated_at = ?2
     WHERE job = (SELECT id FROM jobs WHERE job_id = ?1) AND state IN ('claimed', 'retrying')
       AND (?4 IS NULL OR route = ?4)";
pub const SHOW_JOB_SQL: &str = "SELECT job_id, state, source, event_type, attempts, received_at,
         next_attempt_at, finished_at, last_error, lease_expires_at, updated_at, body,
         body_purged_at, next_attempt_cause,
         coalesce((SELECT count FROM job_duplicates AS d WHERE d.job_id = jobs.job_id), 0),
         (SELECT last_at FROM job_duplicates AS d WHERE d.job_id = jobs.job_id)
     FROM jobs WHERE job_id = ?1";
/// Parameters: job_id, now, route. A finished job's routes in its state (a dead job's dead
/// ones, a done job's all), or the route's finished work; with a body to run them from.
pub const RETRY_JOB_SQL: &str =
    "UPDATE job_routes SET state = 'claimed', attempts = 0, next_attempt_at = ?2,
                     finished_at = NULL, updated_at = ?2, next_attempt_cause = 'manual_retry'
     WHERE job = (SELECT id FROM jobs WHERE job_id = ?1 AND body IS NOT NULL)
       AND state IN ('done', 'dead')
       AND CASE WHEN ?3 IS NULL THEN state = (SELECT state FROM jobs WHERE job_id = ?1)
                ELSE route = ?3 END";
/// Parameters: job_id, now, route (NULL: every route).
pub const RUN_NOW_SQL: &str = "UPDATE job_routes SET next_attempt_at = ?2, updated_at = ?2,
                     next_attempt_cause = 'run_now'
     WHERE job = (SELECT id FROM jobs WHERE job_id = ?1) AND state = 'retrying'
       AND (?3 IS NULL OR route = ?3)";
/// The finished jobs a bulk retry takes, oldest finished first (the state's own index, in
/// order). Parameters: state, finished since, finished before, error text or NULL, limit.
pub const RETRY_MATCHING_SQL: &str = "SELECT job_id FROM jobs
     WHERE state = ?1 AND state IN ('done', 'dead') AND finished_at >= ?2 AND finished_at < ?3
       AND (?4 IS NULL OR instr(last_error, ?4) > 0) AND body IS NOT NULL
     ORDER BY finished_at LIMIT ?5";
/// What [`RETRY_MATCHING_SQL`] would take in all, counted exactly, and those whose body is gone.
pub const COUNT_RETRY_MATCHING_SQL: &str = "SELECT
         count(*) FILTER (WHERE body IS NOT NULL), count(*) FILTER (WHERE body IS NULL)
     FROM jobs
     WHERE state = ?1 AND state IN ('done', 'dead') AND finished_at >= ?2 AND finished_at < ?3
       AND (?4 IS NULL OR instr(last_error, ?4) > 0)";
/// job_ids matching a LIKE pattern (the load generator's check of its run).
#[cfg(feature = "bench")]
pub const JOB_IDS_LIKE_SQL: &str = "SELECT job_id FROM jobs WHERE job_id LIKE ?1";
/// why [`RETRY_JOB_SQL`] changed nothing: the job's state, or its route's (the second
/// parameter, when given).
pub const RETRY_REFUSAL_SQL: &str = "SELECT coalesce(
             (SELECT state FROM job_routes WHERE job = jobs.id AND route = ?2), state),
         body IS NULL
     FROM jobs WHERE job_id = ?1 AND (?2 IS NULL OR EXISTS (
         SELECT 1 FROM job_routes WHERE job = jobs.id AND route = ?2))";

/// A claim: the job's row unless its job_id is already known.
///
/// `OR FAIL`: a claim writes nothing before its NOT NULL and CHECK constraints pass, so on a
/// violation there is nothing of it to undo, and without ABORT constraints the statement may not
/// abort midway. SQLite gives a statement a statement journal (a copy of every page it is about
/// to change) when it may abort midway and may write more than one table, which the INSERT
/// trigger of `job_counts` makes every INSERT into `jobs`: that copy cost every claim four
/// pages of memcpy. Without it, a claim that runs out of disk or memory midway makes SQLite roll
/// back the whole batch's transaction, not the claim alone; `commit_batch` sees that and answers
/// every claim of the batch 503.
///
/// Parameters: job_id, source, event_type, body, now, state, error. A job no route takes is
/// written finished (`state` done or dead, with `error`), and has no work.
pub const CLAIM_SQL: &str = "INSERT OR FAIL INTO jobs (job_id, state, source, event_type, body,
                                          received_at, next_attempt_at, updated_at,
                                          last_error, finished_at, trace_context)
     VALUES (?1, ?6, ?2, ?3, ?4, ?5, CASE WHEN ?6 = 'claimed' THEN ?5 END, ?5,
             ?7, CASE WHEN ?6 = 'claimed' THEN NULL ELSE ?5 END, ?8)
     ON CONFLICT (job_id) DO NOTHING";
/// A claimed job's work on one route. Parameters: the job's number (`jobs.id`), route, now.
/// `OR IGNORE`: the only conflict there can be is a route named twice, which is one route's
/// work; no other constraint can fail (every value is given), so the job's row never stands
/// without its work.
pub const CLAIM_ROUTE_SQL: &str = "INSERT OR IGNORE INTO job_routes
         (job, route, state, next_attempt_at, updated_at)
     VALUES (?1, ?2, 'claimed', ?3, ?3)";

/// Records a job, and its work on each route it takes, unless its job_id is already known.
/// The one idempotency check there is: a duplicate writes no work either.
pub fn insert_claim(
    conn: &Connection,
    claim: &NewClaim,
    now: i64,
) -> rusqlite::Result<ClaimOutcome> {
    let (state, error) = claim.routing.claimed_state();
    let inserted = conn.prepare_cached(CLAIM_SQL)?.execute(params![
        claim.job_id,
        claim.source.as_str(),
        claim.event_type.as_ref().map(EventType::as_str),
        claim.body.as_str(),
        now,
        state,
        error,
        claim.trace_context
    ])?;
    if inserted != 1 {
        return Ok(ClaimOutcome::Duplicate);
    }
    // The row just inserted: the triggers it fired (job_counts) insert nothing.
    let job = conn.last_insert_rowid();
    let mut statement = conn.prepare_cached(CLAIM_ROUTE_SQL)?;
    for route in claim.routing.routes() {
        statement.execute(params![job, route, now])?;
    }
    Ok(ClaimOutcome::Claimed)
}

/// Moves a due job to `running` under a lease and counts the attempt. `None` when the job is not
/// waiting to run (already running, finished, or unknown), so a job is never started twice.
pub fn start_attempt(
    conn: &Connection,
    job_id: &JobId,
    route: &RouteName,
    now: i64,
    lease_expires_at: i64,
) -> rusqlite::Result<Option<Attempt>> {
    let Some((job, event_type, source, body)) = conn
        .prepare_cached(
            "SELECT id, event_type, source, body FROM jobs WHERE job_id = ?1 AND body IS NOT NULL",
        )?
        .query_row([job_id], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Option<String>>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, String>(3)?,
            ))
        })
        .optional()?
    else {
        return Ok(None);
    };
    let started = conn
        .prepare_cached(
            "UPDATE job_routes SET state = 'running', attempts = attempts + 1,
                                   lease_expires_at = ?3, next_attempt_at = NULL, updated_at = ?4
             WHERE job = ?1 AND route = ?2 AND state IN ('claimed', 'retrying')
             RETURNING attempts, next_attempt_cause",
        )?
        .query_row(params![job, route, lease_expires_at, now], |row| {
            Ok((row.get::<_, u32>(0)?, row.get::<_, String>(1)?))
        })
        .optional()?;
    let Some((number, cause)) = started else {
        return Ok(None);
    };
    let history = record_start(conn, job_id.as_str(), route.as_str(), number, &cause, now)?;
    Ok(Some(Attempt {
        job_id: job_id.clone(),
        route: route.clone(),
        number,
        event_type,
        source: Source::parse(&source),
        body,
        rows: Some(AttemptRows { job, history }),
    }))
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
    let (state, failure, retry_at) = end.outcome();
    let finished_at = state.is_finished().then_some(now);
    let changed = conn.prepare_cached(FINISH_ATTEMPT_SQL)?.execute(params![
        attempt.job_id,
        attempt.number,
        state.as_str(),
        failure.map(|f| f.error.as_str()),
        retry_at,
        finished_at,
        now,
        attempt.route,
        attempt.rows.map(|rows| rows.job)
    ])?;
    if changed != 1 {
        return Ok(None);
    }
    record_end(conn, entry_of(attempt), end.history_outcome(), failure, now)?;
    Ok(Some(state))
}

/// Gives back an attempt our own shutdown interrupted: it does not count, and the job is due
/// again at once (at the next start). `false` if the attempt no longer owned the job.
pub fn release_attempt(
    conn: &Connection,
    attempt: &Attempt,
    release: &Release,
    now: i64,
) -> rusqlite::Result<bool> {
    let changed = conn.prepare_cached(RELEASE_ATTEMPT_SQL)?.execute(params![
        attempt.job_id,
        attempt.number,
        now,
        release.next_cause(),
        attempt.route,
        attempt.rows.map(|rows| rows.job)
    ])?;
    if changed == 1 {
        let why = release.recorded();
        record_end(conn, entry_of(attempt), "released", Some(&why), now)?;
    }
    Ok(changed == 1)
}

/// The attempt's entry in its job's history: by the row its start wrote, when known.
fn entry_of(attempt: &Attempt) -> HistoryEntry<'_> {
    HistoryEntry {
        job_id: attempt.job_id.as_str(),
        route: attempt.route.as_str(),
        number: i64::from(attempt.number),
        row: attempt.rows.map(|rows| rows.history),
    }
}

/// Running jobs whose lease expired before `cutoff`: candidates for [`take_back_lease`] once
/// the caller has left out those it is still running itself (their handler timeout is enforced
/// on the monotonic clock, so a jump of the wall clock must not hand them out twice).
pub fn expired_leases(conn: &Connection, cutoff: i64) -> rusqlite::Result<Vec<LeasedAttempt>> {
    conn.prepare_cached(EXPIRED_LEASES_SQL)?
        .query_map([cutoff], |row| {
            Ok(LeasedAttempt {
                job_id: row.get(0)?,
                route: row.get(1)?,
                number: row.get(2)?,
            })
        })?
        .collect()
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
            params![
                lease.job_id,
                now,
                max_attempts,
                error,
                cutoff,
                lease.number,
                lease.route
            ],
            |row| row.get::<_, String>(0),
        )
        .optional()?;
    if state.is_some() {
        let failure = crate::ledger::model::Failure::new(error);
        let entry = HistoryEntry {
            job_id: &lease.job_id,
            route: &lease.route,
            number: lease.number,
            row: None,
        };
        record_end(conn, entry, "taken_back", Some(&failure), now)?;
    }
    Ok(state.map(|state| State::from_str(&state).unwrap_or(State::Retrying)))
}

/// Makes a waiting job `dead` with `error`, no attempt run, recorded as `action` by `actor`
/// (whose reason is the error); `false` if it was not waiting.
pub fn give_up(
    conn: &Connection,
    job_id: &str,
    error: &str,
    (action, by): (&str, &str),
    route: Option<&RouteName>,
    now: i64,
) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(GIVE_UP_SQL)?
        .execute(params![job_id, now, error, route])?
        > 0;
    if changed {
        record_action(conn, job_id, action, &Actor::because(by, Some(error)), now)?;
    }
    Ok(changed)
}

/// Jobs waiting to run whose time has come, oldest first, split into those that can run and
/// stored ids that are not a valid [`JobId`] (written before ids were checked).
pub fn due_jobs(
    conn: &Connection,
    route: &RouteName,
    now: i64,
    limit: usize,
) -> rusqlite::Result<DueJobs> {
    let mut statement = conn.prepare_cached(DUE_JOBS_SQL)?;
    let rows = statement.query_map(params![now, limit as i64, route], |row| {
        row.get::<_, String>(0)
    })?;
    let due = rows.collect::<rusqlite::Result<_>>()?;
    let next_at = conn
        .prepare_cached(NEXT_DUE_ON_ROUTE_SQL)?
        .query_row([route], |row| row.get(0))?;
    Ok(DueJobs::sort(due, next_at))
}

/// When the earliest waiting job is due.
pub fn next_due_at(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(NEXT_DUE_SQL)?
        .query_row([], |row| row.get(0))
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

/// One page of jobs, newest first, optionally in one state (see
/// [`list_order`](crate::ledger::portable_sql::list_order)).
pub fn list_jobs(
    conn: &Connection,
    state: Option<State>,
    after: Option<&Cursor>,
    since: Option<i64>,
    limit: usize,
) -> rusqlite::Result<JobPage> {
    let sql = list_jobs_sql(state, after.is_some(), since.is_some(), Dialect::Sqlite);
    let mut statement = conn.prepare_cached(&sql)?;
    let mut values: Vec<rusqlite::types::Value> = vec![(limit as i64).into()];
    if let Some(cursor) = after {
        values.extend([cursor.at.into(), cursor.job_id.clone().into()]);
    }
    values.extend(since.map(rusqlite::types::Value::from));
    let rows = statement.query_map(rusqlite::params_from_iter(values), |row| {
        // After the summary's nine columns. A row edited by hand may lack its state's time:
        // it sorts last, and ends paging.
        let at: Option<i64> = row.get(9)?;
        Ok((at.unwrap_or(i64::MIN), summary_from_row(row)?))
    })?;
    Ok(JobPage::from_rows(
        rows.collect::<rusqlite::Result<_>>()?,
        limit,
    ))
}

/// A job's kept trace context (migrations/sqlite/0010_trace_context.sql).
pub fn trace_context(conn: &Connection, job_id: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT trace_context FROM jobs WHERE job_id = ?1")?
        .query_row([job_id], |row| row.get(0))
        .optional()
        .map(Option::flatten)
}

pub fn show_job(conn: &Connection, job_id: &str) -> rusqlite::Result<Option<JobDetail>> {
    let Some(mut job) = conn
        .query_row(SHOW_JOB_SQL, [job_id], |row| {
            Ok(JobDetail {
                summary: summary_from_row(row)?,
                lease_expires_at: row.get(9)?,
                updated_at: row.get(10)?,
                body: row.get(11)?,
                body_purged_at: row.get(12)?,
                next_attempt_cause: row.get(13)?,
                duplicates: row.get(14)?,
                last_duplicate_at: row.get(15)?,
                history: Vec::new(),
                actions: Vec::new(),
            })
        })
        .optional()?
    else {
        return Ok(None);
    };
    (job.history, job.actions) = history_of(conn, job_id)?;
    Ok(Some(job))
}

/// How many jobs are in each state; every state named.
pub fn job_counts(conn: &Connection) -> rusqlite::Result<Vec<(State, u64)>> {
    Ok(state_counts(count_rows(conn)?))
}

fn count_rows(conn: &Connection) -> rusqlite::Result<Vec<(String, i64)>> {
    let mut statement = conn.prepare_cached(JOB_COUNTS_SQL)?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    rows.collect()
}

/// Work by route: `(route, waiting, running)`.
pub fn work_by_route(conn: &Connection) -> rusqlite::Result<Vec<(String, u64, u64)>> {
    let mut statement = conn.prepare_cached(WORK_BY_ROUTE_SQL)?;
    let rows = statement.query_map([], |row| {
        let count = |i| row.get::<_, i64>(i).map(i64::unsigned_abs);
        Ok((row.get(0)?, count(1)?, count(2)?))
    })?;
    rows.collect()
}

/// Which of `job_ids` have work on `route`.
pub fn jobs_on_route(
    conn: &Connection,
    route: &RouteName,
    job_ids: &[String],
) -> rusqlite::Result<Vec<String>> {
    let ids = serde_json::to_string(job_ids).expect("strings serialize");
    conn.prepare_cached(
        "SELECT jobs.job_id FROM jobs JOIN job_routes AS r ON r.job = jobs.id
         WHERE r.route = ?1 AND jobs.job_id IN (SELECT value FROM json_each(?2))",
    )?
    .query_map(params![route, ids], |row| row.get(0))?
    .collect()
}

/// The oldest job still waiting or running: when it was received (Unix ms).
pub fn oldest_unfinished(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(OLDEST_UNFINISHED_SQL)?
        .query_row([], |row| row.get(0))
}

/// Counts for `jobs stats`.
pub fn job_stats(conn: &Connection, now: i64) -> rusqlite::Result<JobStats> {
    let by_state = count_rows(conn)?;
    let (hour_ago, day_ago) = JobStats::since(now);
    let counts = conn
        .prepare_cached(&stats_sql(Dialect::Sqlite))?
        .query_row([hour_ago, day_ago], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
    Ok(JobStats::from_counts(by_state, counts))
}

#[cfg(feature = "bench")]
pub fn job_ids_like(conn: &Connection, pattern: &str) -> rusqlite::Result<Vec<String>> {
    let mut statement = conn.prepare(JOB_IDS_LIKE_SQL)?;
    let rows = statement.query_map([pattern], |row| row.get(0))?;
    rows.collect()
}

pub fn run_now(
    conn: &Connection,
    job_id: &str,
    route: Option<&RouteName>,
    actor: &Actor,
    now: i64,
) -> rusqlite::Result<bool> {
    let changed = conn.execute(RUN_NOW_SQL, params![job_id, now, route])? > 0;
    if changed {
        record_action(conn, job_id, "run_now", actor, now)?;
    }
    Ok(changed)
}

/// Makes a `done` or `dead` job due again with a fresh set of attempts; `false` if it was not
/// finished or has no body.
fn retry_one(
    conn: &Connection,
    job_id: &str,
    route: Option<&RouteName>,
    actor: &Actor,
    now: i64,
) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(RETRY_JOB_SQL)?
        .execute(params![job_id, now, route])?
        > 0;
    if changed {
        record_action(conn, job_id, "retry", actor, now)?;
    }
    Ok(changed)
}

/// Makes a `done` or `dead` job due again with a fresh set of attempts.
/// `Ok(Err(_))`: the job was not retried, and why.
pub fn retry_job(
    conn: &Connection,
    job_id: &str,
    route: Option<&RouteName>,
    actor: &Actor,
    now: i64,
) -> rusqlite::Result<Result<(), RetryError>> {
    if retry_one(conn, job_id, route, actor, now)? {
        return Ok(Ok(()));
    }
    let found = conn
        .query_row(RETRY_REFUSAL_SQL, params![job_id, route], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()?;
    Ok(Err(RetryError::refusal(job_id, found)))
}

fn filter_params(filter: &RetryFilter) -> (&'static str, i64, i64, Option<&str>) {
    (
        filter.state.as_str(),
        filter.finished_since.unwrap_or(i64::MIN),
        filter.finished_before,
        filter.error_contains.as_deref(),
    )
}

/// Retries up to `limit` of the jobs `filter` takes, each recorded as `actor`'s; how many.
pub fn retry_matching(
    conn: &Connection,
    filter: &RetryFilter,
    actor: &Actor,
    now: i64,
    limit: usize,
) -> rusqlite::Result<usize> {
    let (state, since, before, error) = filter_params(filter);
    let job_ids = conn
        .prepare_cached(RETRY_MATCHING_SQL)?
        .query_map(params![state, since, before, error, limit as i64], |row| {
            row.get::<_, String>(0)
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut retried = 0;
    for job_id in &job_ids {
        retried += usize::from(retry_one(conn, job_id, None, actor, now)?);
    }
    Ok(retried)
}

/// What a bulk retry with `filter` would take, counted exactly.
pub fn count_retry_matching(
    conn: &Connection,
    filter: &RetryFilter,
) -> rusqlite::Result<RetryCount> {
    let (state, since, before, error) = filter_params(filter);
    conn.prepare_cached(COUNT_RETRY_MATCHING_SQL)?.query_row(
        params![state, since, before, error],
        |row| {
            Ok(RetryCount {
                retryable: row.get::<_, i64>(0)?.unsigned_abs(),
                body_purged: row.get::<_, i64>(1)?.unsigned_abs(),
            })
        },
    )
}

/// Adds duplicate deliveries to their jobs' counts.
pub fn record_duplicates(conn: &Connection, seen: &[(JobId, u32, i64)]) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(
        "INSERT INTO job_duplicates (job_id, count, last_at)
         SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM jobs WHERE job_id = ?1)
         ON CONFLICT (job_id) DO UPDATE SET count = count + excluded.count,
                                            last_at = max(last_at, excluded.last_at)",
    )?;
    for (job_id, count, last) in seen {
        statement.execute(params![job_id.as_str(), count, last])?;
    }
    Ok(())
}

/// Whether the workers run jobs.
pub fn dispatch(conn: &Connection) -> rusqlite::Result<Dispatch> {
    conn.prepare_cached("SELECT paused, changed_at, changed_by FROM dispatch WHERE id = 1")?
        .query_row([], |row| {
            Ok(Dispatch {
                paused: row.get(0)?,
                changed_at: row.get(1)?,
                changed_by: row.get(2)?,
                route: None,
            })
        })
}

/// Whether `route`'s worker runs jobs: every route's pause first, then the route's own.
pub fn route_dispatch(conn: &Connection, route: &RouteName) -> rusqlite::Result<Dispatch> {
    let every = dispatch(conn)?;
    if every.paused {
        return Ok(every);
    }
    let own = conn
        .prepare_cached("SELECT changed_at, changed_by FROM route_pauses WHERE route = ?1")?
        .query_row([route], |row| {
            Ok(Dispatch {
                paused: true,
                changed_at: row.get(0)?,
                changed_by: row.get(1)?,
                route: Some(route.to_string()),
            })
        })
        .optional()?;
    Ok(own.unwrap_or(every))
}

/// Pauses or resumes `route`'s work; `false` if it already was. A resume also ends the route's
/// hold, and is then a change.
pub fn set_route_dispatch(
    conn: &Connection,
    route: &RouteName,
    paused: bool,
    actor: &Actor,
    now: i64,
) -> rusqlite::Result<bool> {
    let by = actor.by.as_str();
    if paused {
        let began = conn.execute(
            "INSERT INTO route_pauses (route, changed_at, changed_by) VALUES (?1, ?2, ?3)
             ON CONFLICT (route) DO NOTHING",
            params![route, now, by],
        )? == 1;
        if began {
            let pause = hold::Stop {
                kind: StopKind::Pause,
                route: Some(route.as_str()),
                by: Some(by),
                reason: actor.reason(),
            };
            hold::begin_stop(conn, &pause, now)?;
        }
        return Ok(began);
    }
    let resumed = conn.execute("DELETE FROM route_pauses WHERE route = ?1", [route])? == 1;
    let hold_ended = conn.execute("DELETE FROM route_holds WHERE route = ?1", [route])? == 1;
    for (kind, ended) in [(StopKind::Pause, resumed), (StopKind::Hold, hold_ended)] {
        if ended {
            hold::end_stops(conn, Some((kind, route.as_str())), now, Some(by))?;
        }
    }
    Ok(resumed || hold_ended)
}

/// Pauses or resumes the workers; `false` if they already were. A resume also ends a hold,
/// and is then a change.
/// A pause begins a stop in the log, a resume ends every open one (a pause, a hold).
pub fn set_dispatch(
    conn: &Connection,
    paused: bool,
    actor: &Actor,
    now: i64,
) -> rusqlite::Result<bool> {
    let by = actor.by.as_str();
    // A resume of every route ends every hold and every route's own pause as well.
    let hold_ended = !paused
        && conn.execute("DELETE FROM route_holds", [])?
            + conn.execute("DELETE FROM route_pauses", [])?
            > 0;
    let changed = conn.execute(
        "UPDATE dispatch SET paused = ?1, changed_at = ?2, changed_by = ?3
         WHERE id = 1 AND (paused <> ?1 OR ?4)",
        params![paused, now, by, hold_ended],
    )? == 1;
    match (changed, paused) {
        (true, true) => {
            let pause = hold::Stop {
                kind: StopKind::Pause,
                route: None,
                by: Some(by),
                reason: actor.reason(),
            };
            hold::begin_stop(conn, &pause, now)?
        }
        (true, false) => hold::end_stops(conn, None, now, Some(by))?,
        (false, _) => {}
    }
    Ok(changed)
}
