//! One service per SQLite ledger: an exclusive lock on `<database>.lock`.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// An exclusive lock on `<database>.lock`: two receivers on one ledger would run jobs twice.
pub(crate) struct InstanceLock {
    _file: File,
}

impl InstanceLock {
    pub(crate) fn acquire(database: &Path) -> anyhow::Result<Self> {
        let dir = database
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create database directory {}", dir.display()))?;
        let path = lock_path(database)?;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                "another sume-receiver is already running on {} (it holds {}); \
                 two receivers on one ledger would run jobs twice",
                database.display(),
                path.display()
            ),
            Err(std::fs::TryLockError::Error(error)) => {
                Err(error).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }
}

/// `<real path of the database>.lock`. The real path: two configs that reach one ledger through
/// different paths (a symlink to the file or its directory, a relative path) still meet on one
/// lock file.
fn lock_path(database: &Path) -> anyhow::Result<PathBuf> {
    let dir = database
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let real = std::fs::canonicalize(database).or_else(|_| {
        let name = database.file_name().unwrap_or_default();
        std::fs::canonicalize(dir).map(|dir| dir.join(name))
    });
    let mut path = real
        .with_context(|| format!("cannot resolve {}", database.display()))?
        .into_os_string();
    path.push(".lock");
    Ok(PathBuf::from(path))
}

/// Whether a service is running on this ledger now (it holds the instance lock). Asked with a
/// shared lock held for an instant; a service starting in that instant fails and is restarted.
pub fn service_running(database: &Path) -> bool {
    let Ok(file) = lock_path(database).and_then(|path| Ok(File::open(path)?)) else {
        return false;
    };
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}
