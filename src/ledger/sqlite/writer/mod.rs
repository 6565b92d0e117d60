//! The single writer thread: every change to the ledger, batched into group commits.
//!
//! Callers queue closures; the thread takes everything queued (up to `max_batch`), runs it inside
//! one `BEGIN IMMEDIATE ... COMMIT`, and answers each caller once that commit is durable: at once
//! when COMMIT itself synced, or after an fsync of the WAL (wal_sync.rs). This thread runs that
//! fsync itself, and what arrives meanwhile makes the next batch; on a slow disk or under a
//! backlog it hands the fsync to the WAL syncer's thread and commits the next batch meanwhile
//! ([`overlap_pays`]). One fsync thus covers a whole burst of concurrent claims, and no caller
//! hears "ok" before its change is durable.
//!
//! The queue is bounded. A claim that finds it full fails at once ([`StorageError::Overloaded`],
//! so the delivery gets a 503 and Sume retries) instead of waiting behind a stalled disk; the
//! service's own changes (attempt starts and ends, retention) wait for room instead, and take
//! at most [`OWN_CHANGES`] places of it however many handler slots the routes have: claims
//! always find the rest.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::failure::{self, Cause, Failure};
use super::jobs::insert_claim;
use super::wal_sync::{Answerer, ClaimReply, Completion, SyncWal, WalSyncer};
use super::write_lock::{is_busy, CommitState};
use crate::ledger::error::StorageError;
use crate::ledger::model::{now_ms, ClaimOutcome, NewClaim};
use crate::throttle::Throttled;

/// Changes waiting for the writer. Past this, claims are refused at once (see the module doc).
/// Far more than the connection limit lets in at a time, far less than a stalled disk would
/// otherwise pile up.
pub const QUEUE_CAPACITY: usize = 1024;
/// The most of the service's own changes queued or waiting for their commit at once. Each
/// handler slot may have two (its last job's end, its next job's start), so without this
/// bound routes of a few hundred slots between them could fill the queue and turn deliveries
/// away while their work waits for a slow disk.
pub const OWN_CHANGES: usize = QUEUE_CAPACITY / 2;

/// One caller's change, run inside the open transaction by [`commit_batch`] (twice, when a
/// change of its batch failed), then answered from its last run.
enum BatchItem {
    /// A claim, carried as data: no allocation of its own per delivery.
    Claim {
        claim: NewClaim,
        reply: ClaimReply,
        outcome: Option<Result<ClaimOutcome, StorageError>>,
    },
    Change(Box<dyn Change>),
}

/// Any other change: its statements, and the caller waiting for their result.
trait Change: Send {
    /// Runs the statements in the open transaction, in a savepoint of their own if `isolated`;
    /// whether they succeeded.
    fn run(&mut self, conn: &Connection, isolated: bool) -> bool;
    /// What answers the caller once the batch has committed or failed.
    fn completion(self: Box<Self>) -> Completion;
}

impl BatchItem {
    /// Runs the item in the open transaction; false if it failed and may have left part of its
    /// statements in the transaction (a change run without its savepoint).
    fn run(&mut self, conn: &Connection, isolated: bool) -> bool {
        match self {
            // Its statements (the job's row, then its work on each route) fail only as a whole:
            // a check refuses the job's row before it writes anything, and what fails midway
            // rolls back the whole transaction (`CLAIM_SQL` says why). A savepoint would only
            // cost time.
            BatchItem::Claim { claim, outcome, .. } => {
                *outcome = Some(insert_claim(conn, claim, now_ms()).map_err(StorageError::from));
                true
            }
            BatchItem::Change(change) => change.run(conn, isolated) || isolated,
        }
    }

    fn completion(self) -> Completion {
        match self {
            // `None`: the item never ran, so its batch did not commit, and the caller hears
            // why it did not: this error is never sent.
            BatchItem::Claim { reply, outcome, .. } => {
                Completion::Claim(reply, outcome.unwrap_or(Err(StorageError::Closed)))
            }
            BatchItem::Change(change) => change.completion(),
        }
    }
}

