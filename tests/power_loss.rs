//! Power cuts under load, on a model of a disk that drops every write not fsynced
//! (tests/powercut/powercut.c): no acknowledged job may be lost, and the model must see the
//! losses of `synchronous = "normal"`, which acknowledges before the disk has the claim.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::powercut::PowerModel;
use common::service::*;
use common::*;

/// Every fsync under the model takes this long, as on a real disk: commits then overlap syncs,
/// and a power cut finds committed claims that no sync has covered yet.
const SYNC_DELAY_US: u64 = 2000;
const SENDERS: usize = 16;

/// A receiver's directory on the modelled disk, and what was sent to it over its lifetimes.
struct Rig {
    dir: tempfile::TempDir,
    model: PowerModel,
    port: u16,
    config: PathBuf,
    /// The ledger as the config names it (a symlink in one test).
    ledger: PathBuf,
    /// The ledger's PostgreSQL database instead, if there is one.
    postgres_url: Option<String>,
    sent: Arc<Mutex<HashSet<String>>>,
    acknowledged: Arc<Mutex<HashSet<String>>>,
}

impl Rig {
    fn new(database_keys: &str) -> Rig {
        Self::with_ledger_at("ledger.sqlite3", database_keys)
    }

    /// The ledger at `ledger` below the modelled disk.
    fn with_ledger_at(ledger: &str, database_keys: &str) -> Rig {
        Self::with_database(ledger, database_keys, None)
    }

    /// The ledger in the PostgreSQL database at `url` (the receiver writes nothing locally).
    fn on_postgres(url: &str) -> Rig {
        Self::with_database(
            "unused.sqlite3",
            &format!("url = \"{url}\""),
            Some(url.to_owned()),
        )
    }

