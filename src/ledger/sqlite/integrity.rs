//! The ledger's whole-file damage check: in the background once serving, or before serving.
//!
//! The check reads the whole file, so it takes as long as reading the ledger (about 15 s per GiB
//! from a cold cache on a slow disk: minutes for 10 million jobs). Before serving, SQLite has
//! read the file's header and its schema and recovered the WAL; the whole-file check then runs on
//! a thread of its own, on a read-only connection, at the lowest CPU priority and the lowest
//! best-effort I/O priority, while the service serves (`PRAGMA quick_check`, or
//! `integrity_check` with `database.check_at_start = "full"`). Meanwhile a claim is acknowledged only once SQLite wrote it through pages it
//! read and found well-formed (damage on its path fails the commit: 503, and Sume retries). The
//! first damage the check finds fails the ledger for good (nothing more is acknowledged, the
//! service stops with [`DAMAGED_EXIT_STATUS`], which the unit does not restart) and leaves a mark
//! beside the file: the next start then runs the whole check before serving, and serves only
//! once the ledger passes it (restored or recovered). `database.check_before_serving` runs it
//! before serving at every start.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::failure::{Cause, Failure};
use crate::config::{CheckAtStart, SqliteConfig};
use crate::ledger::error::LedgerDamaged;

/// How often a check before serving tells systemd it is still going, and by how much it moves
/// the start's timeout each time: well past the next report, so that only a check that stopped
/// reading (stuck on the disk) lets the start time out, a minute later.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(5);
const EXTEND_START_BY: Duration = Duration::from_secs(60);
/// Pages between two looks at the clock and the stop flag during a check (its steps are pages).
const STEPS_BETWEEN_LOOKS: std::os::raw::c_int = 1_000;

/// The mark a failed check leaves beside the ledger, with its findings.
pub(super) fn damage_mark(path: &Path) -> PathBuf {
    let mut mark = path.as_os_str().to_owned();
    mark.push("-damaged");
    PathBuf::from(mark)
}

/// Whether the whole check runs before serving: configured so, or the last check found damage.
pub(super) fn check_before_serving(config: &SqliteConfig) -> bool {
    config.check_at_start != CheckAtStart::Off
        && (config.check_before_serving || damage_mark(&config.path).exists())
}

/// Runs the whole check now, before serving, telling systemd how far it got (the start's
/// timeout moves with it). On damage, leaves the mark and returns [`LedgerDamaged`].
pub(super) fn check_now(conn: &Connection, config: &SqliteConfig) -> anyhow::Result<()> {
    let mark = damage_mark(&config.path);
    if mark.exists() {
        tracing::warn!(
            mark = %mark.display(),
            "the last check found the ledger damaged: checking all of it before serving"
        );
    }
    let size = ledger_bytes(&config.path);
    let started = Instant::now();
    let read_before = bytes_read();
    let mut last_report = started;
    let findings = run_check(conn, config.check_at_start, move || {
        if last_report.elapsed() >= PROGRESS_EVERY {
            last_report = Instant::now();
            let read = bytes_read().saturating_sub(read_before);
            report_progress(read, size, started.elapsed());
        }
        false
    });
    // Before serving, a check that cannot read the ledger refuses it as damage would.
    conclude(
        findings.unwrap_or_else(|error| Some(error.to_string())),
        config,
        started,
    )
}

/// The whole check on a thread of its own, while the service serves.
pub(super) struct BackgroundCheck {
    stop: Arc<AtomicBool>,
    /// Stops the check within a page, wherever it is.
    interrupt: rusqlite::InterruptHandle,
    thread: std::thread::JoinHandle<()>,
}

impl BackgroundCheck {
    /// Starts the check on a read-only connection of its own; damage fails `failure`.
    pub(super) fn start(
        config: &SqliteConfig,
        failure: Arc<Failure>,
    ) -> anyhow::Result<BackgroundCheck> {
        let conn = Connection::open_with_flags(
            &config.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let interrupt = conn.get_interrupt_handle();
        let config = config.clone();
        let thread = std::thread::Builder::new()
            .name("ledger-check".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    lower_priority();
                    let started = Instant::now();
                    let interrupt = stop.clone();
                    let findings = run_check(&conn, config.check_at_start, move || {
                        interrupt.load(Ordering::Relaxed)
                    });
                    let findings = match findings {
                        _ if stop.load(Ordering::Relaxed) => {
                            return tracing::info!(
                                "ledger check stopped by shutdown; it runs again at the next start"
                            )
                        }
                        Ok(findings) => findings,
                        // It proves nothing either way (the disk, were it failing, fails the
                        // writer's commits too).
                        Err(error) => {
                            return tracing::warn!(%error, "the ledger check could not run to its end")
                        }
                    };
                    if let Err(error) = conclude(findings, &config, started) {
                        failure.fail(Cause::Damaged, format!("{error:#}"));
                    }
                }
            })?;
        Ok(BackgroundCheck {
            stop,
            interrupt,
            thread,
        })
    }

    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.interrupt.interrupt();
        let _ = self.thread.join();
    }
}

/// What the check found: `Ok(None)` for a whole ledger, `Ok(Some(findings))` for damage, `Err`
/// when it could not run to its end (or was interrupted).
type Findings = rusqlite::Result<Option<String>>;