pub(super) struct Writer {
    queue: mpsc::Sender<BatchItem>,
    /// [`OWN_CHANGES`] places, each held by a change from its queueing to its answer.
    own_changes: Arc<tokio::sync::Semaphore>,
    stopping: Arc<AtomicBool>,
    /// Whether the last batch that changed anything (or failed) committed, and the lock.
    commits: Arc<CommitState>,
    /// Set when the thread died of a panic or the disk failed: nothing will ever be
    /// acknowledged again.
    failure: Arc<Failure>,
}

/// When a committed batch's callers may be told it is durable.
pub(super) enum Durability {
    /// When COMMIT returns: it synced as far as `synchronous` asks.
    AtCommit,
    /// After this sync of the WAL, on a thread of its own; the connection does not sync at
    /// commit (`PRAGMA synchronous = NORMAL`).
    AfterWalSync(SyncWal),
}

impl Writer {
    /// `after_write` runs on the writer's thread after each commit that changed rows.
    pub(super) fn start(
        conn: Connection,
        max_batch: usize,
        durability: Durability,
        failure: Arc<Failure>,
        after_write: impl Fn() + Send + 'static,
    ) -> anyhow::Result<(Writer, std::thread::JoinHandle<()>)> {
        let (queue, inbox) = mpsc::channel(QUEUE_CAPACITY);
        let stopping = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(CommitState::of(&conn)?);
        let syncer = Answering::start(durability, failure.clone(), Answerer::on_current_runtime())?;
        let thread = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn({
                let (stopping, commits, failure) =
                    (stopping.clone(), commits.clone(), failure.clone());
                move || {
                    let state = Shared {
                        stopping: &stopping,
                        commits: &commits,
                        after_write: &after_write,
                    };
                    let run = AssertUnwindSafe(|| run(conn, inbox, max_batch, state, syncer));
                    if std::panic::catch_unwind(run).is_err() {
                        failure.fail(Cause::Panicked, "the ledger writer thread panicked".into());
                    }
                }
            })?;
        Ok((
            Writer {
                queue,
                own_changes: Arc::new(tokio::sync::Semaphore::new(OWN_CHANGES)),
                stopping,
                commits,
                failure,
            },
            thread,
        ))
    }

    /// Queues `op`, waiting for room if the queue is full. `op` may run twice: see
    /// [`commit_batch`].
    pub(super) async fn submit<T, F>(&self, op: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let _place = self
            .own_changes
            .acquire()
            .await
            .map_err(|_| StorageError::Closed)?;
        let (item, answer) = change_item(op);
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

    pub(super) fn failure(&self) -> &Failure {
        &self.failure
    }

    pub(super) fn commits(&self) -> &CommitState {
        &self.commits
    }

    /// Asks the thread to stop once everything queued so far is committed.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes a thread waiting for work. A full queue needs no wake-up: the thread checks
        // the flag after each batch.
        let (wake, _) = change_item(|_| Ok(()));
        let _ = self.queue.try_send(wake);
    }
}

/// A change of several statements as a batch item.
fn change_item<T, F>(op: F) -> (BatchItem, oneshot::Receiver<Result<T, StorageError>>)
where
    T: Send + 'static,
    F: Fn(&Connection) -> rusqlite::Result<T> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let change = Statements {
        op,
        result: None,
        reply,
    };
    (BatchItem::Change(Box::new(change)), answer)
}

/// A [`Change`]: `op`, the result of its last run, and its caller.
struct Statements<T, F> {
    op: F,
    result: Option<Result<T, StorageError>>,
    reply: oneshot::Sender<Result<T, StorageError>>,
}

