//! The WAL's sync: makes the writer's committed batches durable, on the writer's thread or on a
//! thread of its own (the WAL syncer).
//!
//! With `synchronous = "full"` the writer's connection runs SQLite's NORMAL mode (COMMIT writes
//! the WAL frames but does not fsync them). After a commit the writer fdatasyncs the WAL file
//! itself and then answers the batch; or, where that pays (a slow disk, a backlog: writer/mod.rs),
//! it hands the batch's answers to the syncer's thread, which fdatasyncs the WAL and only then
//! answers every batch that committed before the sync began, while the writer commits the next
//! batch; one fsync covers every batch committed meanwhile. One sync runs at a time.
//!
//! Why that is as durable as FULL's fsync inside COMMIT: in WAL mode a commit only appends
//! frames, and the frames of a committed transaction are never overwritten until a checkpoint
//! has copied them into the database file and synced it (SQLite does that in NORMAL mode too).
//! So once the WAL file is synced, every transaction committed before is on disk. Readers may
//! see a committed row a moment before it is synced (a power loss would take it back then); no
//! caller is told "ok" about it before. A restarted process sees such rows too, through the page
//! cache: [`WalFile::sync_inherited`] makes them durable before the ledger answers anything.
//!
//! A failed fsync is final: Linux may drop the pages it could not write and report success on
//! the next fsync, so nothing committed since can be trusted. Every waiting and later answer is
//! an error, and the ledger reports itself failed so that the service exits (failure.rs says
//! why it must not simply be restarted).

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::failure::{Cause, Failure};
use crate::ledger::error::StorageError;
use crate::ledger::model::ClaimOutcome;

/// Answers one caller once the outcome of its transaction is known.
pub(super) enum Completion {
    /// A claim, the most frequent caller by far: its answer and where it goes, with no
    /// allocation of their own.
    Claim(ClaimReply, Result<ClaimOutcome, StorageError>),
    /// Any other change.
    Change(Box<dyn FnOnce(Result<(), StorageError>) + Send>),
}

/// Where a claim's caller waits for its outcome.
pub(super) type ClaimReply = oneshot::Sender<Result<ClaimOutcome, StorageError>>;

impl Completion {
    /// `committed`: whether the caller's transaction committed (and is durable).
    pub(super) fn complete(self, committed: Result<(), StorageError>) {
        match self {
            Completion::Claim(reply, outcome) => {
                let _ = reply.send(committed.and(outcome));
            }
            Completion::Change(complete) => complete(committed),
        }
    }
}

/// Runs a batch's answers: inline, or on the async runtime its callers wait on, one task per
/// batch. Each answer wakes its caller's task. Woken from a thread outside the runtime (this
/// one, the writer's), every wake-up takes the runtime's shared queue lock and often a futex
/// wake of a parked worker; woken on a runtime thread, it is a push onto that thread's own run
/// queue. So a batch of N callers costs one cross-thread wake-up instead of N.
#[derive(Clone)]
pub(super) struct Answerer {
    runtime: Option<tokio::runtime::Handle>,
}

