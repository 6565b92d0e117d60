//! Expected jobs in PostgreSQL: the polls of reconciliation, handed to one receiver at a time.
//! Each function is the contract operation of its name.

use std::time::Duration;

use super::{sql, PostgresLedger};
use crate::ledger::error::StorageError;
use crate::ledger::model::{duration_ms, DueExpectation, Expectation, PollResult};

/// Takes due expectations and moves their next poll `lease` ahead, so that no other
/// receiver polls them meanwhile (and one does, if this receiver dies before recording).
pub(super) async fn due_expectations(
    ledger: &PostgresLedger,
    now: i64,
    limit: usize,
    lease: Duration,
) -> Result<Vec<DueExpectation>, StorageError> {
    let leased_until = now + duration_ms(lease);
    let rows = ledger
        .query(
            sql::TAKE_DUE_EXPECTATIONS_SQL,
            &[&now, &(limit as i64), &leased_until],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| DueExpectation {
            job_id: row.get(0),
            expected_at: row.get(1),
            polls: row.get::<_, i32>(2).unsigned_abs(),
        })
        .collect())
}

pub(super) async fn record_poll(
    ledger: &PostgresLedger,
    job_id: &str,
    result: &PollResult,
    now: i64,
) -> Result<(), StorageError> {
    let (state, status, error, next_poll_at, resolved_at) = result.columns(now);
    ledger
        .execute(
            sql::RECORD_POLL_SQL,
            &[
                &job_id,
                &state,
                &status,
                &error,
                &next_poll_at,
                &resolved_at,
            ],
        )
        .await
        .map(drop)
}

pub(super) async fn list_expectations(
    ledger: &PostgresLedger,
    limit: usize,
) -> Result<Vec<Expectation>, StorageError> {
    let rows = ledger
        .read(sql::LIST_EXPECTATIONS_SQL, &[&(limit as i64)])
        .await?;
    Ok(rows
        .iter()
        .map(|row| Expectation {
            job_id: row.get(0),
            state: row.get(1),
            expected_at: row.get(2),
            next_poll_at: row.get(3),
            polls: row.get::<_, i32>(4).unsigned_abs(),
            last_status: row.get(5),
            last_error: row.get(6),
        })
        .collect())
}
