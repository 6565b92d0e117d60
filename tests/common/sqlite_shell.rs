//! The `sqlite3` shell on a ledger, in another process: a lock or a snapshot held as an operator's session or a backup holds it.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The shell, inside the transaction its first statements opened, until [`SqliteShell::let_go`].
pub struct SqliteShell(Child);

impl SqliteShell {
    /// The shell on `db`, having been sent `sql`.
    pub fn run(db: &Path, sql: &str) -> SqliteShell {
        SqliteShell(Self::spawn(db, sql, Stdio::null()))
    }

    fn spawn(db: &Path, sql: &str, stdout: Stdio) -> Child {
        let mut shell = Command::new("sqlite3")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(stdout)
            .spawn()
            .expect("the sqlite3 shell (apt-get install sqlite3)");
        let stdin = shell.stdin.as_mut().unwrap();
        stdin.write_all(sql.as_bytes()).unwrap();
        stdin.flush().unwrap();
        shell
    }

    /// The shell holding the write lock (`BEGIN IMMEDIATE`), once it says it is inside. It
    /// waits for a commit of the receiver's in progress (`.timeout`) instead of failing: a
    /// probe from here that merely found the lock taken could have met the receiver's own.
    pub fn holding_the_write_lock(db: &Path) -> SqliteShell {
        use std::io::{BufRead, BufReader};
        let sql = ".timeout 5000\nBEGIN IMMEDIATE;\nSELECT 'inside';\n";
        let mut shell = Self::spawn(db, sql, Stdio::piped());
        let mut line = String::new();
        BufReader::new(shell.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "inside", "the shell never took the lock");
        SqliteShell(shell)
    }

    /// Ends its transaction and quits.
    pub fn let_go(mut self) {
        let mut stdin = self.0.stdin.take().unwrap();
        stdin.write_all(b"ROLLBACK;\n.quit\n").unwrap();
        drop(stdin);
        assert!(self.0.wait().unwrap().success());
    }
}