    fn with_database(ledger: &str, database_keys: &str, postgres_url: Option<String>) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::create_dir(&disk).unwrap();
        let model = PowerModel::new(&disk, &dir.path().join("powercut"), SYNC_DELAY_US);
        let port = free_port();
        let ledger = disk.join(ledger);
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\n[signature]\nsecrets = [\"{SECRET}\"]\n\
                 [database]\npath = \"{}\"\n{database_keys}\n",
                ledger.display()
            ),
        )
        .unwrap();
        Rig {
            dir,
            model,
            port,
            config,
            ledger,
            postgres_url,
            sent: Arc::default(),
            acknowledged: Arc::default(),
        }
    }

    fn disk(&self) -> PathBuf {
        self.dir.path().join("disk")
    }

    /// The receiver, running under the model.
    async fn start(&self) -> Service {
        let env = self.model.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Service::start_with_env(&self.config, self.port, &env).await
    }

    /// Sends new jobs from [`SENDERS`] senders until `stop`; `bursty` alternates 100 ms of
    /// sending with 100 ms of silence (commits, then idle syncs and checkpoints).
    fn load(
        &self,
        round: usize,
        bursty: bool,
        stop: Arc<AtomicBool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..SENDERS)
            .map(|sender| {
                let (sent, acknowledged, stop, port) = (
                    self.sent.clone(),
                    self.acknowledged.clone(),
                    stop.clone(),
                    self.port,
                );
                tokio::spawn(async move {
                    let client = sume_receiver::http_client::new_client();
                    let started = Instant::now();
                    for i in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if bursty && (started.elapsed().as_millis() / 100) % 2 == 1 {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        let job_id = format!("r{round}-s{sender}-{i}");
                        sent.lock().unwrap().insert(job_id.clone());
                        if deliver(&client, port, &job_id).await {
                            acknowledged.lock().unwrap().insert(job_id);
                        }
                    }
                })
            })
            .collect()
    }

    /// The jobs sent but never acknowledged whose claims the ledger holds: committed before a
    /// crash, their answers never sent. (Read from the files as they are, which after a kill -9
    /// is the page cache: synced or not.)
    fn committed_but_unanswered(&self) -> Vec<String> {
        let unanswered: Vec<String> = {
            let (sent, acknowledged) =
                (self.sent.lock().unwrap(), self.acknowledged.lock().unwrap());
            sent.difference(&acknowledged).cloned().collect()
        };
        let conn = rusqlite::Connection::open_with_flags(
            &self.ledger,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        let mut held = conn
            .prepare("SELECT 1 FROM jobs WHERE job_id = ?1")
            .unwrap();
        unanswered
            .into_iter()
            .filter(|job_id| held.exists([job_id]).unwrap())
            .collect()
    }

    /// Sends `jobs` again, as Sume retries them; how many were acknowledged as duplicates.
    async fn retry(&self, jobs: Vec<String>) -> usize {
        let client = sume_receiver::http_client::new_client();
        let mut duplicates = 0;
        for job_id in jobs {
            if let Some(duplicate) = deliver_answer(&client, self.port, &job_id).await {
                duplicates += usize::from(duplicate);
                self.acknowledged.lock().unwrap().insert(job_id);
            }
        }
        duplicates
    }

    /// The jobs the ledger holds (opened as the next start would, after a cut).
    fn held(&self) -> HashSet<String> {
        if let Some(url) = &self.postgres_url {
            return with_postgres(url, |client| {
                let rows = client.query("SELECT job_id FROM jobs", &[]).unwrap();
                rows.iter().map(|row| row.get(0)).collect()
            });
        }
        let conn = rusqlite::Connection::open(&self.ledger).unwrap();
        let mut statement = conn.prepare("SELECT job_id FROM jobs").unwrap();
        let held = statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        held
    }

    /// Acknowledged jobs the ledger does not hold.
    fn lost(&self) -> Vec<String> {
        let held = self.held();
        let mut lost: Vec<String> = self
            .acknowledged
            .lock()
            .unwrap()
            .difference(&held)
            .cloned()
            .collect();
        lost.sort();
        lost
    }

    /// How many acknowledged jobs are lost now; says which when there are any.
    fn lost_in_round(&self, round: usize) -> usize {
        let lost = self.lost();
        if !lost.is_empty() {
            eprintln!(
                "round {round}: {} acknowledged jobs lost, e.g. {:?}",
                lost.len(),
                &lost[..lost.len().min(3)]
            );
        }
        lost.len()
    }

    fn acknowledged(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    /// Waits until more than `before` deliveries are acknowledged: a round's random wait before
    /// its cut counts from the first acknowledgement, not from the receiver's start, which a
    /// loaded machine may not have finished (a cut before the schema was committed left no
    /// `jobs` table to check).
    async fn until_acknowledged_beyond(&self, before: usize) {
        let started = Instant::now();
        while self.acknowledged() <= before {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no delivery acknowledged in 30 s after the receiver started"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn deliver(client: &sume_receiver::http_client::HttpClient, port: u16, job_id: &str) -> bool {
    deliver_answer(client, port, job_id).await.is_some()
}

/// Whether the delivery was acknowledged as a duplicate; `None` if it was not acknowledged.
async fn deliver_answer(
    client: &sume_receiver::http_client::HttpClient,
    port: u16,
    job_id: &str,
) -> Option<bool> {
    let request = signed_delivery(port, SECRET, &job_body(job_id));
    let answer = sume_receiver::http_client::send(client, request, Duration::from_secs(5), 4096)
        .await
        .ok()
        .filter(|answer| answer.status == 200)?;
    Some(json(&answer)["duplicate"] == true)
}

/// A process that checkpoints the live ledger with `TRUNCATE` every 20 ms (an operator's tool,
/// a replicator), under the model like the receiver.
fn external_checkpointer(model: &PowerModel, ledger: &Path) -> Child {
    model
        .command("python3")
        .args([
            "-c",
            "import sqlite3, sys, time\n\
             db = sqlite3.connect(sys.argv[1], timeout=1)\n\
             while True:\n    \
                 db.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchall()\n    \
                 time.sleep(0.02)\n",
        ])
        .arg(ledger)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// A reader holding one read transaction open: checkpoints cannot pass its snapshot, so the
/// WAL is synced only by the receiver itself.
fn long_reader(model: &PowerModel, ledger: &Path) -> Child {
    model
        .command("python3")
        .args([
            "-c",
            "import sqlite3, sys, time\n\
             db = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             db.execute('BEGIN')\n\
             db.execute('SELECT count(*) FROM jobs').fetchall()\n\
             time.sleep(3600)\n",
        ])
        .arg(ledger)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// What a round of load does besides the receiver.
#[derive(Clone, Copy, PartialEq)]
enum Also {
    Nothing,
    ExternalCheckpointer,
    LongReader,
}

/// Rounds of: start the receiver, send for a random while, cut the power in mid-load, check.
/// Returns how many acknowledged jobs were lost in all, and how many cuts lost unsynced writes.
async fn cut_rounds(rig: &Rig, rounds: usize, also: &[Also]) -> (usize, usize) {
    let mut lost = 0;
    let mut cuts_that_dropped_writes = 0;
    for round in 0..rounds {
        let mut service = rig.start().await;
        let mut helper = match also[round % also.len()] {
            Also::Nothing => None,
            Also::ExternalCheckpointer => Some(external_checkpointer(&rig.model, &rig.ledger)),
            Also::LongReader => Some(long_reader(&rig.model, &rig.ledger)),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let before = rig.acknowledged();
        let senders = rig.load(round, round % 2 == 1, stop.clone());
        rig.until_acknowledged_beyond(before).await;
        tokio::time::sleep(Duration::from_millis(fastrand::u64(300..1200))).await;

        let mut processes: Vec<&mut Child> = vec![&mut service.child];
        processes.extend(helper.as_mut());
        if rig.model.cut(&mut processes) > 0 {
            cuts_that_dropped_writes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for sender in senders {
            sender.await.unwrap();
        }
        lost = rig.lost_in_round(round);
    }
    (lost, cuts_that_dropped_writes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_acknowledged_job_is_lost_to_power_cuts_under_load() {
    let started = Instant::now();
    let rig = Rig::new("");
    let rounds = 8;
    let (lost, dropped) = cut_rounds(
        &rig,
        rounds,
        &[Also::Nothing, Also::ExternalCheckpointer, Also::LongReader],
    )
    .await;
    println!(
        "power cuts (default settings): {rounds} cuts ({dropped} dropped unsynced writes), \
         {} acknowledged, {lost} lost, in {:.1} s",
        rig.acknowledged(),
        started.elapsed().as_secs_f64()
    );
    assert!(rig.acknowledged() > 0);
    assert_eq!(lost, 0, "acknowledged jobs lost to a power cut");
}

/// The control: the model sees a loss when there is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_model_sees_the_losses_of_synchronous_normal() {
    let started = Instant::now();
    let rig = Rig::new("synchronous = \"normal\"");
    let rounds = 6;
    let (lost, dropped) = cut_rounds(&rig, rounds, &[Also::LongReader, Also::Nothing]).await;
    println!(
        "power cuts (synchronous = normal, the control): {rounds} cuts ({dropped} dropped \
         unsynced writes), {} acknowledged, {lost} lost, in {:.1} s",
        rig.acknowledged(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        lost > 0,
        "synchronous = normal lost nothing: the model does not see losses"
    );
}

/// Regression: through a symlink, the WAL syncer synced `<link>-wal` (a file SQLite never
/// writes) instead of the WAL beside the real file, and acknowledged claims no sync covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ledger_reached_through_a_symlink_loses_nothing() {
    let started = Instant::now();
    let rig = Rig::with_ledger_at("service/ledger.sqlite3", "");
    let (real, service_dir) = (rig.disk().join("real"), rig.disk().join("service"));
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(&service_dir).unwrap();
    std::os::unix::fs::symlink(real.join("ledger.sqlite3"), &rig.ledger).unwrap();
    std::fs::write(real.join("ledger.sqlite3"), "").unwrap();
    // Left over beside the link (or made to get past the old refusal to start).
    std::fs::write(service_dir.join("ledger.sqlite3-wal"), "").unwrap();
    let rounds = 4;
    let (lost, dropped) = cut_rounds(&rig, rounds, &[Also::LongReader, Also::Nothing]).await;
    println!(
        "power cuts (symlinked ledger): {rounds} cuts ({dropped} dropped unsynced writes), {} \
         acknowledged, {lost} lost, in {:.1} s",
        rig.acknowledged(),
        started.elapsed().as_secs_f64()
    );
    assert!(rig.acknowledged() > 0);
    assert_eq!(lost, 0, "acknowledged jobs lost to a power cut");
}

/// Regression: after a kill -9, claims committed but not yet synced were read back from the
/// page cache by the restarted receiver, and Sume's retry got "200 duplicate" before anything
/// was synced; a power cut then took the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_a_crash_is_acknowledged_only_once_durable() {
    let started = Instant::now();
    let rig = Rig::new("");
    let rounds = 6;
    let mut retried_duplicates = 0;
    for round in 0..rounds {
        let service = rig.start().await;
        // A reader that stays (a replicator, an operator's shell): checkpoints cannot pass its
        // snapshot, so they sync nothing for the restarted receiver either.
        let mut reader = long_reader(&rig.model, &rig.ledger);
        let stop = Arc::new(AtomicBool::new(false));
        let before = rig.acknowledged();
        let senders = rig.load(round, false, stop.clone());
        rig.until_acknowledged_beyond(before).await;
        tokio::time::sleep(Duration::from_millis(fastrand::u64(300..800))).await;
        service.kill_9();
        stop.store(true, Ordering::Relaxed);
        for sender in senders {
            sender.await.unwrap();
        }
        let committed = rig.committed_but_unanswered();
        let mut service = rig.start().await;
        retried_duplicates += rig.retry(committed).await;
        rig.model.cut(&mut [&mut service.child, &mut reader]);
        let lost = rig.lost();
        assert!(
            lost.is_empty(),
            "round {round}: lost {} acknowledged jobs, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(3)]
        );
    }
    println!(
        "kill -9, restart, retry, power cut: {rounds} rounds, {} acknowledged \
         ({retried_duplicates} as duplicates of claims committed before the kill), 0 lost, in \
         {:.1} s",
        rig.acknowledged(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        retried_duplicates > 0,
        "no kill found a claim committed and unanswered"
    );
}

/// A disk that fails a sync of the database file (the checkpoint's) or of the WAL: the service
/// acknowledges nothing from then on and exits with the status the unit does not restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_disk_stops_the_service_with_the_status_that_is_not_restarted() {
    for failing in ["ledger.sqlite3", "ledger.sqlite3-wal"] {
        let rig = Rig::new("");
        let service = rig.start().await;
        let client = sume_receiver::http_client::new_client();
        for i in 0..20 {
            assert!(deliver(&client, rig.port, &format!("before-{i}")).await);
        }
        rig.model.fail_syncs_of(failing);
        let mut acknowledged_after = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut i = 0;
        while Instant::now() < deadline
            && std::net::TcpStream::connect(("127.0.0.1", rig.port)).is_ok()
        {
            i += 1;
            if deliver(&client, rig.port, &format!("after-{i}")).await {
                acknowledged_after += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let status = service.wait_exit(Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(74), "{failing}: {status}");
        let log = std::fs::read_to_string(rig.dir.path().join("service.log")).unwrap();
        assert!(
            log.contains("reboot before starting the service again"),
            "{log}"
        );
        // The checkpoint's fsync runs every 50 ms: a claim or two may be acknowledged, by a
        // WAL sync that did succeed, before it fails. A failed WAL sync acknowledges nothing.
        if failing.ends_with("-wal") {
            assert_eq!(
                acknowledged_after, 0,
                "acknowledged after the WAL sync failed"
            );
        }
        let unit = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/sume-receiver.service"),
        )
        .unwrap();
        assert!(unit.contains("RestartPreventExitStatus=74"));
    }
}

/// A PostgreSQL server of its own, its data directory on the modelled disk, run as the
/// `postgres` user (it refuses to run as root).
struct Cluster {
    dir: tempfile::TempDir,
    model: PowerModel,
    bin: PathBuf,
    port: u16,
    owner: (u32, u32),
    postmaster: Option<Child>,
}

impl Cluster {
    /// A new cluster, or why there can be none here (not root, no PostgreSQL installed).
    fn new() -> Result<Cluster, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("running a PostgreSQL server as its own user needs root".into());
        }
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .map_err(|_| "PostgreSQL is not installed (/usr/lib/postgresql)".to_owned())?
            .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
            .filter(|bin| bin.join("postgres").exists())
            .max()
            .ok_or("no /usr/lib/postgresql/*/bin/postgres")?;
        let name = std::ffi::CString::new("postgres").unwrap();
        // SAFETY: getpwnam is given a NUL-terminated name; the record is read before any other
        // call could reuse it.
        let owner = unsafe {
            let user = libc::getpwnam(name.as_ptr());
            if user.is_null() {
                return Err("no user named postgres".into());
            }
            ((*user).pw_uid, (*user).pw_gid)
        };
        let dir = tempfile::tempdir().unwrap();
        let (disk, state) = (dir.path().join("disk"), dir.path().join("powercut"));
        std::fs::create_dir(&disk).unwrap();
        let model = PowerModel::new(&disk, &state, SYNC_DELAY_US);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for owned in [&disk, &state] {
            std::os::unix::fs::chown(owned, Some(owner.0), Some(owner.1)).unwrap();
        }
        let cluster = Cluster {
            dir,
            model,
            bin,
            port: free_port(),
            owner,
            postmaster: None,
        };
        // Not under the model: what initdb leaves is the disk's content at the first start.
        let initdb = cluster
            .as_owner(Command::new(cluster.bin.join("initdb")))
            .args(["--no-sync", "--auth=trust", "--username=postgres", "-D"])
            .arg(cluster.data())
            .output()
            .unwrap();
        assert!(initdb.status.success(), "initdb: {initdb:?}");
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("disk/data")
    }

    fn as_owner(&self, mut command: Command) -> Command {
        use std::os::unix::process::CommandExt;
        command
            .uid(self.owner.0)
            .gid(self.owner.1)
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        command
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server under the model (after a cut: crash recovery) and waits for it.
    fn start(&mut self) {
        let mut command = self.as_owner(self.model.command(self.bin.join("postgres")));
        command
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path().join("disk"))
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                // Every file it has open also holds a descriptor of the model's.
                "-c",
                "max_files_per_process=200",
                // The control's asynchronous commits reach the disk only when another commit
                // flushes the WAL.
                "-c",
                "wal_writer_delay=10s",
                "-c",
                "wal_writer_flush_after=1GB",
                "-c",
                "checkpoint_timeout=30s",
            ])
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.path().join("postgres.log"))
                    .unwrap(),
            );
        self.postmaster = Some(command.spawn().unwrap());
        let started = Instant::now();
        let url = self.url();
        while std::thread::scope(|s| {
            s.spawn(|| postgres::Client::connect(&url, postgres::NoTls).is_err())
                .join()
                .unwrap()
        }) {
            let log = std::fs::read_to_string(self.dir.path().join("postgres.log"));
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "PostgreSQL did not start: {}",
                log.unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The power goes for the server and `others`: every server process stops at once, then
    /// all die and the files hold what they held at their last fsync. Returns how many files
    /// lost unsynced writes.
    fn cut(&mut self, others: &mut [&mut Child]) -> usize {
        let mut postmaster = self.postmaster.take().unwrap();
        let pid = postmaster.id() as i32;
        // SAFETY: signals to the server's processes have no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let children = children_of(pid);
        for &child in &children {
            unsafe { libc::kill(child, libc::SIGSTOP) };
        }
        for &child in &children {
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        for &child in &children {
            while is_alive(child) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut processes: Vec<&mut Child> = others.iter_mut().map(|other| &mut **other).collect();
        processes.push(&mut postmaster);
        let changed = self.model.cut(&mut processes);
        // What a reboot clears: the lock file of a server that is gone, its sockets.
        let _ = std::fs::remove_file(self.data().join("postmaster.pid"));
        for entry in std::fs::read_dir(self.dir.path().join("disk")).unwrap() {
            let path = entry.unwrap().path();
            if path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".s.PGSQL")
            {
                std::fs::remove_file(path).unwrap();
            }
        }
        changed
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut postmaster) = self.postmaster.take() {
            // SAFETY: as in `cut`.
            unsafe { libc::kill(postmaster.id() as i32, libc::SIGQUIT) };
            let _ = postmaster.wait();
        }
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&process| parent_and_state(process).is_some_and(|(parent, _)| parent == pid))
        .collect()
}

fn is_alive(pid: i32) -> bool {
    parent_and_state(pid).is_some_and(|(_, state)| state != 'Z')
}

/// From `/proc/PID/stat`: "pid (name) state ppid ..." (the name may hold spaces).
fn parent_and_state(pid: i32) -> Option<(i32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut after_name = stat.rsplit_once(')')?.1.split_whitespace();
    let state = after_name.next()?.chars().next()?;
    Some((after_name.next()?.parse().ok()?, state))
}

/// Commits `INSERT`s with `synchronous_commit = off` until `stop`; the ids committed.
fn asynchronous_commits(url: &str, stop: &AtomicBool) -> HashSet<i64> {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    // Committed durably first (a single query string would be one transaction, committed
    // asynchronously).
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS control (id bigint PRIMARY KEY)")
        .unwrap();
    client
        .batch_execute("SET synchronous_commit = off")
        .unwrap();
    let mut committed = HashSet::new();
    let first: i64 = client
        .query_one("SELECT coalesce(max(id), 0) + 1 FROM control", &[])
        .unwrap()
        .get(0);
    for id in first.. {
        // The server dies in mid-statement at the cut: only what was seen committed counts.
        if stop.load(Ordering::Relaxed)
            || client
                .execute("INSERT INTO control VALUES ($1)", &[&id])
                .is_err()
        {
            break;
        }
        committed.insert(id);
    }
    committed
}

/// Runs `CHECKPOINT` every 100 ms until `stop` (the data files' writes and syncs, and full
/// page images in the WAL after each).
fn checkpoints(url: &str, stop: &AtomicBool) {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    while !stop.load(Ordering::Relaxed) && client.batch_execute("CHECKPOINT").is_ok() {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// PostgreSQL's power cut: the server's processes die and its data directory loses what was
/// not fsynced; no acknowledged claim may be lost. The control, commits with
/// `synchronous_commit = off` made after the last cut, must lose some.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_acknowledged_job_is_lost_when_postgres_loses_power() {
    let test = "no_acknowledged_job_is_lost_when_postgres_loses_power";
    let mut cluster = match Cluster::new() {
        Ok(cluster) => cluster,
        Err(why) => return skip(test, &why),
    };
    let started = Instant::now();
    let rig = Rig::on_postgres(&cluster.url());
    let url = cluster.url();
    let rounds = 4;
    let (mut lost, mut dropped) = (0, 0);
    cluster.start();
    for round in 0..rounds {
        let mut service = rig.start().await;
        let stop = Arc::new(AtomicBool::new(false));
        let before = rig.acknowledged();
        let senders = rig.load(round, round % 2 == 1, stop.clone());
        rig.until_acknowledged_beyond(before).await;
        let checkpointer = (round % 2 == 0).then(|| {
            let (url, stop) = (url.clone(), stop.clone());
            std::thread::spawn(move || checkpoints(&url, &stop))
        });
        tokio::time::sleep(Duration::from_millis(fastrand::u64(500..1500))).await;
        if cluster.cut(&mut [&mut service.child]) > 0 {
            dropped += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for sender in senders {
            sender.await.unwrap();
        }
        if let Some(checkpointer) = checkpointer {
            checkpointer.join().unwrap();
        }
        cluster.start();
        lost = rig.lost_in_round(round);
    }

    // The control, on the same server: asynchronous commits, then the power goes.
    let stop = AtomicBool::new(false);
    let committed = std::thread::scope(|s| {
        let committing = s.spawn(|| asynchronous_commits(&url, &stop));
        std::thread::sleep(Duration::from_millis(500));
        cluster.cut(&mut []);
        stop.store(true, Ordering::Relaxed);
        committing.join().unwrap()
    });
    cluster.start();
    let kept: HashSet<i64> = with_postgres(&url, |client| {
        let rows = client.query("SELECT id FROM control", &[]).unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    });
    let control_lost = committed.difference(&kept).count();
    println!(
        "PostgreSQL power cuts: {rounds} cuts ({dropped} dropped unsynced writes), {} \
         acknowledged, {lost} lost; the control \
         (synchronous_commit = off): {} committed, {control_lost} lost; in {:.1} s",
        rig.acknowledged(),
        committed.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(rig.acknowledged() > 0);
    assert_eq!(lost, 0, "acknowledged jobs lost to a power cut");
    assert!(
        control_lost > 0,
        "asynchronous commits lost nothing: the model does not see PostgreSQL's losses"
    );
}