impl<T, F> Change for Statements<T, F>
where
    T: Send + 'static,
    F: Fn(&Connection) -> rusqlite::Result<T> + Send,
{
    fn run(&mut self, conn: &Connection, isolated: bool) -> bool {
        let result = if isolated {
            run_in_savepoint(conn, &self.op)
        } else {
            (self.op)(conn).map_err(StorageError::from)
        };
        let succeeded = result.is_ok();
        self.result = Some(result);
        succeeded
    }

    fn completion(self: Box<Self>) -> Completion {
        let Statements { result, reply, .. } = *self;
        Completion::Change(Box::new(move |committed| {
            let outcome = match (committed, result) {
                (Ok(()), Some(result)) => result,
                (Err(error), _) => Err(error),
                (Ok(()), None) => unreachable!("a batch that did not run cannot commit"),
            };
            let _ = reply.send(outcome);
        }))
    }
}

/// Runs one caller's change so that its failure undoes only its own statements, not the batch.
fn run_in_savepoint<T>(
    conn: &Connection,
    op: impl Fn(&Connection) -> rusqlite::Result<T>,
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
            // fails too; run_batch sees it and fails the rest of the batch.
            let _ = conn.execute_batch("ROLLBACK TO item; RELEASE item");
            Err(error.into())
        }
    }
}

/// A claim as a batch item, and where its outcome will come.
fn claim_item(
    claim: NewClaim,
) -> (
    BatchItem,
    oneshot::Receiver<Result<ClaimOutcome, StorageError>>,
) {
    let (reply, answer) = oneshot::channel();
    let item = BatchItem::Claim {
        claim,
        reply,
        outcome: None,
    };
    (item, answer)
}

/// Answers committed batches: at once, or after a sync of the WAL (on the committing thread or
/// the WAL syncer's) when there is one to make; never "ok" once the ledger failed.
pub(super) struct Answering {
    syncer: Option<WalSyncer>,
    answerer: Answerer,
    failure: Arc<Failure>,
}

impl Answering {
    /// Starts the WAL syncer if `durability` asks for one; a failed sync fails `failure`.
    pub(super) fn start(
        durability: Durability,
        failure: Arc<Failure>,
        answerer: Answerer,
    ) -> std::io::Result<Answering> {
        let syncer = match durability {
            Durability::AtCommit => None,
            Durability::AfterWalSync(sync) => {
                Some(WalSyncer::start(sync, failure.clone(), answerer.clone())?)
            }
        };
        Ok(Answering {
            syncer,
            answerer,
            failure,
        })
    }

    /// Answers a settled batch once it is durable. `overlap`: its sync runs on the syncer's
    /// thread while this one commits the next batch ([`overlap_pays`]); otherwise here, now.
    fn answer(&self, batch: Settled, overlap: bool) {
        match (&self.syncer, batch.outcome.and(self.failure.check())) {
            (Some(syncer), Ok(())) if batch.wrote && !overlap => {
                syncer.answer_after_syncing_here(batch.completions)
            }
            (Some(syncer), Ok(())) => syncer.answer_when_durable(batch.completions, batch.wrote),
            // A failed batch left nothing to make durable.
            (_, outcome) => self.answerer.answer(batch.completions, outcome),
        }
    }

    /// [`overlap_pays`] for the batch just committed (`batches`: its size and the one before's),
    /// with `queued` changes waiting.
    fn overlap_pays(&self, queued: usize, batches: (usize, usize)) -> bool {
        self.syncer
            .as_ref()
            .is_some_and(|syncer| overlap_pays(queued, batches, syncer.typical_sync()))
    }

    /// Answers everything committed so far.
    pub(super) fn finish(self) {
        if let Some(syncer) = self.syncer {
            syncer.finish();
        }
    }
}

/// A sync that typically takes this long is a slow disk's: this VM's take 0.3-0.4 ms, many
/// cloud volumes 1-2 ms.
const SLOW_SYNC: Duration = Duration::from_micros(600);