impl Answerer {
    /// Answers on the runtime this is called from, if any (the service's).
    pub(super) fn on_current_runtime() -> Answerer {
        Answerer {
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Answers on the calling thread (the benchmark's storage floor, which has no runtime).
    #[cfg(any(test, feature = "bench"))]
    pub(super) fn inline() -> Answerer {
        Answerer { runtime: None }
    }

    pub(super) fn answer(&self, completions: Vec<Completion>, outcome: Result<(), StorageError>) {
        let several = completions.len() > 1;
        let answer_all = move || {
            for completion in completions {
                completion.complete(outcome.clone());
            }
        };
        match &self.runtime {
            // A task for one answer would cost more than the one wake-up it replaces. A
            // runtime shutting down drops the task, and with it the answers: their callers see
            // the ledger closed, never a false "ok".
            Some(runtime) if several => drop(runtime.spawn(async move { answer_all() })),
            _ => answer_all(),
        }
    }
}

/// How many of the last syncs [`WalSyncer::typical_sync`] averages, roughly: a single slow
/// sync (a larger batch, a busy disk) moves it by an eighth.
const SYNC_AVERAGE_OVER: u64 = 8;

/// Makes everything written to the WAL so far durable.
pub(super) type SyncWal = Box<dyn FnMut() -> std::io::Result<()> + Send>;

pub(super) struct WalSyncer {
    batches: mpsc::Sender<Committed>,
    progress: Arc<Progress>,
    answerer: Answerer,
    thread: std::thread::JoinHandle<()>,
}

/// A committed batch's callers, and whether the batch wrote anything.
type Committed = (Vec<Completion>, bool);

/// What the writer sees of the syncer's work.
struct Progress {
    /// Batches handed over and not answered yet.
    unsynced: Mutex<usize>,
    synced: Condvar,
    /// The WAL's sync, run by this thread or by the writer's: one at a time.
    sync: Mutex<SyncWal>,
    /// How long a sync takes, a moving average over the last few.
    typical_sync_micros: AtomicU64,
    failure: Arc<Failure>,
}

impl Progress {
    /// The count stays right even if a thread panicked while holding it.
    fn unsynced(&self) -> MutexGuard<'_, usize> {
        self.unsynced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Syncs the WAL, unless the ledger failed: after a failure no sync is trusted (nor needed:
    /// nothing is acknowledged). A failed sync fails the ledger before the lock is released, so
    /// a sync that begins after it, on either thread, is never taken for durable.
    fn sync(&self) {
        let mut sync = self.sync.lock().unwrap_or_else(PoisonError::into_inner);
        if self.failure.is_failed() {
            return;
        }
        let started = Instant::now();
        let synced = std::panic::catch_unwind(AssertUnwindSafe(&mut *sync));
        let took = started.elapsed();
        crate::metrics::METRICS.record_wal_sync(took.as_secs_f64());
        let micros: u64 = took.as_micros().try_into().unwrap_or(u64::MAX);
        // Only this function writes it, under the lock.
        let typical = self.typical_sync_micros.load(Ordering::Relaxed);
        let typical = typical - typical / SYNC_AVERAGE_OVER + micros / SYNC_AVERAGE_OVER;
        self.typical_sync_micros.store(typical, Ordering::Relaxed);
        match synced {
            Ok(Ok(())) => {}
            Ok(Err(error)) => self.failure.fail(
                Cause::StorageLost,
                format!("fsync of the WAL failed: {error}"),
            ),
            Err(_) => self
                .failure
                .fail(Cause::Panicked, "the WAL sync panicked".into()),
        }
    }
}

impl WalSyncer {
    /// Starts the thread; a failed sync (or a panic in it) fails `failure`.
    pub(super) fn start(
        sync: SyncWal,
        failure: Arc<Failure>,
        answerer: Answerer,
    ) -> std::io::Result<Self> {
        let (batches, committed) = mpsc::channel();
        let progress = Arc::new(Progress {
            unsynced: Mutex::new(0),
            synced: Condvar::new(),
            sync: Mutex::new(sync),
            typical_sync_micros: AtomicU64::new(0),
            failure,
        });
        let thread = std::thread::Builder::new()
            .name("ledger-wal-sync".into())
            .spawn({
                let (progress, answerer) = (progress.clone(), answerer.clone());
                move || {
                    let run = AssertUnwindSafe(|| run(committed, &progress, &answerer));
                    if std::panic::catch_unwind(run).is_err() {
                        progress
                            .failure
                            .fail(Cause::Panicked, "the WAL sync thread panicked".into());
                        // The batches it held were dropped, and so answered as failed.
                        *progress.unsynced() = 0;
                        progress.synced.notify_all();
                    }
                }
            })?;
        Ok(WalSyncer {
            batches,
            progress,
            answerer,
            thread,
        })
    }

    /// Answers a committed batch's callers once everything committed up to it is synced: after
    /// the next sync, or at once if it wrote nothing (only duplicates, say) and no earlier
    /// batch waits for its sync.
    pub(super) fn answer_when_durable(&self, completions: Vec<Completion>, wrote: bool) {
        let mut unsynced = self.progress.unsynced();
        if !wrote && *unsynced == 0 {
            drop(unsynced);
            self.answerer
                .answer(completions, self.progress.failure.check());
            return;
        }
        *unsynced += 1;
        drop(unsynced);
        if let Err(mpsc::SendError((completions, _))) = self.batches.send((completions, wrote)) {
            // Only if the thread is gone (it never exits on its own): durability unknown, and
            // nobody will count this batch as answered.
            *self.progress.unsynced() -= 1;
            for completion in completions {
                completion.complete(Err(StorageError::Closed));
            }
        }
    }

    /// Syncs the WAL on the calling thread (the writer's, when handing the sync over does not
    /// pay), then answers `completions`: everything committed before the sync is durable.
    pub(super) fn answer_after_syncing_here(&self, completions: Vec<Completion>) {
        self.progress.sync();
        self.answerer
            .answer(completions, self.progress.failure.check());
    }

    /// Blocks until every batch handed over so far is answered.
    #[cfg(test)]
    pub(super) fn wait_until_synced(&self) {
        let unsynced = self.progress.unsynced();
        drop(
            self.progress
                .synced
                .wait_while(unsynced, |unsynced| *unsynced > 0)
                .unwrap_or_else(PoisonError::into_inner),
        );
    }

    /// How long a sync takes: the moving average of the last few.
    pub(super) fn typical_sync(&self) -> Duration {
        Duration::from_micros(self.progress.typical_sync_micros.load(Ordering::Relaxed))
    }

    /// Syncs and answers everything handed over so far, then ends the thread.
    pub(super) fn finish(self) {
        drop(self.batches);
        let _ = self.thread.join();
    }
}

fn run(committed: mpsc::Receiver<Committed>, progress: &Progress, answerer: &Answerer) {
    while let Ok((mut waiting, mut wrote)) = committed.recv() {
        // Everything committed by now is covered by the one sync below.
        let mut batches = 1;
        for (more, more_wrote) in committed.try_iter() {
            waiting.extend(more);
            wrote |= more_wrote;
            batches += 1;
        }
        // Batches that wrote nothing only wait for the syncs of earlier ones, which are done.
        if wrote {
            progress.sync();
        }
        answerer.answer(waiting, progress.failure.check());
        *progress.unsynced() -= batches;
        progress.synced.notify_all();
    }
}

/// The WAL file SQLite has open for the ledger, and a descriptor of our own on it. fsync acts
/// on the file, not the descriptor, so ours flushes what SQLite's wrote. The writer's
/// connection keeps the file open (and SQLite therefore never deletes it) for as long as the
/// writer runs; SQLite itself still syncs the WAL header (and, for a new file, its directory)
/// whenever it starts the WAL over.
pub(super) struct WalFile {
    /// The database's real path (links resolved), as SQLite names it.
    database: PathBuf,
    /// SQLite's name for the WAL: `database` + `-wal`.
    path: PathBuf,
    file: File,
    identity: (u64, u64),
}

impl WalFile {
    /// Opens the WAL of `conn`'s database (creating it, as any read in WAL mode does, if the
    /// ledger has none yet: a restored backup, say), and checks that it is the very file SQLite
    /// has open.
    pub(super) fn open(conn: &Connection) -> std::io::Result<WalFile> {
        conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))
            .map_err(std::io::Error::other)?;
        let database = conn
            .path()
            .filter(|path| !path.is_empty())
            .ok_or_else(|| std::io::Error::other("the ledger has no file name"))?;
        let path = PathBuf::from(format!("{database}-wal"));
        let file = File::open(&path)?;
        let meta = file.metadata()?;
        let identity = (meta.dev(), meta.ino());
        if sqlite_descriptor(identity, file.as_raw_fd())?.is_none() {
            return Err(std::io::Error::other(format!(
                "{} is not the WAL file SQLite has open",
                path.display()
            )));
        }
        Ok(WalFile {
            database: PathBuf::from(database),
            path,
            file,
            identity,
        })
    }

    /// Makes durable what an earlier process left: committed frames it may not have synced
    /// before it died (this process reads them from the page cache all the same, and would
    /// answer "duplicate" for them), and the database file and directory a checkpoint or a
    /// new file changed.
    ///
    /// The database file is synced through SQLite's own descriptor: closing a descriptor of
    /// our own on it would drop every POSIX lock this process holds on the file, SQLite's
    /// among them, and the next other process to close the ledger (a `sqlite3` shell) would
    /// take itself for the last connection, checkpoint and delete the live WAL.
    pub(super) fn sync_inherited(&self) -> std::io::Result<()> {
        self.sync()?;
        let meta = std::fs::metadata(&self.database)?;
        let descriptor = sqlite_descriptor((meta.dev(), meta.ino()), -1)?.ok_or_else(|| {
            std::io::Error::other(format!(
                "{} is not the database file SQLite has open",
                self.database.display()
            ))
        })?;
        // SAFETY: fsync on a descriptor SQLite keeps open for as long as its connection, which
        // outlives this call; nothing is read, written or closed.
        if unsafe { libc::fsync(descriptor) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // A directory holds no POSIX locks of SQLite's: a descriptor of our own is fine.
        if let Some(dir) = self.database.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// fdatasync, refused when the file was deleted or replaced under the running service:
    /// syncing a file SQLite no longer writes would acknowledge what no disk holds.
    fn sync(&self) -> std::io::Result<()> {
        if self.file.metadata()?.nlink() == 0 {
            return Err(std::io::Error::other(format!(
                "{} was deleted while the service ran",
                self.path.display()
            )));
        }
        let now = std::fs::metadata(&self.path).map(|meta| (meta.dev(), meta.ino()));
        if now.ok() != Some(self.identity) {
            return Err(std::io::Error::other(format!(
                "{} was replaced while the service ran",
                self.path.display()
            )));
        }
        self.file.sync_data()
    }

    pub(super) fn into_sync(self) -> SyncWal {
        Box::new(move || self.sync())
    }
}

/// A descriptor of this process, other than `except`, open on the file `identity` (device,
/// inode): SQLite's.
fn sqlite_descriptor(identity: (u64, u64), except: RawFd) -> std::io::Result<Option<RawFd>> {
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        if fd == except {
            continue;
        }
        // A descriptor closed since the listing has no metadata any more: not SQLite's.
        if let Ok(meta) = std::fs::metadata(entry.path()) {
            if (meta.dev(), meta.ino()) == identity {
                return Ok(Some(fd));
            }
        }
    }
    Ok(None)
}

/// For tests: a WAL sync that says when it begins, and on which thread (`syncing`), then
/// waits for a `release`.
#[cfg(test)]
pub(super) fn held_sync() -> (SyncWal, mpsc::Receiver<String>, mpsc::Sender<()>) {
    let (began, syncing) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let sync: SyncWal = Box::new(move || {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        began.send(thread).unwrap();
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
        Completion::Change(Box::new(move |outcome| {
            answers.lock().unwrap().push(outcome)
        }))
    }

    #[test]
    fn a_batch_is_answered_only_after_a_sync_that_began_after_its_commit() {
        let (sync, syncing, release) = held_sync();
        let failure = Arc::new(Failure::default());
        let syncer = WalSyncer::start(sync, failure.clone(), Answerer::inline()).unwrap();
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
        assert!(!failure.is_failed());
    }

    /// The answers of a batch of several run on the runtime, as one task: its callers' tasks
    /// are then woken from a runtime thread (see [`Answerer`]); a lone answer runs at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_several_is_answered_on_the_runtime() {
        let (sync, syncing, release) = held_sync();
        let syncer =
            WalSyncer::start(sync, Arc::default(), Answerer::on_current_runtime()).unwrap();
        let (tx, mut answered) = tokio::sync::mpsc::unbounded_channel();
        let on_runtime = |tx: &tokio::sync::mpsc::UnboundedSender<(bool, bool)>| -> Completion {
            let tx = tx.clone();
            Completion::Change(Box::new(move |outcome| {
                let runtime_thread = tokio::runtime::Handle::try_current().is_ok();
                tx.send((outcome.is_ok(), runtime_thread)).unwrap();
            }))
        };
        syncer.answer_when_durable(vec![on_runtime(&tx), on_runtime(&tx)], true);
        tokio::task::block_in_place(|| syncing.recv().unwrap());
        release.send(()).unwrap();
        for _ in 0..2 {
            assert_eq!(answered.recv().await, Some((true, true)));
        }
        syncer.answer_when_durable(vec![on_runtime(&tx)], true);
        tokio::task::block_in_place(|| syncing.recv().unwrap());
        release.send(()).unwrap();
        assert_eq!(
            answered.recv().await,
            Some((true, false)),
            "one answer: on the syncer's thread"
        );
        tokio::task::block_in_place(|| syncer.finish());
    }

    #[test]
    fn a_batch_that_wrote_nothing_waits_only_for_earlier_syncs() {
        let (sync, syncing, release) = held_sync();
        let syncer = WalSyncer::start(sync, Arc::default(), Answerer::inline()).unwrap();
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
        let failure = Arc::new(Failure::default());
        let syncer = WalSyncer::start(sync, failure.clone(), Answerer::inline()).unwrap();
        let answers: Answers = Arc::default();
        syncer.answer_when_durable(vec![recording(&answers)], true);
        // The next sync could "succeed" over pages the kernel dropped: it must not be trusted.
        std::thread::sleep(Duration::from_millis(50));
        syncer.answer_when_durable(vec![recording(&answers)], true);
        syncer.finish();

        assert_eq!(failure.cause(), Some(Cause::StorageLost));
        assert_eq!(*syncs.lock().unwrap(), 1, "no sync after the failed one");
        let answers = answers.lock().unwrap();
        assert_eq!(answers.len(), 2);
        for answer in answers.iter() {
            let error = answer.as_ref().unwrap_err().to_string();
            assert!(error.contains("fsync of the WAL failed: EIO"), "{error}");
        }
    }

    /// Regression: a panic in the sync left the writer waiting for it forever.
    #[test]
    fn a_panic_in_the_sync_fails_the_ledger_and_answers_everyone() {
        let sync: SyncWal = Box::new(|| panic!("a bug in the sync"));
        let failure = Arc::new(Failure::default());
        let syncer = WalSyncer::start(sync, failure.clone(), Answerer::inline()).unwrap();
        let answers: Answers = Arc::default();
        syncer.answer_when_durable(vec![recording(&answers)], true);
        syncer.wait_until_synced();
        syncer.answer_when_durable(vec![recording(&answers)], true);
        syncer.wait_until_synced();
        syncer.finish();

        assert_eq!(failure.cause(), Some(Cause::Panicked));
        let answers = answers.lock().unwrap();
        assert_eq!(answers.len(), 2, "every caller is answered");
        assert!(answers.iter().all(Result::is_err), "{answers:?}");
    }

    fn wal_ledger(database: &std::path::Path) -> Connection {
        let conn = Connection::open(database).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x)")
            .unwrap();
        conn
    }

    #[test]
    fn the_wal_file_of_a_ledger_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let conn = wal_ledger(&dir.path().join("ledger.sqlite3"));
        let wal = WalFile::open(&conn).unwrap();
        wal.sync_inherited().unwrap();
        let mut sync = wal.into_sync();
        sync().unwrap();
        sync().unwrap();
    }

    /// Regression: the WAL of a ledger reached through a symlink was looked for beside the link
    /// (refusing to start, or syncing a stray file SQLite never writes), and a restored backup,
    /// which has no WAL yet, could not be served on its first start.
    #[test]
    fn the_wal_is_the_one_sqlite_writes_through_a_link_and_for_a_restored_file() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        drop(wal_ledger(&real.join("ledger.sqlite3")));
        let link = dir.path().join("ledger.sqlite3");
        std::os::unix::fs::symlink(real.join("ledger.sqlite3"), &link).unwrap();
        // A stray file where the link's name would put a WAL.
        std::fs::write(dir.path().join("ledger.sqlite3-wal"), "").unwrap();
        let conn = Connection::open(&link).unwrap();
        let wal = WalFile::open(&conn).unwrap();
        assert_eq!(wal.path, real.join("ledger.sqlite3-wal"));
        wal.sync_inherited().unwrap();

        let restored = dir.path().join("restored.sqlite3");
        conn.execute("VACUUM INTO ?1", [restored.to_str().unwrap()])
            .unwrap();
        let conn = Connection::open(&restored).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        let wal = WalFile::open(&conn).unwrap();
        assert!(wal.path.exists());
        wal.sync_inherited().unwrap();
    }

