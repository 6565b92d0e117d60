//! The holds in SQLite: a row per held route (`route_holds`), the SQL shared with PostgreSQL; and
//! the log of dispatch stops (`dispatch_stops`), begun and ended in the same transactions.

use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::ledger::model::Hold;
use crate::ledger::model::{DispatchStop, StopKind};
use crate::ledger::params::ProbeMove;
use crate::ledger::portable_sql::{
    dispatch_stops_sql, end_hold_sql, hold_sql, holds_sql, move_probe_sql, open_hold_sql, Dialect,
};
use crate::route_name::RouteName;

/// Forgets the stops that ended before the cutoff, a batch at a time.
pub const DELETE_ENDED_STOPS_SQL: &str = "DELETE FROM dispatch_stops WHERE id IN (
    SELECT id FROM dispatch_stops WHERE ended_at < ?1 LIMIT ?2)";

fn from_row(row: &Row) -> rusqlite::Result<Hold> {
    Ok(Hold {
        route: row.get(0)?,
        since: row.get(1)?,
        reason: row.get(2)?,
        sample_error: row.get(3)?,
        next_probe_at: row.get(4)?,
        probe_interval_ms: row.get(5)?,
    })
}

pub fn hold(conn: &Connection, route: &RouteName) -> rusqlite::Result<Option<Hold>> {
    conn.prepare_cached(&hold_sql(Dialect::Sqlite))?
        .query_row([route], from_row)
        .optional()
}

pub fn holds(conn: &Connection) -> rusqlite::Result<Vec<Hold>> {
    conn.prepare_cached(&holds_sql())?
        .query_map([], from_row)?
        .collect()
}

pub fn open_hold(conn: &Connection, hold: &Hold) -> rusqlite::Result<bool> {
    let opened = conn
        .prepare_cached(&open_hold_sql(Dialect::Sqlite))?
        .execute(params![
            hold.route,
            hold.since,
            hold.reason,
            hold.sample_error,
            hold.next_probe_at,
            hold.probe_interval_ms
        ])?;
    if opened == 1 {
        let stop = Stop {
            kind: StopKind::Hold,
            route: Some(&hold.route),
            by: None,
            reason: Some(&hold.reason),
        };
        begin_stop(conn, &stop, hold.since)?;
    }
    Ok(opened == 1)
}

pub fn move_probe(conn: &Connection, moved: &ProbeMove) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(&move_probe_sql(Dialect::Sqlite))?
        .execute(params![
            moved.route,
            moved.since,
            moved.from,
            moved.to,
            moved.interval_ms
        ])?;
    Ok(changed == 1)
}

pub fn end_hold(
    conn: &Connection,
    route: &RouteName,
    since: i64,
    now: i64,
) -> rusqlite::Result<Option<Hold>> {
    let ended = conn
        .prepare_cached(&end_hold_sql(Dialect::Sqlite))?
        .query_row(params![route, since], from_row)
        .optional()?;
    if ended.is_some() {
        end_stops(conn, Some((StopKind::Hold, route.as_str())), now, None)?;
    }
    Ok(ended)
}

/// A stop of dispatch as it begins: a pause (of every route) by an operator, or a route's hold.
pub struct Stop<'a> {
    pub kind: StopKind,
    pub route: Option<&'a str>,
    pub by: Option<&'a str>,
    pub reason: Option<&'a str>,
}

/// Logs a stop of dispatch that begins at `at`.
pub fn begin_stop(conn: &Connection, stop: &Stop<'_>, at: i64) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO dispatch_stops (kind, route, started_at, started_by, reason)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        stop.kind.as_str(),
        stop.route,
        at,
        stop.by,
        stop.reason
    ])
    .map(drop)
}

/// Ends the open stops of one kind and route (of every kind and route: `None`) at `at`.
pub fn end_stops(
    conn: &Connection,
    which: Option<(StopKind, &str)>,
    at: i64,
    by: Option<&str>,
) -> rusqlite::Result<()> {
    let (kind, route) = which.map(|(kind, route)| (kind.as_str(), route)).unzip();
    conn.prepare_cached(
        "UPDATE dispatch_stops SET ended_at = ?1, ended_by = ?2
         WHERE ended_at IS NULL AND (?3 IS NULL OR (kind = ?3 AND route IS ?4))",
    )?
    .execute(params![at, by, kind, route])
    .map(drop)
}

pub fn dispatch_stops(
    conn: &Connection,
    from: i64,
    to: i64,
    limit: usize,
) -> rusqlite::Result<Vec<DispatchStop>> {
    conn.prepare_cached(&dispatch_stops_sql(Dialect::Sqlite))?
        .query_map(params![from, to, limit as i64], |row| {
            Ok(DispatchStop {
                kind: StopKind::from_column(&row.get::<_, String>(0)?),
                route: row.get(1)?,
                started_at: row.get(2)?,
                started_by: row.get(3)?,
                reason: row.get(4)?,
                ended_at: row.get(5)?,
                ended_by: row.get(6)?,
            })
        })?
        .collect()
}
