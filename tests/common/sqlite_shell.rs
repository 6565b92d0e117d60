//! The `sqlite3` shell on a ledger, in another process: a lock or a snapshot held as an operator's session or a backup holds it.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shell, inside the transaction its first statements opened, until [`SqliteShell::let_go`].
pub struct SqliteShell(Child);

impl SqliteShell {
    /// The shell on `db`, having been sent `sql`.
    pub fn run(db: &Path, sql: &str) -> SqliteShell {
        let mut shell = Command::new("sqlite3")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("the sqlite3 shell (apt-get install sqlite3)");
        let stdin = shell.stdin.as_mut().unwrap();
        stdin.write_all(sql.as_bytes()).unwrap();
        stdin.flush().unwrap();
        SqliteShell(shell)
    }

    /// The shell holding the write lock (`BEGIN IMMEDIATE`), once this process cannot take it.
    pub fn holding_the_write_lock(db: &Path) -> SqliteShell {
        let shell = SqliteShell::run(db, "BEGIN IMMEDIATE;\n");
        let probe = rusqlite::Connection::open(db).unwrap();
        probe.busy_timeout(Duration::ZERO).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while probe.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").is_ok() {
            assert!(Instant::now() < deadline, "the shell never took the lock");
            std::thread::sleep(Duration::from_millis(10));
        }
        shell
    }

    /// Ends its transaction and quits.
    pub fn let_go(mut self) {
        let mut stdin = self.0.stdin.take().unwrap();
        stdin.write_all(b"ROLLBACK;\n.quit\n").unwrap();
        drop(stdin);
        assert!(self.0.wait().unwrap().success());
    }
}
