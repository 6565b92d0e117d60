//! The ledger's statements: changes on the pool that writes (their failures are the work
//! side's), reads on the readers' pool, and rows into the model's types.

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::pooled::{run_on, Rerun, RunError};
use super::{sql, PostgresLedger};
use crate::ledger::error::StorageError;
use crate::ledger::model::{ActionRecord, Attempt, AttemptRecord, JobSummary, HISTORY_PER_JOB};

impl PostgresLedger {
    /// Runs a statement on the pool that writes; returns its rows.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StorageError> {
        let rows = run_on!(&self.pool, Rerun::Unsafe, |client| {
            let statement = client.prepare_cached(sql).await?;
            client.query(&statement, params).await
        });
        self.record_work(rows)
    }

    /// Runs a statement on the pool that writes; returns how many rows it changed.
    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<usize, StorageError> {
        let changed = run_on!(&self.pool, Rerun::Unsafe, |client| {
            let statement = client.prepare_cached(sql).await?;
            client.execute(&statement, params).await
        });
        self.record_work(changed).map(|changed| changed as usize)
    }

    /// The outcome of a statement on the pool that writes, told to the work side's state.
    fn record_work<T>(&self, result: Result<T, RunError>) -> Result<T, StorageError> {
        let result = result.map_err(RunError::into_storage);
        if let Some(work_side) = &self.work_side {
            work_side.record(result.as_ref().err().map(|error| error as _));
        }
        result
    }

    /// Runs a read on a reader connection: read-only, cut by the server past its budget.
    pub(super) async fn read(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StorageError> {
        run_on!(&self.readers, Rerun::Safe, |client| {
            let statement = client.prepare_cached(sql).await?;
            client.query(&statement, params).await
        })
        .map_err(RunError::into_storage)
    }

    /// Runs a read as the service's reads run (the readers' pool and budget).
    #[cfg(feature = "testing")]
    pub async fn read_for_test(&self, sql: &str) -> Result<Vec<Row>, StorageError> {
        self.read(sql, &[]).await
    }

    /// Runs a statement whose one row holds a count (of the rows its CTE changed).
    pub(super) async fn count(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<i64, StorageError> {
        let rows = self.query(sql, params).await?;
        Ok(rows.first().map_or(0, |row| row.get(0)))
    }

    /// Keeps the newest [`HISTORY_PER_JOB`] actions of each job.
    pub(super) async fn trim_actions(&self, job_ids: &[&str]) -> Result<(), StorageError> {
        self.execute(sql::TRIM_ACTIONS_SQL, &[&job_ids, &HISTORY_PER_JOB])
            .await
            .map(drop)
    }
}

pub(super) fn attempt_number(attempt: &Attempt) -> i32 {
    i32::try_from(attempt.number).unwrap_or(i32::MAX)
}

/// (state, count) rows of a `GROUP BY state` count.
pub(super) fn count_rows(rows: &[Row]) -> Vec<(String, i64)> {
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

pub(super) fn summary_from_row(row: &Row) -> JobSummary {
    JobSummary {
        job_id: row.get(0),
        state: row.get(1),
        source: row.get(2),
        event_type: row.get(3),
        attempts: row.get::<_, i32>(4).unsigned_abs(),
        received_at: row.get(5),
        next_attempt_at: row.get(6),
        finished_at: row.get(7),
        last_error: row.get(8),
    }
}

/// A row of [`sql::ATTEMPTS_OF_JOB_SQL`].
pub(super) fn attempt_record_from_row(row: &Row) -> AttemptRecord {
    AttemptRecord {
        route: row.get(0),
        number: row.get::<_, i32>(1).unsigned_abs(),
        cause: row.get(2),
        receiver: row.get(3),
        started_at: row.get(4),
        ended_at: row.get(5),
        outcome: row.get(6),
        exit_status: row.get(7),
        http_status: row
            .get::<_, Option<i32>>(8)
            .and_then(|status| u16::try_from(status).ok()),
        error: row.get(9),
    }
}

/// A row of [`sql::ACTIONS_OF_JOB_SQL`].
pub(super) fn action_from_row(row: &Row) -> ActionRecord {
    ActionRecord {
        at: row.get(0),
        action: row.get(1),
        actor: row.get(2),
        reason: row.get(3),
    }
}
