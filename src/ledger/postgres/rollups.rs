//! The console's minutes in PostgreSQL (`minute_rollups`): each receiver's own rows, under its
//! lease name; the SQL shared with SQLite.

use tokio_postgres::types::ToSql;

use super::PostgresLedger;
use crate::ledger::error::StorageError;
use crate::ledger::portable_sql::Dialect;
use crate::ledger::rollups::{select_sql, upsert_sql, MinuteRollup};

impl PostgresLedger {
    pub(super) async fn upsert_rollup(&self, rollup: &MinuteRollup) -> Result<(), StorageError> {
        let values = rollup.values();
        let params: Vec<&(dyn ToSql + Sync)> =
            [&rollup.minute as &(dyn ToSql + Sync), &self.receiver]
                .into_iter()
                .chain(values.iter().map(|value| value as &(dyn ToSql + Sync)))
                .collect();
        self.execute(&upsert_sql(Dialect::Postgres), &params)
            .await
            .map(drop)
    }

    pub(super) async fn read_rollups(
        &self,
        minute: i64,
        limit: usize,
    ) -> Result<Vec<MinuteRollup>, StorageError> {
        let rows = self
            .read(
                &select_sql(Dialect::Postgres),
                &[&self.receiver, &minute, &(limit as i64)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| MinuteRollup::from_columns(|index| row.get(index)))
            .collect())
    }
}
