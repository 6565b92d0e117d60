//! The power-loss model (tests/powercut/powercut.c): processes run under it, then the power is cut.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;

/// The preload library, built once per test binary with the machine's C compiler.
fn library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/powercut/powercut.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("libpowercut.so");
        let built = Command::new("cc")
            .args([
                "-shared",
                "-fPIC",
                "-O2",
                "-Wall",
                "-Wno-format-truncation",
                "-o",
            ])
            .arg(&out)
            .arg(&source)
            .arg("-ldl")
            .status()
            .expect("cc (the power-loss model is C)");
        assert!(built.success(), "building {} failed", source.display());
        out
    })
}

/// Every file below `root` written by a process run under the model loses, at [`cut`], what
/// was not fsynced.
///
/// [`cut`]: PowerModel::cut
pub struct PowerModel {
    root: PathBuf,
    state: PathBuf,
    sync_delay_us: u64,
}

impl PowerModel {
    /// The model over `root`, its records in `state` (outside `root`); each fsync takes
    /// `sync_delay_us`, as on a real disk.
    pub fn new(root: &Path, state: &Path, sync_delay_us: u64) -> PowerModel {
        std::fs::create_dir_all(state).unwrap();
        PowerModel {
            root: root.to_owned(),
            state: state.to_owned(),
            sync_delay_us,
        }
    }

    /// The environment that puts a process under the model.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), library().display().to_string()),
            ("POWERCUT_ROOT".into(), self.root.display().to_string()),
            ("POWERCUT_STATE".into(), self.state.display().to_string()),
            (
                "POWERCUT_SYNC_DELAY_US".into(),
                self.sync_delay_us.to_string(),
            ),
        ]
    }

    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command.envs(self.env());
        command
    }

    /// From now on every sync of a file whose path ends with `suffix` fails with EIO.
    pub fn fail_syncs_of(&self, suffix: &str) {
        std::fs::write(self.state.join("fail-sync"), suffix).unwrap();
    }

    /// The power goes: every process in `processes` dies at once (SIGKILL), and every file
    /// they wrote holds what it held at its last fsync. Then the records start over: what the
    /// files hold now is what the disk holds. Returns how many files lost unsynced writes.
    pub fn cut(&self, processes: &mut [&mut Child]) -> usize {
        for process in processes.iter_mut() {
            let _ = process.kill();
        }
        for process in processes.iter_mut() {
            let _ = process.wait();
        }
        let mut changed = 0;
        for entry in std::fs::read_dir(&self.state).unwrap() {
            let record = entry.unwrap().path();
            if record.extension().is_none_or(|ext| ext != "path") {
                continue;
            }
            let path = PathBuf::from(std::fs::read_to_string(&record).unwrap());
            let durable = std::fs::read(record.with_extension("durable")).unwrap();
            if std::fs::read(&path).is_ok_and(|now| now != durable) {
                std::fs::write(&path, &durable).unwrap();
                changed += 1;
            }
        }
        // Emptied, not made again: the directory keeps its owner (a server run as another user).
        for record in std::fs::read_dir(&self.state).unwrap() {
            std::fs::remove_file(record.unwrap().path()).unwrap();
        }
        changed
    }
}
