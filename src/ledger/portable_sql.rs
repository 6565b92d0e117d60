//! The SQL that reads the same in SQLite's dialect and PostgreSQL's (the counts behind the
//! metrics and `jobs stats`, the lists of `jobs list`, the console's dead-letter groups):
//! written once; each backend runs it.

use super::model::State;

/// The jobs in each state. Waiting and running ones are counted from their partial indexes (a
/// backlog); done and dead ones are the counts that the triggers of `job_counts` keep in the
/// transaction of every change (two rows on SQLite, a few per server process on PostgreSQL),
/// never a count of the finished history, which grows with time.
pub const JOB_COUNTS_SQL: &str =
    "SELECT state, count(*) FROM jobs WHERE state IN ('claimed', 'retrying') GROUP BY state
     UNION ALL
     SELECT 'running', count(*) FROM jobs WHERE state = 'running'
     UNION ALL
     SELECT state, CAST(sum(jobs) AS BIGINT) FROM job_counts GROUP BY state";
/// Work by route: waiting (claimed or retrying) and running, each counted from its partial
/// index of `job_routes` (the backlog, not the history).
pub const WORK_BY_ROUTE_SQL: &str =
    "SELECT route, CAST(sum(waiting) AS BIGINT), CAST(sum(running) AS BIGINT) FROM (
         SELECT route, count(*) AS waiting, 0 AS running FROM job_routes
         WHERE state IN ('claimed', 'retrying') GROUP BY route
         UNION ALL
         SELECT route, 0, count(*) FROM job_routes WHERE state = 'running' GROUP BY route
     ) AS work GROUP BY route ORDER BY route";
pub const OLDEST_UNFINISHED_SQL: &str = "SELECT min(received_at) FROM (
         SELECT received_at FROM jobs WHERE state IN ('claimed', 'retrying')
         UNION ALL SELECT received_at FROM jobs WHERE state = 'running') AS unfinished";

/// The three figures of `jobs stats` after the counts: the oldest unfinished job, received
/// since the first parameter, dead since the second; each reads a range of an index.
pub fn stats_sql(placeholder: Dialect) -> String {
    format!(
        "SELECT ({OLDEST_UNFINISHED_SQL}),
                (SELECT count(*) FROM jobs WHERE received_at >= {}),
                (SELECT count(*) FROM jobs WHERE state = 'dead' AND finished_at >= {})",
        placeholder.at(1),
        placeholder.at(2)
    )
}

/// The dialect of the SQL that is the same but for its parameters and a few functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `?1`, `instr(haystack, needle)`
    Sqlite,
    /// `$1`, `strpos(haystack, needle)`
    Postgres,
}

impl Dialect {
    /// Parameter `n` (1-based).
    pub(super) fn at(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }
}

/// The time a list of jobs in `state` is ordered by (newest first), and the condition that
/// lets the planner read that state's own index: every list reads an index in order and stops
/// at its limit, however large the ledger is (only jobs with the same time are sorted, by id).
pub fn list_order(state: Option<State>) -> (&'static str, &'static str) {
    match state {
        None => ("received_at", "TRUE"),
        Some(State::Claimed) => (
            "next_attempt_at",
            "state = 'claimed' AND state IN ('claimed', 'retrying')",
        ),
        Some(State::Retrying) => (
            "next_attempt_at",
            "state = 'retrying' AND state IN ('claimed', 'retrying')",
        ),
        Some(State::Running) => ("lease_expires_at", "state = 'running'"),
        Some(State::Done) => (
            "finished_at",
            "state = 'done' AND state IN ('done', 'dead')",
        ),
        Some(State::Dead) => ("finished_at", "state = 'dead'"),
    }
}

