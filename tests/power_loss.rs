//! Power cuts under load, on a model of a disk that drops every write not fsynced
//! (tests/powercut/powercut.c): no acknowledged job may be lost, and the model must see the
//! losses of `synchronous = "normal"`, which acknowledges before the disk has the claim.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
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
    sent: Arc<Mutex<HashSet<String>>>,
    acknowledged: Arc<Mutex<HashSet<String>>>,
}

impl Rig {
    fn new(database_keys: &str) -> Rig {
        Self::with_ledger_at("ledger.sqlite3", database_keys)
    }

    /// The ledger at `ledger` below the modelled disk.
    fn with_ledger_at(ledger: &str, database_keys: &str) -> Rig {
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

    /// Acknowledged jobs the ledger does not hold (opened as the next start would, after a cut).
    fn lost(&self) -> Vec<String> {
        let conn = rusqlite::Connection::open(&self.ledger).unwrap();
        let mut statement = conn.prepare("SELECT job_id FROM jobs").unwrap();
        let held: HashSet<String> = statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
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

    fn acknowledged(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
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
        let senders = rig.load(round, round % 2 == 1, stop.clone());
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
        let lost_now = rig.lost();
        if !lost_now.is_empty() {
            eprintln!(
                "round {round}: {} acknowledged jobs lost, e.g. {:?}",
                lost_now.len(),
                &lost_now[..lost_now.len().min(3)]
            );
        }
        lost = lost_now.len();
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
        let senders = rig.load(round, false, stop.clone());
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
