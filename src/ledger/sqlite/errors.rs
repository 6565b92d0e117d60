//! SQLite's errors as the ledger's: a failed statement or pool is a change not taken.

use crate::ledger::error::{Cause, StorageError};
use crate::ledger::model::RetryError;

impl From<rusqlite::Error> for StorageError {
    fn from(error: rusqlite::Error) -> Self {
        StorageError::Unavailable(Cause::new(error))
    }
}

impl From<rusqlite::Error> for RetryError {
    fn from(error: rusqlite::Error) -> Self {
        RetryError::Storage(error.into())
    }
}

impl From<r2d2::Error> for StorageError {
    fn from(error: r2d2::Error) -> Self {
        StorageError::Unavailable(Cause::new(error))
    }
}