/// Whether the writer should hand a committed batch's sync to the syncer thread and commit the
/// next batch meanwhile, rather than sync it itself. Handing over costs each thread a wake-up
/// per batch (tens of microseconds of latency and CPU on a VM) and makes batches smaller; it
/// pays where it hides something longer: a slow disk's syncs, or a backlog (at least as many
/// changes queued as the batch just committed and the one before had: claims coming faster
/// than they commit, as in the benchmark's storage floor). Measured at C = 64
/// (bench/slow-fsync.c for the slower disks), syncing here against handing over: syncs of
/// 0.4 ms, +11 % deliveries/s and -11 % CPU per delivery; 0.75 ms, -14 %; 1.3 ms, -12 %;
/// 2.3 ms, -8 %.
fn overlap_pays(queued: usize, batches: (usize, usize), typical_sync: Duration) -> bool {
    typical_sync >= SLOW_SYNC || queued >= batches.0.max(batches.1)
}

/// The callers of `claims`, committed as the writer thread would commit them had they arrived
/// together with as many more behind them, waiting for their answers.
#[cfg(feature = "bench")]
pub(super) fn commit_claims(
    conn: &Connection,
    claims: Vec<NewClaim>,
    answering: &Answering,
) -> Vec<oneshot::Receiver<Result<ClaimOutcome, StorageError>>> {
    let (items, answers): (Vec<_>, Vec<_>) = claims.into_iter().map(claim_item).unzip();
    let batch = items.len();
    let settled = commit_batch(
        conn,
        items.into_iter(),
        &mut Throttled::new("claims failed"),
        &answering.failure,
    );
    answering.answer(settled, answering.overlap_pays(batch, (batch, batch)));
    answers
}

/// What the writer thread shares with the [`Writer`] handle.
#[derive(Clone, Copy)]
struct Shared<'a> {
    stopping: &'a AtomicBool,
    commits: &'a CommitState,
    after_write: &'a dyn Fn(),
}

fn run(
    conn: Connection,
    mut inbox: mpsc::Receiver<BatchItem>,
    max_batch: usize,
    shared: Shared,
    answering: Answering,
) {
    let mut batch = Vec::with_capacity(max_batch);
    let mut failures = Throttled::new("ledger transaction failed");
    let mut last_batch = 0;
    let mut commit = |batch: &mut Vec<BatchItem>, inbox: &mpsc::Receiver<BatchItem>| {
        let size = batch.len();
        let settled = commit_batch(&conn, batch.drain(..), &mut failures, &answering.failure);
        let committed = settled.outcome.is_ok();
        // A batch that changed nothing (the watchdog's probe) says nothing about the disk.
        if !committed || settled.wrote {
            shared.commits.record(committed, settled.busy);
        }
        if committed && settled.wrote {
            (shared.after_write)();
        }
        let overlap = answering.overlap_pays(inbox.len(), (size, last_batch));
        last_batch = size;
        answering.answer(settled, overlap);
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
        commit(&mut batch, &inbox);
    }
    // Stopping: everything queued before the stop still gets its answer.
    inbox.close();
    while let Ok(item) = inbox.try_recv() {
        batch.push(item);
        if batch.len() == max_batch {
            commit(&mut batch, &inbox);
        }
    }
    if !batch.is_empty() {
        commit(&mut batch, &inbox);
    }
    answering.finish();
    tracing::debug!("ledger writer stopped");
}

/// A batch that committed or failed, with its callers still to be answered.
struct Settled {
    completions: Vec<Completion>,
    outcome: Result<(), StorageError>,
    /// Whether it changed any row.
    wrote: bool,
    /// Whether it failed for want of the write lock.
    busy: bool,
}