fn run_check(
    conn: &Connection,
    check: CheckAtStart,
    interrupt: impl FnMut() -> bool + Send + 'static,
) -> Findings {
    let pragma = pragma(check);
    conn.progress_handler(STEPS_BETWEEN_LOOKS, Some(interrupt))?;
    let rows = conn
        .prepare(&format!("PRAGMA {pragma}(5)"))
        .and_then(|mut statement| {
            statement
                .query_map([], |row| row.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        });
    conn.progress_handler(0, None::<fn() -> bool>)?;
    match rows {
        Ok(rows) if rows == ["ok"] => Ok(None),
        Ok(rows) => Ok(Some(rows.join("; "))),
        // SQLite reports some damage as an error of the statement itself.
        Err(error) if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseCorrupt) => {
            Ok(Some(error.to_string()))
        }
        Err(error) => Err(error),
    }
}

fn pragma(check: CheckAtStart) -> &'static str {
    match check {
        CheckAtStart::Full => "integrity_check",
        CheckAtStart::Quick | CheckAtStart::Off => "quick_check",
    }
}

/// Logs a passed check and clears the mark; damage leaves the mark and becomes the error that
/// says how to recover.
fn conclude(
    findings: Option<String>,
    config: &SqliteConfig,
    started: Instant,
) -> anyhow::Result<()> {
    let check = pragma(config.check_at_start);
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mark = damage_mark(&config.path);
    let Some(findings) = findings else {
        tracing::info!(check, elapsed_ms, "ledger checked");
        if mark.exists() {
            // Left in place, it only makes the next start check before serving again.
            match std::fs::remove_file(&mark) {
                Ok(()) => {
                    tracing::info!(mark = %mark.display(), "the ledger passed its check: the damage mark is removed")
                }
                Err(error) => {
                    tracing::warn!(mark = %mark.display(), %error, "the ledger passed its check, but its damage mark cannot be removed")
                }
            }
        }
        return Ok(());
    };
    let path = config.path.display();
    let message = format!(
        "the ledger {path} is damaged (PRAGMA {check}: {findings:?}); refusing to serve from it. \
         Stop the service and restore the ledger from a backup, or salvage what is readable: \
         `sqlite3 {path} .recover | sqlite3 {path}.recovered`, then move the recovered file to \
         {path} (keep the damaged one aside); the next start checks it before serving. \
         database.check_at_start = \"off\" skips the check"
    );
    if let Err(error) = std::fs::write(&mark, format!("{message}\n")) {
        tracing::error!(mark = %mark.display(), %error, "cannot leave the damage mark");
    }
    Err(LedgerDamaged(message).into())
}

/// The ledger's bytes on disk: the file and its WAL.
fn ledger_bytes(path: &Path) -> u64 {
    let wal = {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        wal
    };
    [path.as_os_str(), wal.as_os_str()]
        .iter()
        .filter_map(|file| std::fs::metadata(file).ok())
        .map(|meta| meta.len())
        .sum()
}

/// Bytes this process has read so far (`rchar`: through the page cache or not). Before serving
/// nothing else reads, so its growth is the check's.
fn bytes_read() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("rchar: "))
                .and_then(|value| value.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The systemd status line, and a later start timeout (`EXTEND_TIMEOUT_USEC`): a check that
/// reads on is never killed for the time it takes. No-ops outside systemd.
fn report_progress(read: u64, size: u64, elapsed: Duration) {
    const GIB: f64 = (1u64 << 30) as f64;
    // Read so far, not a fraction: the check reads some pages more than once.
    let status = format!(
        "checking the ledger ({:.1} GiB) before serving: {} s, {:.1} GiB read so far",
        size as f64 / GIB,
        elapsed.as_secs(),
        read as f64 / GIB
    );
    tracing::info!(
        read_bytes = read,
        ledger_bytes = size,
        elapsed_s = elapsed.as_secs(),
        "checking the ledger before serving"
    );
    still_starting(&status);
}

/// Tells systemd what a long step before serving is doing (`status`), and moves the start's
/// timeout [`EXTEND_START_BY`] later: a step that goes on is never killed for the time it
/// takes. A no-op outside systemd.
pub(super) fn still_starting(status: &str) {
    let extend = u32::try_from(EXTEND_START_BY.as_micros()).unwrap_or(u32::MAX);
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::ExtendTimeoutUsec(extend),
        sd_notify::NotifyState::Status(status),
    ]);
}

/// The calling thread's CPU and I/O priority at their lowest (best effort, level 7): the check
/// yields to claims and handlers. Where the I/O scheduler has no priorities, only the CPU's
/// counts.
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread's id; failures are only logged.
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the check's CPU priority");
        }
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_BEST_EFFORT_LOWEST: libc::c_long = (2 << 13) | 7;
        if libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            IOPRIO_BEST_EFFORT_LOWEST,
        ) != 0
        {
            tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the check's I/O priority");
        }
    }
}

/// Fills the ledger at `path` (migrated, closed) with 2000 jobs and overwrites one page in the
/// middle of the file, as a bad sector or a stray write would. Returns the file as it was whole.
#[cfg(any(test, feature = "testing"))]
pub fn damage_for_test(path: &Path) -> Vec<u8> {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
         INSERT INTO jobs (job_id, state, body, received_at, updated_at)
         SELECT 'old-' || i, 'done', hex(randomblob(500)), i, i FROM n;
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |row| row.get(0))
        .unwrap();
    drop(conn);
    let whole = std::fs::read(path).unwrap();
    let mut bytes = whole.clone();
    let page = usize::try_from(pages / 2).unwrap() * 4096;
    bytes[page..page + 4096].fill(0x55);
    std::fs::write(path, bytes).unwrap();
    whole
}
