//! What the kernel tells about this process and the disk under the ledger (/proc, statvfs).

/// Space on a file system, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilesystemSpace {
    /// What an unprivileged user (the service) may still use.
    pub free: u64,
    pub size: u64,
}

impl FilesystemSpace {
    /// The file system holding `path`, from statvfs(3); `None` if it cannot be read.
    pub fn of(path: &std::path::Path) -> Option<Self> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: statvfs writes only into the struct it is given; the path is NUL-terminated.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
            return None;
        }
        Some(FilesystemSpace {
            free: stats.f_bavail.saturating_mul(stats.f_frsize),
            size: stats.f_blocks.saturating_mul(stats.f_frsize),
        })
    }
}

/// This process, from /proc/self (zeros where it cannot be read).
#[derive(Debug, Default)]
pub(super) struct ProcessStats {
    pub(super) resident_bytes: u64,
    pub(super) open_fds: u64,
    pub(super) cpu_seconds: f64,
}

impl ProcessStats {
    pub(super) fn read() -> Self {
        // SAFETY: sysconf has no preconditions.
        let (page, ticks) = unsafe {
            (
                libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
                libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
            )
        };
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let resident_pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|pages| pages.parse().ok())
            .unwrap_or(0);
        // Fields after the command name (which may hold spaces): utime is the 12th, stime 13th.
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let field = |index: usize| -> f64 {
            after_name
                .split_whitespace()
                .nth(index)
                .and_then(|value| value.parse().ok())
                .unwrap_or(0.0)
        };
        ProcessStats {
            resident_bytes: resident_pages * page,
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64),
            cpu_seconds: (field(11) + field(12)) / ticks,
        }
    }
}