/// Runs and commits one batch. A COMMIT that fails with an I/O error (writing the WAL, or the
/// checkpoint the WAL hook runs after it) fails the ledger: see failure.rs.
///
/// The changes run bare first. In a savepoint each, SQLite copied every page a change wrote
/// that the batch had written before into the savepoint's journal, to undo that change alone:
/// 5 % of the CPU of a drain with an HTTP handler (perf, bench/work.sh). A change that fails
/// bare may leave part of its statements in the transaction, so then the batch is rolled back
/// and run again from its start, each change in its savepoint: the failure undoes only its own
/// statements, and the others commit. Every item's answer is its last run's.
fn commit_batch(
    conn: &Connection,
    batch: impl ExactSizeIterator<Item = BatchItem>,
    failures: &mut Throttled,
    failure: &Failure,
) -> Settled {
    let size = batch.len();
    let mut items: Vec<BatchItem> = batch.collect();
    let changes_before = conn.total_changes();
    let (mut outcome, mut busy) = run_batch(conn, &mut items, false, failure);
    if let Err(NotCommitted::ChangeFailedBare) = outcome {
        // Its caller hears its error; this says why the batch cost twice its usual work. The
        // lock is taken again for it: another process's write (the command line's) may come
        // in between, and this run then waits for it as any batch would.
        tracing::debug!(
            size,
            "a change failed: the batch runs again, a savepoint per change"
        );
        (outcome, busy) = run_batch(conn, &mut items, true, failure);
    }
    let committed = outcome.map_err(NotCommitted::into_error);
    match &committed {
        Err(error) => failures.warn(&format!("{error} (batch of {size})")),
        Ok(()) => failures.recovered(),
    }
    crate::metrics::METRICS.record_commit(size, committed.is_ok());
    Settled {
        completions: items.into_iter().map(BatchItem::completion).collect(),
        outcome: committed,
        wrote: conn.total_changes() != changes_before,
        busy,
    }
}

/// Why a run of a batch did not commit.
enum NotCommitted {
    /// A change failed in a run without savepoints; the transaction is rolled back.
    ChangeFailedBare,
    Failed(StorageError),
}

impl NotCommitted {
    /// What the batch's callers hear. A run with a savepoint per change goes on past a failed
    /// change, so only a bare run says `ChangeFailedBare`; a batch that ended there committed
    /// nothing.
    fn into_error(self) -> StorageError {
        match self {
            NotCommitted::Failed(error) => error,
            NotCommitted::ChangeFailedBare => StorageError::Unavailable(
                crate::ledger::error::Cause::message("a change of the batch failed"),
            ),
        }
    }
}

/// One run of a batch's items in a transaction of their own (in a savepoint each if
/// `isolated`), and its commit; whether it failed for want of the write lock.
fn run_batch(
    conn: &Connection,
    items: &mut [BatchItem],
    isolated: bool,
    failure: &Failure,
) -> (Result<(), NotCommitted>, bool) {
    let begin = conn
        .prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut s| s.execute([]));
    let busy = is_busy(&begin);
    if let Err(error) = begin {
        return (Err(NotCommitted::Failed(error.into())), busy);
    }
    for item in items.iter_mut() {
        // After an error SQLite may have rolled the whole transaction back on its own
        // (SQLITE_FULL, SQLITE_IOERR). The next item's statements would then each commit on
        // their own (or its SAVEPOINT open a transaction that its RELEASE commits), while the
        // batch is reported as failed: so once we are out of the transaction, nothing else
        // runs.
        if conn.is_autocommit() {
            break;
        }
        if !item.run(conn, isolated) && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
            return (Err(NotCommitted::ChangeFailedBare), busy);
        }
    }
    if conn.is_autocommit() {
        let rolled_back = StorageError::Unavailable(crate::ledger::error::Cause::message(
            "the transaction was rolled back by SQLite after an error",
        ));
        return (Err(NotCommitted::Failed(rolled_back)), busy);
    }
    let committed = conn
        .prepare_cached("COMMIT")
        .and_then(|mut s| s.execute([]));
    let outcome = committed.map(|_| ()).map_err(|error| {
        if failure::is_storage_lost(&error) {
            failure.fail(Cause::StorageLost, format!("commit failed: {error}"));
        }
        let _ = conn.execute_batch("ROLLBACK");
        NotCommitted::Failed(error.into())
    });
    (outcome, busy)
}

#[cfg(test)]
mod tests;
