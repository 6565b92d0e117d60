//! Other processes' changes to the ledger (a `jobs retry`), seen without polling: inotify on its WAL.
//!
//! Every commit appends to the WAL file, and a process that wrote to it closes it when it ends,
//! after its last commit. So an idle worker sleeps until its next job is due and is woken by
//! such an event, instead of looking in the ledger every second (a wake-up and a file lock each
//! time). Events that come while nobody waits stay queued in the kernel (identical ones merged),
//! so none is lost between two waits; this process's own commits wake a waiting worker too,
//! which then looks once more and finds its own claims.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub(super) struct WalWatch {
    inotify: AsyncFd<OwnedFd>,
    /// Cleared if the watch stops working (the WAL file went away, a read failed): the worker
    /// then looks in the ledger on a timer again.
    working: AtomicBool,
}

impl WalWatch {
    /// Watches `<ledger>-wal` for writes and for closes after writing. Needs a tokio runtime.
    pub(super) fn start(ledger: &Path) -> io::Result<WalWatch> {
        let mut wal = ledger.as_os_str().to_owned();
        wal.push("-wal");
        let wal = CString::new(wal.as_bytes()).map_err(io::Error::other)?;
        // SAFETY: a new descriptor, owned at once; the path is a valid C string.
        let inotify = unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let events = libc::IN_MODIFY | libc::IN_CLOSE_WRITE;
        // SAFETY: a valid descriptor and C string.
        if unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), wal.as_ptr(), events) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the descriptor is owned by the AsyncFd from here on, and never replaced.
        let inotify = unsafe { AsyncFd::register_with_interest(inotify, Interest::READABLE)? };
        Ok(WalWatch {
            inotify,
            working: AtomicBool::new(true),
        })
    }

    /// Whether every write of another process still wakes [`WalWatch::changed`].
    pub(super) fn is_working(&self) -> bool {
        self.working.load(Ordering::Relaxed)
    }

    /// Resolves once the WAL was written, or closed by a process that wrote it, since the last
    /// call resolved (at once if that happened meanwhile). Never, if the watch fails.
    pub(super) async fn changed(&self) {
        let mut events = [0u8; 4096];
        loop {
            let Ok(mut ready) = self.inotify.readable().await else {
                return std::future::pending().await;
            };
            // SAFETY: reads into a buffer of the length given.
            let read = ready.try_io(|fd| {
                let n =
                    unsafe { libc::read(fd.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n)
                }
            });
            match read {
                Ok(Ok(length)) => {
                    if watch_ended(&events[..length.unsigned_abs()]) {
                        self.stop_working("the ledger's WAL file went away");
                    }
                    return;
                }
                Ok(Err(error)) => {
                    self.stop_working(&error.to_string());
                    return std::future::pending().await;
                }
                // Woken for nothing: wait again.
                Err(_would_block) => {}
            }
        }
    }
}

impl WalWatch {
    fn stop_working(&self, why: &str) {
        tracing::warn!(
            why,
            "the ledger's WAL watch stopped: an idle worker looks in the ledger every second"
        );
        self.working.store(false, Ordering::Relaxed);
    }
}

/// Whether the kernel removed the watch (`IN_IGNORED`: the file was deleted or its file
/// system unmounted) among `events` (`struct inotify_event`s, each followed by `len` bytes).
fn watch_ended(mut events: &[u8]) -> bool {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    while events.len() >= HEADER {
        let field = |at: usize| u32::from_ne_bytes(events[at..at + 4].try_into().expect("4 bytes"));
        // wd (i32), mask, cookie, len
        let (mask, name_len) = (field(4), field(12) as usize);
        if mask & libc::IN_IGNORED != 0 {
            return true;
        }
        events = events.get(HEADER + name_len..).unwrap_or_default();
    }
    false
}
