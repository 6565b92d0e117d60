//! The console's minutes in SQLite (`minute_rollups`, one receiver: ''), the SQL shared with
//! PostgreSQL.

use rusqlite::Connection;

use crate::ledger::portable_sql::Dialect;
use crate::ledger::rollups::{select_sql, upsert_sql, MinuteRollup};

pub(super) fn store_rollup(conn: &Connection, rollup: &MinuteRollup) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(&upsert_sql(Dialect::Sqlite))?;
    let values = rollup.values();
    let params = [&rollup.minute as &dyn rusqlite::ToSql, &""]
        .into_iter()
        .chain(values.iter().map(|value| value as &dyn rusqlite::ToSql));
    statement.execute(rusqlite::params_from_iter(params))?;
    Ok(())
}

pub(super) fn rollups_since(
    conn: &Connection,
    minute: i64,
    limit: usize,
) -> rusqlite::Result<Vec<MinuteRollup>> {
    let mut statement = conn.prepare_cached(&select_sql(Dialect::Sqlite))?;
    let rows = statement.query_map(rusqlite::params!["", minute, limit as i64], |row| {
        let mut columns = Vec::with_capacity(row.as_ref().column_count());
        for index in 0..row.as_ref().column_count() {
            columns.push(row.get::<_, i64>(index)?);
        }
        Ok(MinuteRollup::from_columns(|index| columns[index]))
    })?;
    rows.collect()
}