    #[test]
    fn a_wal_deleted_or_replaced_under_the_service_is_never_synced_as_fine() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.sqlite3");
        let conn = wal_ledger(&database);
        let wal_path = dir.path().join("ledger.sqlite3-wal");

        let mut sync = WalFile::open(&conn).unwrap().into_sync();
        std::fs::rename(&wal_path, dir.path().join("elsewhere")).unwrap();
        std::fs::write(&wal_path, "").unwrap();
        let error = sync().unwrap_err().to_string();
        assert!(error.contains("was replaced"), "{error}");

        std::fs::remove_file(&wal_path).unwrap();
        std::fs::rename(dir.path().join("elsewhere"), &wal_path).unwrap();
        let mut sync = WalFile::open(&conn).unwrap().into_sync();
        sync().unwrap();
        std::fs::remove_file(&wal_path).unwrap();
        let error = sync().unwrap_err().to_string();
        assert!(error.contains("was deleted"), "{error}");
    }

    #[test]
    fn a_file_sqlite_does_not_have_open_is_not_taken_for_its_wal() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.sqlite3");
        drop(wal_ledger(&database));
        // A plain connection in rollback mode: SQLite opens no WAL, but a file of that name is
        // there.
        let conn = Connection::open(&database).unwrap();
        conn.execute_batch("PRAGMA journal_mode = DELETE").unwrap();
        std::fs::write(dir.path().join("ledger.sqlite3-wal"), "").unwrap();
        let error = WalFile::open(&conn).err().unwrap().to_string();
        assert!(
            error.contains("not the WAL file SQLite has open"),
            "{error}"
        );
    }
}
