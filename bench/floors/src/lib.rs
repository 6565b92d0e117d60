//! What the floors share: a ledger made as the receiver makes one, the clock, this process's CPU.

use rusqlite::Connection;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A new ledger file as the receiver makes one (its pragmas, then its migrations: every `*.sql`
/// of `migrations`, in name order), WAL with `synchronous = FULL`.
pub fn open_ledger(db: &str, migrations: &str) -> Result<Connection, Error> {
    let conn = Connection::open(db)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("{db}: journal_mode stayed {mode}").into());
    }
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")?;
    drop(conn);
    for file in migration_files(migrations)? {
        // One migration edits sqlite_schema in place: each on a connection of its own, which
        // reads the schema the one before wrote.
        Connection::open(db)?.execute_batch(&std::fs::read_to_string(file)?)?;
    }
    let conn = Connection::open(db)?;
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
    Ok(conn)
}

/// Every `*.sql` of `migrations`, in name order: the order the receiver applies them in.
pub fn migration_files(migrations: &str) -> Result<Vec<std::path::PathBuf>, Error> {
    let mut files: Vec<_> = std::fs::read_dir(migrations)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "sql"));
    files.sort();
    if files.is_empty() {
        return Err(format!("no *.sql in {migrations}").into());
    }
    Ok(files)
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// This process's CPU time so far (user + system, every thread, not its children's), in
/// microseconds.
pub fn cpu_us() -> Result<f64, Error> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: initialised by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Ok(us(usage.ru_utime) + us(usage.ru_stime))
}

/// The PostgreSQL server's CPU time so far, in microseconds: the user + system time of every
/// process named `postgres` on this machine, and of the processes each has reaped (a backend
/// that ended is counted by the postmaster that waited for it).
pub fn postgres_server_cpu_us() -> Result<f64, Error> {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut ticks = 0u64;
    for entry in std::fs::read_dir("/proc")? {
        let path = entry?.path().join("stat");
        // A process that ended since the directory was read has no stat to read.
        let Ok(stat) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Some((name, rest)) = stat.split_once(") ") else {
            continue;
        };
        if !name.ends_with("(postgres") {
            continue;
        }
        // After the name: state (field 3), ..., utime (14), stime, cutime, cstime (17).
        let fields: Vec<&str> = rest.split(' ').collect();
        for field in fields.get(11..15).ok_or("a stat line too short")? {
            ticks += field.parse::<u64>()?;
        }
    }
    Ok(ticks as f64 * 1e6 / ticks_per_second)
}
