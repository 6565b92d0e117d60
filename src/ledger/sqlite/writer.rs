//! The single writer thread: every change to the ledger, batched into group commits.
//!
//! Callers queue closures; the thread takes everything queued (up to `max_batch`), runs it inside
//! one `BEGIN IMMEDIATE ... COMMIT`, and only then answers each caller. One fsync thus covers a
//! whole burst of concurrent claims, and no caller hears "ok" before its change is durable.
//!
//! The queue is bounded. A claim that finds it full fails at once ([`StorageError::Overloaded`],
//! so the delivery gets a 503 and Sume retries) instead of waiting behind a stalled disk; the
//! service's own changes (attempt starts and ends, retention) wait for room instead.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::super::jobs::insert_claim;
use super::super::{now_ms, ClaimOutcome, NewClaim, StorageError};
use crate::throttle::Throttled;

/// Changes waiting for the writer. Past this, claims are refused at once (see the module doc).
/// Far more than the connection limit lets in at a time, far less than a stalled disk would
/// otherwise pile up.
pub const QUEUE_CAPACITY: usize = 1024;

/// Sends a caller its result once the outcome of the whole transaction is known.
type Completion = Box<dyn FnOnce(Result<(), StorageError>) + Send>;
/// Runs one caller's change inside the open transaction (`None` when it could not run: the
/// transaction did not begin, or SQLite already rolled it back).
type BatchItem = Box<dyn FnOnce(Option<&Connection>) -> Completion + Send>;

pub(super) struct Writer {
    queue: mpsc::Sender<BatchItem>,
    stopping: Arc<AtomicBool>,
    /// Whether the last batch that changed anything (or failed) committed.
    last_commit_ok: Arc<AtomicBool>,
    /// Cancelled when the thread died of a panic: nothing will ever be written again.
    failed: CancellationToken,
}

impl Writer {
    pub(super) fn start(
        conn: Connection,
        max_batch: usize,
    ) -> anyhow::Result<(Writer, std::thread::JoinHandle<()>)> {
        let (queue, inbox) = mpsc::channel(QUEUE_CAPACITY);
        let stopping = Arc::new(AtomicBool::new(false));
        let last_commit_ok = Arc::new(AtomicBool::new(true));
        let failed = CancellationToken::new();
        let thread = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn({
                let (stopping, last_commit_ok, failed) =
                    (stopping.clone(), last_commit_ok.clone(), failed.clone());
                move || {
                    let state = Shared {
                        stopping: &stopping,
                        last_commit_ok: &last_commit_ok,
                    };
                    let run = AssertUnwindSafe(|| run(conn, inbox, max_batch, state));
                    if std::panic::catch_unwind(run).is_err() {
                        tracing::error!("the ledger writer thread panicked; no change can be committed any more");
                        failed.cancel();
                    }
                }
            })?;
        Ok((
            Writer {
                queue,
                stopping,
                last_commit_ok,
                failed,
            },
            thread,
        ))
    }

    /// Queues `op`, waiting for room if the queue is full.
    pub(super) async fn submit<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let (item, answer) = batch_item(op, Isolation::Savepoint);
        self.queue
            .send(item)
            .await
            .map_err(|_| StorageError::Closed)?;
        answer.await.map_err(|_| StorageError::Closed)?
    }

    /// Queues a claim only if there is room now; [`StorageError::Overloaded`] otherwise.
    pub(super) async fn try_claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError> {
        let (item, answer) = claim_item(claim);
        self.queue.try_send(item).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => StorageError::Overloaded,
            mpsc::error::TrySendError::Closed(_) => StorageError::Closed,
        })?;
        answer.await.map_err(|_| StorageError::Closed)?
    }

    /// How many changes wait for the writer right now.
    pub(super) fn queued(&self) -> usize {
        QUEUE_CAPACITY - self.queue.capacity()
    }

    pub(super) fn failed(&self) -> &CancellationToken {
        &self.failed
    }

    pub(super) fn last_commit_ok(&self) -> bool {
        self.last_commit_ok.load(Ordering::Relaxed)
    }

    /// Asks the thread to stop once everything queued so far is committed.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes a thread waiting for work. A full queue needs no wake-up: the thread checks
        // the flag after each batch.
        let _ = self.queue.try_send(Box::new(|_| Box::new(|_| ())));
    }
}

/// How one caller's change is kept from undoing the others in its batch when it fails.
#[derive(Clone, Copy)]
enum Isolation {
    /// Several statements: a savepoint undoes only this caller's on failure.
    Savepoint,
    /// One statement, which SQLite already applies all or nothing: a savepoint would only cost
    /// time (a claim is one `INSERT ... ON CONFLICT DO NOTHING`).
    SingleStatement,
}

