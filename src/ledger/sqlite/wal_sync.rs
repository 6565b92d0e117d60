//! The WAL syncer: makes the writer's committed batches durable off the writer thread.
//!
//! With `synchronous = "full"` the writer's connection runs SQLite's NORMAL mode (COMMIT writes
//! the WAL frames but does not fsync them) and hands each committed batch's answers here. This
//! thread fdatasyncs the WAL file and only then answers every batch that committed before the
//! sync began. Meanwhile the writer may commit the next batch instead of waiting for the disk
//! (writer.rs decides when that pays), and one fsync covers every batch committed meanwhile.
//!
//! Why that is as durable as FULL's fsync inside COMMIT: in WAL mode a commit only appends
//! frames, and the frames of a committed transaction are never overwritten until a checkpoint
//! has copied them into the database file and synced it (SQLite does that in NORMAL mode too).
//! So once the WAL file is synced, every transaction committed before is on disk. Readers may
//! see a committed row a moment before it is synced (a power loss would take it back then); no
//! caller is told "ok" about it before.
//!
//! A failed fsync is final: Linux may drop the pages it could not write and report success on
//! the next fsync, so nothing committed since can be trusted. Every waiting and later answer is
//! an error, and the ledger reports itself failed so that the service exits and is restarted;
//! SQLite's recovery then reads what really is on disk.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::super::StorageError;

/// Answers one caller with the outcome of its transaction.
pub(super) type Completion = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

/// Makes everything written to the WAL so far durable.
pub(super) type SyncWal = Box<dyn FnMut() -> std::io::Result<()> + Send>;

pub(super) struct WalSyncer {
    batches: mpsc::Sender<Committed>,
    progress: Arc<Progress>,
    thread: std::thread::JoinHandle<()>,
}

/// A committed batch's callers, and whether the batch wrote anything.
type Committed = (Vec<Completion>, bool);

/// What the writer sees of the syncer's work.
#[derive(Default)]
struct Progress {
    state: Mutex<SyncState>,
    synced: Condvar,
    last_sync_micros: AtomicU64,
}

#[derive(Default)]
struct SyncState {
    /// Batches handed over and not answered yet.
    unsynced: usize,
    /// Set by the first failed sync, for good.
    error: Option<String>,
}

impl SyncState {
    fn outcome(&self) -> Result<(), StorageError> {
        match &self.error {
            None => Ok(()),
            Some(error) => Err(StorageError::Sqlite(error.clone())),
        }
    }
}

impl WalSyncer {
    /// Starts the thread; a failed sync cancels `failed`.
    pub(super) fn start(sync: SyncWal, failed: CancellationToken) -> std::io::Result<Self> {
        let (batches, committed) = mpsc::channel();
        let progress = Arc::new(Progress::default());
        let thread = std::thread::Builder::new()
            .name("ledger-wal-sync".into())
            .spawn({
                let progress = progress.clone();
                move || run(committed, sync, failed, &progress)
            })?;
        Ok(WalSyncer {
            batches,
            progress,
            thread,
        })
    }

    /// Answers a committed batch's callers once everything committed up to it is synced: after
    /// the next sync, or at once if it wrote nothing (only duplicates, say) and no earlier
    /// batch waits for its sync.
    pub(super) fn answer_when_durable(&self, completions: Vec<Completion>, wrote: bool) {
        let mut state = self.progress.state.lock().expect("not poisoned");
        if !wrote && state.unsynced == 0 {
            let outcome = state.outcome();
            drop(state);
            for answer in completions {
                answer(outcome.clone());
            }
            return;
        }
        state.unsynced += 1;
        drop(state);
        if let Err(mpsc::SendError((completions, _))) = self.batches.send((completions, wrote)) {
            // Only if the thread is gone (it never exits on its own): durability unknown, and
            // nobody will count this batch as answered.
            self.progress.state.lock().expect("not poisoned").unsynced -= 1;
            for answer in completions {
                answer(Err(StorageError::Closed));
            }
        }
    }

    /// Blocks until every batch handed over so far is answered.
    pub(super) fn wait_until_synced(&self) {
        let state = self.progress.state.lock().expect("not poisoned");
        drop(
            self.progress
                .synced
                .wait_while(state, |state| state.unsynced > 0)
                .expect("not poisoned"),
        );
    }

    /// How long the last sync took.
    pub(super) fn last_sync(&self) -> Duration {
        Duration::from_micros(self.progress.last_sync_micros.load(Ordering::Relaxed))
    }

    /// Syncs and answers everything handed over so far, then ends the thread.
    pub(super) fn finish(self) {
        drop(self.batches);
        let _ = self.thread.join();
    }
}

fn run(
    committed: mpsc::Receiver<Committed>,
    mut sync: SyncWal,
    failed: CancellationToken,
    progress: &Progress,
) {
    while let Ok((mut waiting, mut wrote)) = committed.recv() {
        // Everything committed by now is covered by the one sync below.
        let mut batches = 1;
        for (more, more_wrote) in committed.try_iter() {
            waiting.extend(more);
            wrote |= more_wrote;
            batches += 1;
        }
        let healthy = progress.state.lock().expect("not poisoned").error.is_none();
        // Batches that wrote nothing only wait for the syncs of earlier ones, which are done.
        if healthy && wrote {
            let started = Instant::now();
            let synced = sync();
            let took = started.elapsed();
            crate::metrics::METRICS.record_wal_sync(took.as_secs_f64());
            let micros = took.as_micros().try_into().unwrap_or(u64::MAX);
            progress.last_sync_micros.store(micros, Ordering::Relaxed);
            if let Err(error) = synced {
                tracing::error!(
                    %error,
                    "fsync of the ledger's WAL failed: no commit can be acknowledged any more; \
                     stopping so that the ledger is recovered from the disk"
                );
                progress.state.lock().expect("not poisoned").error =
                    Some(format!("fsync of the WAL failed: {error}"));
                failed.cancel();
            }
        }
        let outcome = progress.state.lock().expect("not poisoned").outcome();
        for answer in waiting {
            answer(outcome.clone());
        }
        progress.state.lock().expect("not poisoned").unsynced -= batches;
        progress.synced.notify_all();
    }
}

