//! The single writer thread: every change to the ledger, batched into group commits.
//!
//! Callers queue closures; the thread takes everything queued (up to `max_batch`), runs it inside
//! one `BEGIN IMMEDIATE ... COMMIT`, and only then answers each caller. One fsync thus covers a
//! whole burst of concurrent claims, and no caller hears "ok" before its change is durable.

use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::StorageError;

/// Sends a caller its result once the outcome of the whole transaction is known.
type Completion = Box<dyn FnOnce(Result<(), StorageError>) + Send>;
/// Runs one caller's change inside the open transaction (`None` when it could not begin).
type BatchItem = Box<dyn FnOnce(Option<&Connection>) -> Completion + Send>;

enum Message {
    Write(BatchItem),
    Stop,
}

pub(super) struct Writer {
    queue: mpsc::Sender<Message>,
}

impl Writer {
    pub(super) fn start(
        conn: Connection,
        max_batch: usize,
    ) -> anyhow::Result<(Writer, std::thread::JoinHandle<()>)> {
        let (queue, inbox) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || run(conn, inbox, max_batch))?;
        Ok((Writer { queue }, thread))
    }

    pub(super) async fn submit<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let item: BatchItem = Box::new(move |conn| {
            let result = conn.map(|conn| run_in_savepoint(conn, op));
            Box::new(move |committed| {
                let outcome = match (committed, result) {
                    (Ok(()), Some(result)) => result,
                    (Err(error), _) => Err(error),
                    (Ok(()), None) => unreachable!("a batch that did not begin cannot commit"),
                };
                let _ = reply.send(outcome);
            })
        });
        self.queue
            .send(Message::Write(item))
            .map_err(|_| StorageError::Closed)?;
        answer.await.map_err(|_| StorageError::Closed)?
    }

    pub(super) fn stop(&self) {
        let _ = self.queue.send(Message::Stop);
    }
}

/// Runs one caller's change so that its failure undoes only its own statements, not the batch.
fn run_in_savepoint<T>(
    conn: &Connection,
    op: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> Result<T, StorageError> {
    // Cached statements: parsing these per item would cost more than the item's own insert.
    conn.prepare_cached("SAVEPOINT item")?.execute([])?;
    match op(conn) {
        Ok(value) => {
            conn.prepare_cached("RELEASE item")?.execute([])?;
            Ok(value)
        }
        Err(error) => {
            // If SQLite already rolled the whole transaction back (disk full, I/O error), the
            // COMMIT fails too and every caller of the batch hears about it.
            let _ = conn.execute_batch("ROLLBACK TO item; RELEASE item");
            Err(error.into())
        }
    }
}

fn run(conn: Connection, inbox: mpsc::Receiver<Message>, max_batch: usize) {
    let mut batch = Vec::with_capacity(max_batch);
    let mut stopping = false;
    while !stopping {
        match inbox.recv() {
            Ok(Message::Write(item)) => batch.push(item),
            Ok(Message::Stop) | Err(_) => break,
        }
        while batch.len() < max_batch {
            match inbox.try_recv() {
                Ok(Message::Write(item)) => batch.push(item),
                Ok(Message::Stop) => {
                    stopping = true;
                    break;
                }
                Err(_) => break,
            }
        }
        commit_batch(&conn, batch.drain(..));
    }
    tracing::debug!("ledger writer stopped");
}

fn commit_batch(conn: &Connection, batch: impl ExactSizeIterator<Item = BatchItem>) {
    let size = batch.len();
    let begin = conn
        .prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut s| s.execute([]));
    let outcome = match begin {
        Ok(_) => {
            let completions: Vec<Completion> = batch.map(|item| item(Some(conn))).collect();
            let committed = conn
                .prepare_cached("COMMIT")
                .and_then(|mut s| s.execute([]))
                .map(drop)
                .map_err(StorageError::from);
            if committed.is_err() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            (completions, committed)
        }
        Err(error) => (batch.map(|item| item(None)).collect(), Err(error.into())),
    };
    let (completions, committed) = outcome;
    if let Err(error) = &committed {
        tracing::warn!(batch = size, %error, "ledger transaction failed");
    }
    crate::metrics::METRICS.record_commit(size, committed.is_ok());
    for complete in completions {
        complete(committed.clone());
    }
}
