//! The holds in PostgreSQL: a row per held route (`route_holds`), the SQL shared with SQLite; the
//! dispatch pause; and the log of dispatch stops (`dispatch_stops`), begun and ended in the same
//! statements. Each function is the contract operation of its name.

use tokio_postgres::Row;

use super::{sql, PostgresLedger, CHANNEL};
use crate::ledger::error::StorageError;
use crate::ledger::model::{Dispatch, DispatchStop, Hold, StopKind};
use crate::ledger::params::{Actor, ProbeMove};
use crate::ledger::portable_sql::{
    dispatch_stops_sql, end_hold_sql, hold_sql, holds_sql, move_probe_sql, open_hold_sql, Dialect,
    HOLD_COLUMNS,
};
use crate::route_name::RouteName;

fn from_row(row: &Row) -> Hold {
    Hold {
        route: row.get(0),
        since: row.get(1),
        reason: row.get(2),
        sample_error: row.get(3),
        next_probe_at: row.get(4),
        probe_interval_ms: row.get(5),
    }
}

pub(super) async fn dispatch(ledger: &PostgresLedger) -> Result<Dispatch, StorageError> {
    let rows = ledger.query(sql::DISPATCH_SQL, &[]).await?;
    Ok(rows.first().map_or_else(Dispatch::default, |row| Dispatch {
        paused: row.get(0),
        changed_at: row.get(1),
        changed_by: row.get(2),
    }))
}

/// Every receiver's worker is woken, to see the change at once.
pub(super) async fn set_dispatch(
    ledger: &PostgresLedger,
    paused: bool,
    actor: &Actor,
    now: i64,
) -> Result<bool, StorageError> {
    let changed = ledger
        .count(
            sql::SET_DISPATCH_SQL,
            &[&paused, &now, &actor.by, &actor.reason],
        )
        .await?
        == 1;
    if changed {
        ledger.execute(&format!("NOTIFY {CHANNEL}"), &[]).await?;
    }
    Ok(changed)
}

pub(super) async fn hold(
    ledger: &PostgresLedger,
    route: &RouteName,
) -> Result<Option<Hold>, StorageError> {
    let rows = ledger
        .query(&hold_sql(Dialect::Postgres), &[&route.as_str()])
        .await?;
    Ok(rows.first().map(from_row))
}

pub(super) async fn holds(ledger: &PostgresLedger) -> Result<Vec<Hold>, StorageError> {
    let rows = ledger.query(&holds_sql(), &[]).await?;
    Ok(rows.iter().map(from_row).collect())
}

pub(super) async fn open_hold(ledger: &PostgresLedger, hold: &Hold) -> Result<bool, StorageError> {
    // The hold's stop is begun by the same statement.
    let sql = format!(
        "WITH opened AS ({} RETURNING route, since, reason),
             began AS (INSERT INTO dispatch_stops (kind, route, started_at, reason)
                       SELECT 'hold', route, since, reason FROM opened)
             SELECT count(*) FROM opened",
        open_hold_sql(Dialect::Postgres)
    );
    let opened = ledger
        .count(
            &sql,
            &[
                &hold.route,
                &hold.since,
                &hold.reason,
                &hold.sample_error,
                &hold.next_probe_at,
                &hold.probe_interval_ms,
            ],
        )
        .await?;
    Ok(opened == 1)
}

pub(super) async fn move_probe(
    ledger: &PostgresLedger,
    moved: &ProbeMove,
) -> Result<bool, StorageError> {
    let sql = move_probe_sql(Dialect::Postgres);
    let ProbeMove {
        route,
        since,
        from,
        to,
        interval_ms,
    } = moved;
    Ok(ledger
        .execute(&sql, &[route, since, from, to, interval_ms])
        .await?
        == 1)
}

pub(super) async fn end_hold(
    ledger: &PostgresLedger,
    route: &RouteName,
    since: i64,
    now: i64,
) -> Result<Option<Hold>, StorageError> {
    let sql = format!(
        "WITH ended AS ({}),
             closed AS (UPDATE dispatch_stops SET ended_at = $3
                        WHERE kind = 'hold' AND route = $1 AND ended_at IS NULL
                          AND EXISTS (SELECT 1 FROM ended))
             SELECT {HOLD_COLUMNS} FROM ended",
        end_hold_sql(Dialect::Postgres)
    );
    let rows = ledger.query(&sql, &[&route.as_str(), &since, &now]).await?;
    Ok(rows.first().map(from_row))
}

pub(super) async fn dispatch_stops(
    ledger: &PostgresLedger,
    from: i64,
    to: i64,
    limit: usize,
) -> Result<Vec<DispatchStop>, StorageError> {
    let rows = ledger
        .read(
            &dispatch_stops_sql(Dialect::Postgres),
            &[&from, &to, &(limit as i64)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| DispatchStop {
            kind: StopKind::from_column(row.get(0)),
            route: row.get(1),
            started_at: row.get(2),
            started_by: row.get(3),
            reason: row.get(4),
            ended_at: row.get(5),
            ended_by: row.get(6),
        })
        .collect())
}