/// fdatasync of the ledger's WAL file, which the writer's connection keeps open (and SQLite
/// therefore never deletes) for as long as the writer runs. fsync acts on the file, not the
/// descriptor, so a descriptor of our own flushes what SQLite's wrote. SQLite itself still
/// syncs the WAL header (and, for a new file, its directory) whenever it starts the WAL over.
pub(super) fn sync_wal_file(database: &Path) -> std::io::Result<SyncWal> {
    let mut path = database.as_os_str().to_owned();
    path.push("-wal");
    let wal = File::open(&path)?;
    Ok(Box::new(move || wal.sync_data()))
}

/// For tests: a WAL sync that says when it begins (`syncing`), then waits for a `release`.
#[cfg(test)]
pub(super) fn held_sync() -> (SyncWal, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (began, syncing) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let sync: SyncWal = Box::new(move || {
        began.send(()).unwrap();
        released.recv().unwrap();
        Ok(())
    });
    (sync, syncing, release)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    type Answers = Arc<Mutex<Vec<Result<(), StorageError>>>>;

    fn recording(answers: &Answers) -> Completion {
        let answers = answers.clone();
        Box::new(move |outcome| answers.lock().unwrap().push(outcome))
    }

    #[test]
    fn a_batch_is_answered_only_after_a_sync_that_began_after_its_commit() {
        let (sync, syncing, release) = held_sync();
        let failed = CancellationToken::new();
        let syncer = WalSyncer::start(sync, failed.clone()).unwrap();
        let answers: Answers = Arc::default();

        syncer.answer_when_durable(vec![recording(&answers)], true);
        syncing.recv().unwrap();
        // Committed while the first sync runs: that sync may not have seen its frames.
        syncer.answer_when_durable(vec![recording(&answers), recording(&answers)], true);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            answers.lock().unwrap().is_empty(),
            "answered before the sync ended"
        );

        release.send(()).unwrap();
        syncing.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            answers.lock().unwrap().len(),
            1,
            "the second batch waits for a second sync"
        );

        release.send(()).unwrap();
        syncer.finish();
        let answers = answers.lock().unwrap();
        assert_eq!(answers.len(), 3);
        assert!(answers.iter().all(Result::is_ok));
        assert!(!failed.is_cancelled());
    }

    #[test]
    fn a_batch_that_wrote_nothing_waits_only_for_earlier_syncs() {
        let (sync, syncing, release) = held_sync();
        let syncer = WalSyncer::start(sync, CancellationToken::new()).unwrap();
        let (wrote, duplicates): (Answers, Answers) = Default::default();

        syncer.answer_when_durable(vec![recording(&wrote)], true);
        syncing.recv().unwrap();
        // A duplicate of a row whose batch is still being synced: not durable yet either.
        syncer.answer_when_durable(vec![recording(&duplicates)], false);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            duplicates.lock().unwrap().is_empty(),
            "answered before the row it found was synced"
        );

        release.send(()).unwrap();
        syncer.wait_until_synced();
        assert_eq!(wrote.lock().unwrap().len(), 1);
        assert_eq!(duplicates.lock().unwrap().len(), 1);
        assert!(
            syncing.try_recv().is_err(),
            "nothing new to sync for a batch that wrote nothing"
        );

        // Nothing waits for a sync: answered at once, without one.
        syncer.answer_when_durable(vec![recording(&duplicates)], false);
        assert_eq!(duplicates.lock().unwrap().len(), 2);
        syncer.finish();
        assert!(syncing.try_recv().is_err());
        assert!(duplicates.lock().unwrap().iter().all(Result::is_ok));
    }

    #[test]
    fn after_a_failed_sync_nothing_is_acknowledged_and_the_ledger_fails() {
        let syncs = Arc::new(Mutex::new(0));
        let sync: SyncWal = Box::new({
            let syncs = syncs.clone();
            move || {
                *syncs.lock().unwrap() += 1;
                Err(std::io::Error::other("EIO"))
            }
        });
        let failed = CancellationToken::new();
        let syncer = WalSyncer::start(sync, failed.clone()).unwrap();
        let answers: Answers = Arc::default();
        syncer.answer_when_durable(vec![recording(&answers)], true);
        // The next sync could "succeed" over pages the kernel dropped: it must not be trusted.
        std::thread::sleep(Duration::from_millis(50));
        syncer.answer_when_durable(vec![recording(&answers)], true);
        syncer.finish();

        assert!(failed.is_cancelled());
        assert_eq!(*syncs.lock().unwrap(), 1, "no sync after the failed one");
        let answers = answers.lock().unwrap();
        assert_eq!(answers.len(), 2);
        for answer in answers.iter() {
            let error = answer.as_ref().unwrap_err().to_string();
            assert!(error.contains("fsync of the WAL failed: EIO"), "{error}");
        }
    }

    #[test]
    fn the_wal_file_of_a_ledger_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.sqlite3");
        let conn = rusqlite::Connection::open(&database).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x)")
            .unwrap();
        let mut sync = sync_wal_file(&database).unwrap();
        sync().unwrap();
        sync().unwrap();
        let missing = sync_wal_file(&dir.path().join("none.sqlite3"))
            .err()
            .unwrap();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }
}
