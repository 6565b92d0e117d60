//! The writer's last commit, and another process's hold on SQLite's write lock seen without taking it.
//!
//! Readiness reads this at each request for it (`/readyz`, a scrape): after another process
//! (the `sqlite3` shell, a backup tool) kept the lock past `busy_timeout` and a commit failed,
//! the ledger is ready again as soon as the lock is free, with no write needed to prove it; and
//! a lock held elsewhere for longer than `busy_timeout` makes it not ready with no claim to
//! fail. The look is one `fcntl(F_GETLK)`: no lock taken, no row written, nothing between asks.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// The byte of the WAL index (`-shm`) that a writer locks: SQLite's unix VFS puts its shared
/// memory locks from `UNIX_SHM_BASE` = 120, and `WAL_WRITE_LOCK` is the first.
const WAL_WRITE_LOCK_BYTE: libc::off_t = 120;

pub(super) struct CommitState {
    /// Whether the last batch that changed anything (or failed) committed.
    ok: AtomicBool,
    /// Whether the last failed one could not get the write lock (`SQLITE_BUSY`).
    busy: AtomicBool,
    /// The WAL index, open for the ledger's life: closing any descriptor of a file drops every
    /// POSIX lock the process holds on it, SQLite's own included. `None` if it could not be
    /// opened (readiness then follows the commits alone, as before).
    shm: Option<File>,
    /// How long a commit waits for the lock (`busy_timeout`).
    patience: Duration,
    /// Since when another process has been seen holding the lock, at every look.
    held_since: Mutex<Option<Instant>>,
}

impl CommitState {
    /// For the writer's connection (in WAL mode: the `-shm` exists), with its `busy_timeout`.
    pub(super) fn of(conn: &Connection) -> rusqlite::Result<CommitState> {
        let busy_timeout: i64 = conn.pragma_query_value(None, "busy_timeout", |row| row.get(0))?;
        let path = Path::new(conn.path().unwrap_or_default());
        Ok(CommitState::new(
            path,
            Duration::from_millis(busy_timeout.unsigned_abs()),
        ))
    }

    /// For the ledger at `path` (in WAL mode: its `-shm` exists), whose commits wait `patience`.
    fn new(path: &Path, patience: Duration) -> CommitState {
        let mut shm = path.as_os_str().to_owned();
        shm.push("-shm");
        let shm = File::open(&shm)
            .inspect_err(|error| {
                tracing::warn!(
                    %error,
                    "cannot open the WAL index to see other processes' write locks: readiness \
                     follows the commits alone"
                );
            })
            .ok();
        CommitState {
            ok: AtomicBool::new(true),
            busy: AtomicBool::new(false),
            shm,
            patience,
            held_since: Mutex::new(None),
        }
    }

    /// The outcome of a batch that changed rows or failed; `busy` if it failed for the lock.
    pub(super) fn record(&self, committed: bool, busy: bool) {
        self.ok.store(committed, Ordering::Relaxed);
        self.busy.store(!committed && busy, Ordering::Relaxed);
    }

    /// Why a claim sent now would not commit, if it would not.
    pub(super) fn fault(&self) -> Option<&'static str> {
        let held = self.shm.as_ref().and_then(|shm| held_elsewhere(shm).ok());
        let held_for = {
            let mut since = self.held_since.lock().expect("not poisoned");
            match held {
                Some(true) => Some(since.get_or_insert_with(Instant::now).elapsed()),
                _ => {
                    *since = None;
                    None
                }
            }
        };
        if !self.ok.load(Ordering::Relaxed) {
            let busy = self.busy.load(Ordering::Relaxed);
            return match (busy, held) {
                // The lock is free again: the next claim takes it.
                (true, Some(false)) => None,
                (true, _) => Some(
                    "another process holds the ledger's write lock: the last commit waited \
                     busy_timeout for it",
                ),
                (false, _) => Some("the last ledger commit failed"),
            };
        }
        held_for
            .is_some_and(|held_for| held_for >= self.patience)
            .then_some(
                "another process has held the ledger's write lock for longer than busy_timeout",
            )
    }
}

/// Whether a `BEGIN IMMEDIATE` failed because another process kept the write lock past
/// `busy_timeout`.
pub(super) fn is_busy(begin: &rusqlite::Result<usize>) -> bool {
    begin
        .as_ref()
        .err()
        .and_then(rusqlite::Error::sqlite_error_code)
        == Some(rusqlite::ErrorCode::DatabaseBusy)
}

/// Whether another process holds the WAL write lock: `F_GETLK` reports a lock that would
/// conflict, without taking one (and never this process's own, which a claim would wait for
/// in the writer's queue, not fail on).
fn held_elsewhere(shm: &File) -> std::io::Result<bool> {
    // SAFETY: `flock` is plain data, all zeroes a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    // A read lock conflicts only with a write lock: another process's readers do not count.
    lock.l_type = libc::F_RDLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = WAL_WRITE_LOCK_BYTE;
    lock.l_len = 1;
    // SAFETY: a valid descriptor and a valid `flock` for F_GETLK to fill in.
    if unsafe { libc::fcntl(shm.as_raw_fd(), libc::F_GETLK, &mut lock) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another process is needed for F_GETLK to report a lock: the `sqlite3`-like holder is
    /// a child that takes the write lock with `BEGIN IMMEDIATE`; tests/ledger.rs does that on
    /// the real binary. Here: with no other process, nothing is held, and a busy failure is
    /// over as soon as the lock is seen free.
    #[test]
    fn a_busy_failure_ends_when_no_other_process_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite3");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "wal").unwrap();
        conn.execute_batch("CREATE TABLE t (x); BEGIN IMMEDIATE; INSERT INTO t VALUES (1);")
            .unwrap();
        let state = CommitState::new(&path, Duration::from_secs(2));
        assert_eq!(
            state.fault(),
            None,
            "this process's own lock is not another's"
        );
        state.record(false, true);
        assert_eq!(
            state.fault(),
            None,
            "busy, but the lock is free of others now"
        );
        state.record(false, false);
        assert_eq!(state.fault(), Some("the last ledger commit failed"));
        state.record(true, false);
        assert_eq!(state.fault(), None);
    }
}
