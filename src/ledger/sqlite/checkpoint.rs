//! The WAL checkpointer: copies committed WAL frames back into the database file off the writer.
//!
//! Copying frames is most of a checkpoint's cost, and SQLite's automatic checkpoint does it inside
//! the committing connection, stalling every claim queued behind it. This thread does the copying
//! concurrently (a PASSIVE checkpoint never blocks the writer); the writer keeps a rarely reached
//! automatic checkpoint, which then finds almost nothing left to copy and lets the next commit
//! rewind the WAL to its start, so the file stays bounded under any load.
//!
//! A reader's snapshot (a `sqlite3` session, a backup) keeps frames from being copied back and
//! the WAL grows meanwhile: the thread then looks again every [`READER_RETRY`], with no commit
//! needed, and once every frame is copied it truncates a WAL longer than the writer's size
//! limit, so that the file shrinks within a second or two of the reader going, at rest too.
//!
//! An I/O error while checkpointing is final, like a failed WAL sync (failure.rs says why): a
//! later WAL restart could overwrite frames whose pages never reached the database file.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::failure::{self, Cause, Failure};
use crate::throttle::Throttled;

/// The writer's own checkpoint threshold, in pages (128 MiB of WAL). The checkpointer thread
/// copies frames long before (see checkpoint.rs); the writer's checkpoint only finishes the job
/// and rewinds the WAL. Each of those stalls commits for one fsync of the database file, so
/// they are kept rare: on a 1.4 GiB ledger a 2000-page threshold cost a 70 ms stall every 0.3 s
/// (p99 65 ms); this one, a stall every few seconds (p99 8 ms).
pub(super) const WRITER_AUTOCHECKPOINT_PAGES: u32 = 32768;

/// The WAL file is truncated back to this size when it rewinds. Above the size it reaches in
/// normal operation (the checkpoint threshold), so that each cycle overwrites space the file
/// already has: a limit below it made every cycle append to newly allocated space, which cost
/// ~20 % of the claim throughput (`loadgen --sqlite-alone`). Only a WAL that a long read
/// transaction made grow past it is cut back.
pub(super) const WAL_SIZE_LIMIT_BYTES: u64 = 2 * WRITER_AUTOCHECKPOINT_PAGES as u64 * 4096;

/// How long after a commit its frames are copied back: the commits of that time are copied
/// together, and it is frequent enough to keep up.
const INTERVAL: Duration = Duration::from_millis(50);

/// How often a checkpoint a reader kept from finishing is tried again, commits or not.
const READER_RETRY: Duration = Duration::from_secs(1);

pub(super) struct Checkpointer {
    signals: Arc<Signals>,
    thread: std::thread::JoinHandle<()>,
}

/// What wakes the checkpointer's thread: a commit that wrote, or the stop.
#[derive(Default)]
struct Signals {
    committed: AtomicBool,
    stopping: AtomicBool,
}

/// Tells the checkpointer that a commit wrote frames. Only the first commit since the last
/// checkpoint wakes its thread; an idle ledger leaves it asleep (no lock taken on the files,
/// no wake-up: a timer of its own once took the checkpoint lock every 50 ms).
#[derive(Clone)]
pub(super) struct CheckpointWake {
    signals: Arc<Signals>,
    thread: Thread,
}

impl CheckpointWake {
    pub(super) fn committed(&self) {
        if !self.signals.committed.swap(true, Ordering::AcqRel) {
            self.thread.unpark();
        }
    }
}

impl Checkpointer {
    pub(super) fn start(conn: Connection, failure: Arc<Failure>) -> anyhow::Result<Checkpointer> {
        // A truncating checkpoint must not wait for the writer or a reader (and hold the
        // write lock meanwhile): it is tried again later instead.
        conn.busy_timeout(Duration::ZERO)?;
        let signals = Arc::new(Signals::default());
        let thread = std::thread::Builder::new()
            .name("ledger-checkpoint".into())
            .spawn({
                let signals = signals.clone();
                move || {
                    // On a full disk this fails at every commit: one line, then one a minute.
                    let mut failures = Throttled::new("WAL checkpoint failed; retrying");
                    while signals.wait_for_commits() {
                        match copy_back(&conn) {
                            Ok(true) => failures.recovered(),
                            Ok(false) => signals.retry_later(),
                            Err(error) if failure::is_storage_lost(&error) => {
                                failure.fail(
                                    Cause::StorageLost,
                                    format!("checkpoint failed: {error}"),
                                );
                                break;
                            }
                            Err(error) => {
                                failures.warn(&error.to_string());
                                // Tried again after the next commit's interval.
                                signals.committed.store(true, Ordering::Release);
                            }
                        }
                    }
                }
            })?;
        Ok(Checkpointer { signals, thread })
    }