fn batch_item<T, F>(
    op: F,
    isolation: Isolation,
) -> (BatchItem, oneshot::Receiver<Result<T, StorageError>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let item: BatchItem = Box::new(move |conn| {
        let result = conn.map(|conn| match isolation {
            Isolation::Savepoint => run_in_savepoint(conn, op),
            Isolation::SingleStatement => op(conn).map_err(StorageError::from),
        });
        Box::new(move |committed| {
            let outcome = match (committed, result) {
                (Ok(()), Some(result)) => result,
                (Err(error), _) => Err(error),
                (Ok(()), None) => unreachable!("a batch that did not run cannot commit"),
            };
            let _ = reply.send(outcome);
        })
    });
    (item, answer)
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
            // If SQLite already rolled the whole transaction back (disk full, I/O error), this
            // fails too; commit_batch sees it and fails the rest of the batch.
            let _ = conn.execute_batch("ROLLBACK TO item; RELEASE item");
            Err(error.into())
        }
    }
}

/// A claim as a batch item: one `INSERT ... ON CONFLICT DO NOTHING`, so no savepoint.
fn claim_item(
    claim: NewClaim,
) -> (
    BatchItem,
    oneshot::Receiver<Result<ClaimOutcome, StorageError>>,
) {
    batch_item(
        move |conn| insert_claim(conn, &claim, now_ms()),
        Isolation::SingleStatement,
    )
}

/// Commits `claims` as the writer thread would commit them had they arrived together.
pub(super) fn commit_claims(
    conn: &Connection,
    claims: Vec<NewClaim>,
) -> Result<Vec<ClaimOutcome>, StorageError> {
    let (items, answers): (Vec<_>, Vec<_>) = claims.into_iter().map(claim_item).unzip();
    commit_batch(
        conn,
        items.into_iter(),
        &mut Throttled::new("claims failed"),
    );
    answers
        .into_iter()
        .map(|mut answer| answer.try_recv().map_err(|_| StorageError::Closed)?)
        .collect()
}

/// What the writer thread shares with the [`Writer`] handle.
#[derive(Clone, Copy)]
struct Shared<'a> {
    stopping: &'a AtomicBool,
    last_commit_ok: &'a AtomicBool,
}

fn run(conn: Connection, mut inbox: mpsc::Receiver<BatchItem>, max_batch: usize, shared: Shared) {
    let mut batch = Vec::with_capacity(max_batch);
    let mut failures = Throttled::new("ledger transaction failed");
    let mut commit = |batch: &mut Vec<BatchItem>| {
        let changes_before = conn.total_changes();
        let committed = commit_batch(&conn, batch.drain(..), &mut failures);
        // A batch that changed nothing (the watchdog's probe) says nothing about the disk.
        if !committed || conn.total_changes() != changes_before {
            shared.last_commit_ok.store(committed, Ordering::Relaxed);
        }
    };
    while !shared.stopping.load(Ordering::SeqCst) {
        let Some(item) = inbox.blocking_recv() else {
            break;
        };
        batch.push(item);
        while batch.len() < max_batch {
            match inbox.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        commit(&mut batch);
    }
    // Stopping: everything queued before the stop still gets its answer.
    inbox.close();
    while let Ok(item) = inbox.try_recv() {
        batch.push(item);
        if batch.len() == max_batch {
            commit(&mut batch);
        }
    }
    if !batch.is_empty() {
        commit(&mut batch);
    }
    tracing::debug!("ledger writer stopped");
}

/// Runs and commits one batch, then answers its callers; `true` if it committed.
fn commit_batch(
    conn: &Connection,
    batch: impl ExactSizeIterator<Item = BatchItem>,
    failures: &mut Throttled,
) -> bool {
    let size = batch.len();
    let begin = conn
        .prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut s| s.execute([]));
    let (completions, committed) = match begin {
        Ok(_) => {
            let mut completions: Vec<Completion> = Vec::with_capacity(size);
            for item in batch {
                // After an error SQLite may have rolled the whole transaction back on its own
                // (SQLITE_FULL, SQLITE_IOERR). The next item's SAVEPOINT would then open a
                // transaction of its own and its RELEASE commit it, while the batch is reported
                // as failed: so once we are out of the transaction, nothing else runs.
                let in_transaction = !conn.is_autocommit();
                completions.push(item(in_transaction.then_some(conn)));
            }
            let committed = if conn.is_autocommit() {
                Err(StorageError::Sqlite(
                    "the transaction was rolled back by SQLite after an error".into(),
                ))
            } else {
                let committed = conn
                    .prepare_cached("COMMIT")
                    .and_then(|mut s| s.execute([]))
                    .map(drop)
                    .map_err(StorageError::from);
                if committed.is_err() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                committed
            };
            (completions, committed)
        }
        Err(error) => (
            batch.map(|item| item(None)).collect::<Vec<_>>(),
            Err(error.into()),
        ),
    };
    match &committed {
        Err(error) => failures.warn(&format!("{error} (batch of {size})")),
        Ok(()) => failures.recovered(),
    }
    crate::metrics::METRICS.record_commit(size, committed.is_ok());
    let ok = committed.is_ok();
    for complete in completions {
        complete(committed.clone());
    }
    ok
}
