//! `WriterAlone`: the SQLite claim path with nothing in front, for the benchmark's storage floor.

use std::sync::Arc;

use rusqlite::{Connection, OpenFlags};

use super::checkpoint::{CheckpointWake, Checkpointer};
use super::failure::Failure;
use super::open::{open_connection, open_for_writing};
use super::wal_sync::Answerer;
use super::writer::{self, Answering};
use crate::config::SqliteConfig;
use crate::ledger::error::StorageError;
use crate::ledger::model::{ClaimOutcome, NewClaim};

/// The ledger's writer connection, WAL syncer and checkpointer with no queue, no runtime and no
/// HTTP in front: batches of claims go straight through the writer's commit on the caller's
/// thread. The limit the request path is measured against (`loadgen --sqlite-alone`).
pub struct WriterAlone {
    conn: Connection,
    answering: Option<Answering>,
    checkpointer: Option<Checkpointer>,
    /// Wakes the checkpointer after each batch, as the writer thread does.
    checkpoint_wake: CheckpointWake,
}

/// The claims of one committed batch, answered once durable.
pub struct PendingClaims(Vec<tokio::sync::oneshot::Receiver<Result<ClaimOutcome, StorageError>>>);

impl PendingClaims {
    /// Blocks until every claim of the batch is answered.
    pub fn wait(self) -> Result<Vec<ClaimOutcome>, StorageError> {
        self.0
            .into_iter()
            .map(|answer| answer.blocking_recv().map_err(|_| StorageError::Closed)?)
            .collect()
    }
}

impl WriterAlone {
    /// Opens the ledger as the service does (checks, migrations, the writer's settings).
    pub fn open(config: &SqliteConfig) -> anyhow::Result<WriterAlone> {
        let (conn, durability) = open_for_writing(config)?;
        let failure = Arc::new(Failure::default());
        let answering = Answering::start(durability, failure.clone(), Answerer::inline())?;
        let checkpointer = Checkpointer::start(
            open_connection(&config.path, config, OpenFlags::default())?,
            failure,
        )?;
        Ok(WriterAlone {
            conn,
            answering: Some(answering),
            checkpoint_wake: checkpointer.wake(),
            checkpointer: Some(checkpointer),
        })
    }

    /// Commits `claims` in one transaction, as the writer thread does with claims that arrived
    /// together; the next batch may be committed before this one is answered.
    pub fn claim(&self, claims: Vec<NewClaim>) -> PendingClaims {
        let answering = self.answering.as_ref().expect("only taken on drop");
        let pending = PendingClaims(writer::commit_claims(&self.conn, claims, answering));
        self.checkpoint_wake.committed();
        pending
    }
}

impl Drop for WriterAlone {
    fn drop(&mut self) {
        if let Some(answering) = self.answering.take() {
            answering.finish();
        }
        if let Some(checkpointer) = self.checkpointer.take() {
            checkpointer.stop();
        }
    }
}