    /// Wakes the checkpointer after commits.
    pub(super) fn wake(&self) -> CheckpointWake {
        CheckpointWake {
            signals: self.signals.clone(),
            thread: self.thread.thread().clone(),
        }
    }

    pub(super) fn stop(self) {
        self.signals.stopping.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

impl Signals {
    /// On the checkpointer's thread: sleeps until a commit wrote, then [`INTERVAL`] more (the
    /// commits meanwhile are copied by the same checkpoint). `false` once stopping.
    fn wait_for_commits(&self) -> bool {
        // `park` may return without an unpark: every wait looks at the flags again.
        while !self.committed.load(Ordering::Acquire) {
            if self.stopping.load(Ordering::Acquire) {
                return false;
            }
            std::thread::park();
        }
        let until = Instant::now() + INTERVAL;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if self.stopping.load(Ordering::Acquire) {
                return false;
            }
            std::thread::park_timeout(left);
        }
        self.committed.store(false, Ordering::Release);
        !self.stopping.load(Ordering::Acquire)
    }

    /// After a checkpoint a reader kept from finishing: [`READER_RETRY`] later, as after a
    /// commit (at once if a commit comes first: under load the cadence stays the commits').
    fn retry_later(&self) {
        let until = Instant::now() + READER_RETRY;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if self.stopping.load(Ordering::Acquire) || self.committed.load(Ordering::Acquire) {
                return;
            }
            std::thread::park_timeout(left);
        }
        self.committed.store(true, Ordering::Release);
    }
}

/// Copies committed frames back (`PASSIVE`: never waits, never blocks the writer); `false`
/// while some are left for a reader's snapshot, or the WAL file is still longer than
/// [`WAL_SIZE_LIMIT_BYTES`] (the writer's limit cuts it back only when a commit rewinds it: at
/// rest, never). A long WAL with every frame copied is truncated, if no writer or reader is in
/// it at that instant (busy otherwise, and tried again).
fn copy_back(conn: &Connection) -> rusqlite::Result<bool> {
    let (log, copied): (i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get(1)?, row.get(2)?))
        })?;
    if copied < log {
        return Ok(false);
    }
    let wal = conn.path().map(|path| format!("{path}-wal"));
    let long = wal
        .and_then(|wal| std::fs::metadata(wal).ok())
        .is_some_and(|wal| wal.len() > WAL_SIZE_LIMIT_BYTES);
    if !long {
        return Ok(true);
    }
    match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
        row.get::<_, i64>(0)
    }) {
        Ok(busy) => Ok(busy == 0),
        Err(error) if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// The writer's own checkpoint, run after a commit once the WAL holds `pages` (what SQLite's
/// `wal_autocheckpoint` does, but with its I/O errors reaching the COMMIT instead of being
/// dropped by SQLite's default WAL hook). A busy checkpoint (this thread's own is running) is
/// left to the next commit.
pub(super) fn checkpoint_after_commit(
    wal: &rusqlite::hooks::Wal,
    pages: i32,
) -> rusqlite::Result<()> {
    if pages < WRITER_AUTOCHECKPOINT_PAGES as i32 {
        return Ok(());
    }
    match wal.checkpoint() {
        Err(error) if failure::is_storage_lost(&error) => Err(error),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database file's size: frames copied back by a checkpoint grow it.
    fn file_size(path: &std::path::Path) -> u64 {
        std::fs::metadata(path).unwrap().len()
    }

    /// Regression: the checkpointer took the checkpoint lock every 50 ms on an idle ledger (a
    /// wake-up and a file lock each time). Now it copies frames only after a commit says so.
    #[test]
    fn frames_are_copied_back_after_a_commit_and_not_on_a_timer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite3");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
                 CREATE TABLE t (x);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
                 INSERT INTO t SELECT i FROM n;",
            )
            .unwrap();
        let before = file_size(&path);
        let checkpointer =
            Checkpointer::start(Connection::open(&path).unwrap(), Arc::default()).unwrap();
        std::thread::sleep(INTERVAL * 6);
        assert_eq!(file_size(&path), before, "copied back with no commit told");

        checkpointer.wake().committed();
        let copied = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            file_size(&path) > before
        });
        assert!(copied, "the frames were not copied back after a commit");
        checkpointer.stop();
    }
}