/// One page of `jobs list`: parameters limit, then (with `after`) the cursor's time and
/// job_id, then (with `since`) the earliest time listed: the other end of the same index
/// range. The columns are a job summary's, then the time the list is ordered by (the
/// cursor's).
pub fn list_jobs_sql(
    state: Option<State>,
    after: bool,
    since: bool,
    placeholder: Dialect,
) -> String {
    let (time, condition) = list_order(state);
    let mut next = 2;
    let mut parameter = || {
        next += 1;
        placeholder.at(next - 1)
    };
    let keyset = if after {
        // Not a row value: SQLite seeks on the first term only in this form.
        let (at, job_id) = (parameter(), parameter());
        format!(" AND {time} <= {at} AND ({time} < {at} OR job_id < {job_id})")
    } else {
        String::new()
    };
    let earliest = if since {
        format!(" AND {time} >= {}", parameter())
    } else {
        String::new()
    };
    format!(
        "SELECT job_id, state, source, event_type, attempts, received_at,
                next_attempt_at, finished_at, last_error, {time}
         FROM jobs WHERE {condition}{keyset}{earliest}
         ORDER BY {time} DESC, job_id DESC LIMIT {}",
        placeholder.at(1)
    )
}

/// A hold's columns, in the order of [`Hold`](super::model::Hold)'s fields.
pub const HOLD_COLUMNS: &str =
    "route, since, reason, sample_error, next_probe_at, probe_interval_ms";

/// The route's hold (the first parameter), if one is open.
pub fn hold_sql(d: Dialect) -> String {
    format!(
        "SELECT {HOLD_COLUMNS} FROM route_holds WHERE route = {}",
        d.at(1)
    )
}

/// Every route's open hold.
pub fn holds_sql() -> String {
    format!("SELECT {HOLD_COLUMNS} FROM route_holds ORDER BY route")
}

/// Opens a route's hold unless one is open. Parameters: the hold's columns in order.
pub fn open_hold_sql(d: Dialect) -> String {
    format!(
        "INSERT INTO route_holds ({HOLD_COLUMNS}) VALUES ({}, {}, {}, {}, {}, {})
         ON CONFLICT (route) DO NOTHING",
        d.at(1),
        d.at(2),
        d.at(3),
        d.at(4),
        d.at(5),
        d.at(6)
    )
}

/// Moves the next probe of the route's hold open since the second parameter, if it is still at
/// the third (no other receiver moved it first). Parameters: route, since, from, to, interval.
pub fn move_probe_sql(d: Dialect) -> String {
    format!(
        "UPDATE route_holds SET next_probe_at = {}, probe_interval_ms = {}
         WHERE route = {} AND since = {} AND next_probe_at = {}",
        d.at(4),
        d.at(5),
        d.at(1),
        d.at(2),
        d.at(3)
    )
}

/// Ends the route's hold (the first parameter) open since the second, returning it.
pub fn end_hold_sql(d: Dialect) -> String {
    format!(
        "DELETE FROM route_holds WHERE route = {} AND since = {} RETURNING {HOLD_COLUMNS}",
        d.at(1),
        d.at(2)
    )
}

/// A stop's columns, in the order of [`DispatchStop`](super::model::DispatchStop)'s fields.
pub const STOP_COLUMNS: &str = "kind, route, started_at, started_by, reason, ended_at, ended_by";

/// The stops in force during some of the first parameter .. the second: per kind (pauses do
/// not overlap pauses, nor holds holds), the last begun before the span if it lasted into it,
/// and the first begun within it, at most the third parameter; each a range of
/// `dispatch_stops_started`.
pub fn dispatch_stops_sql(d: Dialect) -> String {
    let (from, to, limit) = (d.at(1), d.at(2), d.at(3));
    let of_kind = |kind: &str| {
        format!(
            "SELECT * FROM (SELECT {STOP_COLUMNS} FROM dispatch_stops
                            WHERE kind = '{kind}' AND started_at < {from}
                            ORDER BY started_at DESC LIMIT 1) AS before_{kind}
             WHERE ended_at IS NULL OR ended_at > {from}
             UNION ALL
             SELECT * FROM (SELECT {STOP_COLUMNS} FROM dispatch_stops
                            WHERE kind = '{kind}' AND started_at >= {from} AND started_at < {to}
                            ORDER BY started_at LIMIT {limit}) AS within_{kind}"
        )
    };
    format!(
        "SELECT {STOP_COLUMNS} FROM ({} UNION ALL {}) AS stops ORDER BY started_at LIMIT {limit}",
        of_kind("pause"),
        of_kind("hold")
    )
}
