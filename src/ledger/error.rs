//! How ledger operations fail, and the failure that stops the service for good.

use std::sync::Arc;

/// Why a ledger operation failed, by what the caller should do about it. Cheap to clone: one
/// failed group commit fails every waiter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StorageError {
    /// The database did not take the change (locked, unreachable, an error): nothing was
    /// written; try again later (a delivery: 503, and Sume retries).
    #[error("the ledger did not take the change: {0}")]
    Unavailable(Cause),
    /// Too many changes wait already: refused at once instead of queued; try again later.
    #[error("the ledger's queue is full")]
    Overloaded,
    /// The change may or may not be durable (the connection broke after the commit was sent,
    /// or the wait for a synchronous standby was cancelled): answer it as a failure, and a
    /// retry finds the row if it is there.
    #[error("the outcome of the commit is unknown: {0}")]
    OutcomeUnknown(Cause),
    /// The ledger failed for good (the disk, a thread): nothing more will be written, and the
    /// service stops.
    #[error("the ledger failed: {0}")]
    Failed(Cause),
    /// The ledger is closed: nothing more will be written.
    #[error("the ledger is closed")]
    Closed,
}

/// The error beneath a [`StorageError`], shared by every clone.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause(Arc::new(error))
    }

    /// A cause that is only a message.
    pub fn message(text: impl Into<String>) -> Cause {
        let error: Box<dyn std::error::Error + Send + Sync> = text.into().into();
        Cause(error.into())
    }
}

/// The error and its sources (drivers put the server's message in a source).
impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Equal when they say the same (for tests that compare outcomes).
impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        self.to_string() == other.to_string()
    }
}

/// The ledger stopped because the disk failed a write, a sync or a checkpoint. Linux may have
/// dropped the pages it could not write while it still serves them from its cache, so a process
/// started again in this boot could read, and answer "duplicate" for, jobs the disk does not
/// hold. The service exits with [`STORAGE_LOST_EXIT_STATUS`], which the unit never restarts.
#[derive(Debug, thiserror::Error)]
#[error(
    "the disk failed under the ledger {location}: reboot before starting the service again (a \
     start in this boot would trust the page cache), check the disk (dmesg, smartctl), and \
     restore the ledger from a backup if the start's check finds it damaged"
)]
pub struct StorageLost {
    pub location: String,
}

/// The exit status after [`StorageLost`] (EX_IOERR); the unit lists it in
/// `RestartPreventExitStatus=`.
pub const STORAGE_LOST_EXIT_STATUS: u8 = 74;

/// The ledger failed its damage check; the message says how to recover.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LedgerDamaged(pub String);

/// The exit status after the check found the ledger damaged (EX_DATAERR); the unit lists it in
/// `RestartPreventExitStatus=`: a restart would only find the damage again.
pub const DAMAGED_EXIT_STATUS: u8 = 65;

/// The exit status the process ends with after `error`: one the unit never restarts for the
/// two fatal ledger errors above, `None` for any other (a plain failure, which it restarts).
pub fn fatal_exit_status(error: &anyhow::Error) -> Option<u8> {
    if error.downcast_ref::<StorageLost>().is_some() {
        Some(STORAGE_LOST_EXIT_STATUS)
    } else if error.downcast_ref::<LedgerDamaged>().is_some() {
        Some(DAMAGED_EXIT_STATUS)
    } else {
        None
    }
}
