//! The hold in SQLite: one row or none (`dispatch_hold`), the SQL shared with PostgreSQL; and
//! the log of dispatch stops (`dispatch_stops`), begun and ended in the same transactions.

use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::ledger::model::Hold;
use crate::ledger::model::{DispatchStop, StopKind};
use crate::ledger::params::ProbeMove;
use crate::ledger::portable_sql::{
    dispatch_stops_sql, end_hold_sql, hold_sql, move_probe_sql, open_hold_sql, Dialect,
};

/// Forgets the stops that ended before the cutoff, a batch at a time.
pub const DELETE_ENDED_STOPS_SQL: &str = "DELETE FROM dispatch_stops WHERE id IN (
    SELECT id FROM dispatch_stops WHERE ended_at < ?1 LIMIT ?2)";

fn from_row(row: &Row) -> rusqlite::Result<Hold> {
    Ok(Hold {
        since: row.get(0)?,
        reason: row.get(1)?,
        sample_error: row.get(2)?,
        next_probe_at: row.get(3)?,
        probe_interval_ms: row.get(4)?,
    })
}

pub fn hold(conn: &Connection) -> rusqlite::Result<Option<Hold>> {
    conn.prepare_cached(&hold_sql())?
        .query_row([], from_row)
        .optional()
}

pub fn open_hold(conn: &Connection, hold: &Hold) -> rusqlite::Result<bool> {
    let opened = conn
        .prepare_cached(&open_hold_sql(Dialect::Sqlite))?
        .execute(params![
            hold.since,
            hold.reason,
            hold.sample_error,
            hold.next_probe_at,
            hold.probe_interval_ms
        ])?;
    if opened == 1 {
        begin_stop(conn, StopKind::Hold, hold.since, None, Some(&hold.reason))?;
    }
    Ok(opened == 1)
}

pub fn move_probe(conn: &Connection, moved: &ProbeMove) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(&move_probe_sql(Dialect::Sqlite))?
        .execute(params![
            moved.since,
            moved.from,
            moved.to,
            moved.interval_ms
        ])?;
    Ok(changed == 1)
}

pub fn end_hold(conn: &Connection, since: i64, now: i64) -> rusqlite::Result<Option<Hold>> {
    let ended = conn
        .prepare_cached(&end_hold_sql(Dialect::Sqlite))?
        .query_row([since], from_row)
        .optional()?;
    if ended.is_some() {
        end_stops(conn, Some(StopKind::Hold), now, None)?;
    }
    Ok(ended)
}

/// Logs a stop of dispatch that begins at `at`.
pub fn begin_stop(
    conn: &Connection,
    kind: StopKind,
    at: i64,
    by: Option<&str>,
    reason: Option<&str>,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO dispatch_stops (kind, started_at, started_by, reason) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![kind.as_str(), at, by, reason])
    .map(drop)
}

/// Ends the open stops of `kind` (of both kinds: `None`) at `at`.
pub fn end_stops(
    conn: &Connection,
    kind: Option<StopKind>,
    at: i64,
    by: Option<&str>,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE dispatch_stops SET ended_at = ?1, ended_by = ?2
         WHERE ended_at IS NULL AND (?3 IS NULL OR kind = ?3)",
    )?
    .execute(params![at, by, kind.map(StopKind::as_str)])
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
                started_at: row.get(1)?,
                started_by: row.get(2)?,
                reason: row.get(3)?,
                ended_at: row.get(4)?,
                ended_by: row.get(5)?,
            })
        })?
        .collect()
}
