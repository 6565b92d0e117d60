//! Process-wide facts and settings made at start: the host name, the open-files limit and how
//! memory goes back to the OS.

/// Raises the soft limit on open files to the hard limit (systemd starts services with soft
/// 1024, hard 524288): each connection is a descriptor, and the ledger needs a few more.
/// Returns the soft limit now in effect.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}

/// Allocations at least this large get pages of their own, returned to the OS when freed.
const OWN_PAGES_FROM_BYTES: i32 = 128 * 1024;

/// Makes memory freed after a burst go back to the OS (glibc's allocator).
///
/// glibc serves an allocation over its mmap threshold with pages of its own, but raises that
/// threshold (up to 32 MiB) each time such an allocation is freed; from then on request bodies
/// of up to 1 MiB come from the heap arenas, where fragmentation keeps the memory after a flood
/// (measured: 855 MiB still resident 10 s after 2,000 1 MiB requests). A fixed threshold keeps
/// every large buffer in pages of its own. Fewer arenas (one per core, not eight) bound what
/// small allocations can strand.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; any value is valid to ask for.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_PAGES_FROM_BYTES);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        libc::mallopt(libc::M_ARENA_MAX, i32::try_from(cores).unwrap_or(8));
    }
}

/// Clears the calling thread's ambient capabilities (the unit's CAP_NET_BIND_SERVICE, for
/// port 443), which a program it starts would hold. The effective set keeps it: the thread
/// may still bind port 443. A thread takes its ambient set from the thread that creates it,
/// so `main` runs this before the process has a second thread, and no handler holds it. No
/// error where there were none.
pub fn clear_ambient_capabilities() -> std::io::Result<()> {
    // SAFETY: prctl with these arguments only clears this thread's ambient set.
    let cleared = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // EINVAL: a kernel before 4.3, which has no ambient capabilities to clear.
    if cleared != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// This machine's host name (gethostname), or "localhost" if it has none.
pub fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    let failed = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } != 0;
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    match std::str::from_utf8(&buffer[..end]) {
        Ok(name) if !failed && !name.is_empty() => name.to_owned(),
        _ => "localhost".to_owned(),
    }
}
