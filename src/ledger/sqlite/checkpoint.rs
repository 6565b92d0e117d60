//! The WAL checkpointer: copies committed WAL frames back into the database file off the writer.
//!
//! Copying frames is most of a checkpoint's cost, and SQLite's automatic checkpoint does it inside
//! the committing connection, stalling every claim queued behind it. This thread does the copying
//! concurrently (a PASSIVE checkpoint never blocks the writer); the writer keeps a rarely reached
//! automatic checkpoint, which then finds almost nothing left to copy and lets the next commit
//! rewind the WAL to its start, so the file stays bounded under any load.
//!
//! An I/O error while checkpointing is final, like a failed WAL sync (failure.rs says why): a
//! later WAL restart could overwrite frames whose pages never reached the database file.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use rusqlite::Connection;

use super::failure::{self, Cause, Failure};
use crate::throttle::Throttled;

/// The writer's own checkpoint threshold, in pages (128 MiB of WAL). The checkpointer thread
/// copies frames long before (see checkpoint.rs); the writer's checkpoint only finishes the job
/// and rewinds the WAL. Each of those stalls commits for one fsync of the database file, so
/// they are kept rare: on a 1.4 GiB ledger a 2000-page threshold cost a 70 ms stall every 0.3 s
/// (p99 65 ms); this one, a stall every few seconds (p99 8 ms).
pub(super) const WRITER_AUTOCHECKPOINT_PAGES: u32 = 32768;

/// How often committed frames are copied back: cheap when idle, frequent enough to keep up.
const INTERVAL: Duration = Duration::from_millis(50);

pub(super) struct Checkpointer {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Checkpointer {
    pub(super) fn start(conn: Connection, failure: Arc<Failure>) -> std::io::Result<Checkpointer> {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ledger-checkpoint".into())
            .spawn(move || {
                // On a full disk this fails every interval: one line, then one a minute.
                let mut failures = Throttled::new("WAL checkpoint failed; retrying");
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(INTERVAL) {
                    match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                        Ok(()) => failures.recovered(),
                        Err(error) if failure::is_storage_lost(&error) => {
                            failure.fail(Cause::StorageLost, format!("checkpoint failed: {error}"));
                            break;
                        }
                        Err(error) => failures.warn(&error.to_string()),
                    }
                }
            })?;
        Ok(Checkpointer { stop, thread })
    }

    pub(super) fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
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
