//! What tests reach of the SQLite ledger's insides: its reads and writes as the service runs them.

use std::time::Duration;

use rusqlite::Connection;

use super::SqliteLedger;
use crate::ledger::error::StorageError;

impl SqliteLedger {
    /// Runs a read as the service's reads run (the reader pool, the time budget).
    pub async fn read_for_test<T, F>(&self, budget: Duration, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let ms = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
        self.read_budget_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
        self.read(op).await
    }

    /// Runs any change on the writer, as part of a group commit: for tests of the writer
    /// itself (a failing statement in a batch, the queue's bound).
    pub async fn write_for_test<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.write(op).await
    }
}
