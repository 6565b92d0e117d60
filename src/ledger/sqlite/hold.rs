//! The hold in SQLite: one row or none (`dispatch_hold`), the SQL shared with PostgreSQL.

use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::ledger::model::Hold;
use crate::ledger::portable_sql::{end_hold_sql, hold_sql, move_probe_sql, open_hold_sql, Dialect};

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
    Ok(opened == 1)
}

pub fn move_probe(
    conn: &Connection,
    since: i64,
    from: i64,
    to: i64,
    interval_ms: i64,
) -> rusqlite::Result<bool> {
    let moved = conn
        .prepare_cached(&move_probe_sql(Dialect::Sqlite))?
        .execute(params![since, from, to, interval_ms])?;
    Ok(moved == 1)
}

pub fn end_hold(conn: &Connection, since: i64) -> rusqlite::Result<Option<Hold>> {
    conn.prepare_cached(&end_hold_sql(Dialect::Sqlite))?
        .query_row([since], from_row)
        .optional()
}
