//! The ledger's one-way switch from healthy to failed: from then on nothing is acknowledged.

use std::sync::OnceLock;

use tokio_util::sync::CancellationToken;

use crate::ledger::error::StorageError;

/// Why the ledger failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A thread of the ledger panicked. What SQLite wrote is as it left it: a restart recovers.
    Panicked,
    /// The disk failed a sync, a checkpoint or a commit. Linux may have dropped the pages it
    /// could not write while still serving them from its cache, so even a restarted process
    /// would read (and answer "duplicate" on) rows the disk does not hold, until a reboot.
    StorageLost,
    /// The damage check found the ledger damaged (integrity.rs).
    Damaged,
}

/// Shared by the writer, the WAL syncer and the checkpointer; set once, never cleared.
#[derive(Default)]
pub(super) struct Failure {
    reason: OnceLock<(Cause, String)>,
    token: CancellationToken,
}

impl Failure {
    /// Records the first failure (later ones only add a log line) and wakes whoever waits.
    pub(super) fn fail(&self, cause: Cause, reason: String) {
        tracing::error!(
            cause = ?cause,
            error = %reason,
            "the ledger failed: no change can be acknowledged any more; stopping"
        );
        let _ = self.reason.set((cause, reason));
        self.token.cancel();
    }

    /// `Ok` while healthy; the first failure's reason after.
    pub(super) fn check(&self) -> Result<(), StorageError> {
        match self.reason.get() {
            None => Ok(()),
            Some((_, reason)) => Err(StorageError::Failed(crate::ledger::error::Cause::message(
                reason.clone(),
            ))),
        }
    }

    pub(super) fn cause(&self) -> Option<Cause> {
        self.reason.get().map(|(cause, _)| *cause)
    }

    pub(super) fn is_failed(&self) -> bool {
        self.reason.get().is_some()
    }

    pub(super) async fn failed(&self) {
        self.token.cancelled().await
    }
}

/// Whether a SQLite error is the disk failing (any `SQLITE_IOERR_*`), not a busy file or a
/// full disk, which are retried.
pub(super) fn is_storage_lost(error: &rusqlite::Error) -> bool {
    error.sqlite_error_code() == Some(rusqlite::ErrorCode::SystemIoFailure)
}
