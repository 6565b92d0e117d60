//! The hold in PostgreSQL: one row or none (`dispatch_hold`), the SQL shared with SQLite.

use tokio_postgres::Row;

use super::PostgresLedger;
use crate::ledger::error::StorageError;
use crate::ledger::model::Hold;
use crate::ledger::portable_sql::{end_hold_sql, hold_sql, move_probe_sql, open_hold_sql, Dialect};

fn from_row(row: &Row) -> Hold {
    Hold {
        since: row.get(0),
        reason: row.get(1),
        sample_error: row.get(2),
        next_probe_at: row.get(3),
        probe_interval_ms: row.get(4),
    }
}

impl PostgresLedger {
    pub(super) async fn read_hold(&self) -> Result<Option<Hold>, StorageError> {
        let rows = self.query(&hold_sql(), &[]).await?;
        Ok(rows.first().map(from_row))
    }

    pub(super) async fn insert_hold(&self, hold: &Hold) -> Result<bool, StorageError> {
        let opened = self
            .execute(
                &open_hold_sql(Dialect::Postgres),
                &[
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

    pub(super) async fn update_probe(
        &self,
        since: i64,
        from: i64,
        to: i64,
        interval_ms: i64,
    ) -> Result<bool, StorageError> {
        let sql = move_probe_sql(Dialect::Postgres);
        Ok(self
            .execute(&sql, &[&since, &from, &to, &interval_ms])
            .await?
            == 1)
    }

    pub(super) async fn delete_hold(&self, since: i64) -> Result<Option<Hold>, StorageError> {
        let rows = self
            .query(&end_hold_sql(Dialect::Postgres), &[&since])
            .await?;
        Ok(rows.first().map(from_row))
    }
}
