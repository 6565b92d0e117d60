//! Failover under load: two private PostgreSQL clusters in synchronous streaming replication on
//! loopback ports 5441 and 5442 (never the system's cluster), two receivers on one multi-host
//! URL with `target_session_attrs=read-write`, and the three faults of a failover. Runs when
//! SUME_TEST_FAILOVER is set (CI sets it; it needs PostgreSQL's server binaries and, as root, a
//! `postgres` user to run them); skipped and listed otherwise.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use sume_receiver::ledger::Ledger;

const VARIABLE: &str = "SUME_TEST_FAILOVER";
/// The two clusters' ports: the first is the primary at the start.
const PORTS: [u16; 2] = [5441, 5442];
/// Handler slots per receiver: the attempts one fault can interrupt on one receiver.
const CONCURRENCY: usize = 4;
/// The whole suite takes 25-60 s; past this it is stuck, and the watchdog ends the process
/// with what it was doing rather than letting CI wait for its own limit.
const DEADLINE: Duration = Duration::from_secs(300);

/// One private cluster: its data directory and port.
struct Cluster {
    data: PathBuf,
    port: u16,
}

/// Where the clusters live, and how their binaries are run (as `postgres` when we are root:
/// PostgreSQL refuses to run as root).
struct Clusters {
    root: tempfile::TempDir,
    bin: PathBuf,
    as_postgres: bool,
}

impl Clusters {
    fn new() -> Clusters {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's server binaries in /usr/lib/postgresql")
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path().join("bin"))
            .max()
            .expect("a PostgreSQL version");
        let root = tempfile::tempdir().unwrap();
        let as_postgres = nix_uid() == 0;
        if as_postgres {
            let status = Command::new("chown")
                .arg("postgres:")
                .arg(root.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
        Clusters {
            root,
            bin,
            as_postgres,
        }
    }

    /// Runs one of PostgreSQL's programs; panics with its output if it fails.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        progress(&format!("{program} {}", args.join(" ")));
        let output =
            tokio::task::block_in_place(|| self.command(program).args(args).output()).unwrap();
        assert!(
            output.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn data(&self, port: u16) -> PathBuf {
        self.root.path().join(format!("pg{port}"))
    }

    /// A new primary on `port`, synchronous once it has a standby ([`Clusters::synchronous_again`]).
    fn primary(&self, port: u16) -> Cluster {
        let data = self.data(port);
        let dir = data.to_str().unwrap();
        self.run(
            "initdb",
            &["-D", dir, "-U", "postgres", "--auth=trust", "--no-sync"],
        );
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             wal_level = replica\nmax_wal_senders = 10\nhot_standby = on\n\
             synchronous_commit = on\nwal_keep_size = '128MB'\n",
            self.root.path().display()
        );
        append(&data.join("postgresql.conf"), &conf);
        let cluster = Cluster { data, port };
        self.start(&cluster);
        cluster
    }

    /// A standby of `source` on `port` (`pg_basebackup -R`), started.
    fn standby(&self, source: u16, port: u16) -> Cluster {
        let data = self.data(port);
        let _ = std::fs::remove_dir_all(&data);
        let source = source.to_string();
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &source,
                "-U",
                "postgres",
                "-D",
                data.to_str().unwrap(),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
                "--no-sync",
            ],
        );
        append(
            &data.join("postgresql.auto.conf"),
            &format!("port = {port}\n"),
        );
        let cluster = Cluster { data, port };
        self.start(&cluster);
        cluster
    }

    fn start(&self, cluster: &Cluster) {
        let log = self.root.path().join(format!("pg{}.log", cluster.port));
        self.run(
            "pg_ctl",
            &[
                "-D",
                cluster.data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
    }

    fn kill(&self, cluster: &Cluster) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                cluster.data.to_str().unwrap(),
                "-m",
                "immediate",
                "stop",
            ],
        );
    }

    /// Promotes a standby, then lets it commit without a synchronous standby until one is
    /// cloned (as Patroni's non-strict mode does): the test's clusters are two, not three.
    fn promote(&self, cluster: &Cluster) {
        self.run(
            "pg_ctl",
            &["-D", cluster.data.to_str().unwrap(), "-w", "promote"],
        );
        sql(
            cluster.port,
            "ALTER SYSTEM SET synchronous_standby_names = ''; SELECT pg_reload_conf()",
        );
    }

    /// Synchronous replication to the standby that streams from `primary` (any standby).
    fn synchronous_again(&self, primary: &Cluster) {
        sql(
            primary.port,
            "ALTER SYSTEM SET synchronous_standby_names = '*'; SELECT pg_reload_conf()",
        );
        let streaming = (0..100).any(|_| {
            let rows = sql_rows(
                primary.port,
                "SELECT count(*)::text FROM pg_stat_replication WHERE sync_state = 'sync'",
            );
            if rows == ["1"] {
                return true;
            }
            tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(100)));
            false
        });
        assert!(streaming, "the standby never became synchronous");
    }

    fn stop_all(&mut self) {
        for port in PORTS {
            let data = self.data(port);
            if data.join("postmaster.pid").exists() {
                // Never panics: it may run while a failed test unwinds.
                let _ = self
                    .command("pg_ctl")
                    .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
                    .output();
            }
        }
    }
}

/// Stopped however the test ends: the clusters' ports are for the next run.
impl Drop for Clusters {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn unix_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    i64::try_from(now.unwrap().as_millis()).unwrap()
}

fn nix_uid() -> u32 {
    let output = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

fn append(path: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

fn admin_url(port: u16, database: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{database}")
}

/// Runs each statement alone (CREATE DATABASE and ALTER SYSTEM refuse a transaction block).
/// Off the runtime's threads, as every blocking step here: the receivers share them.
fn sql(port: u16, statements: &str) {
    progress(&format!("on {port}: {statements}"));
    tokio::task::block_in_place(|| {
        with_postgres(&admin_url(port, "postgres"), |client| {
            for statement in statements.split("; ") {
                client.batch_execute(statement).unwrap()
            }
        })
    });
}

/// The first column of each row, as text.
fn sql_rows(port: u16, query: &str) -> Vec<String> {
    tokio::task::block_in_place(|| {
        with_postgres(&admin_url(port, "sume"), |client| {
            client
                .query(query, &[])
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect()
        })
    })
}

/// What the suite did last, and when (since its start), for the watchdog.
static PROGRESS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn progress(step: &str) {
    static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let at = STARTED.get_or_init(Instant::now).elapsed().as_secs_f64();
    PROGRESS.lock().unwrap().push(format!("{at:6.1} s  {step}"));
}

/// Ends the process if the suite is not over by [`DEADLINE`], printing its last steps and
/// stopping the clusters under `root`: a stuck step (a blocking call in a runtime that
/// cannot be dropped while it runs) would otherwise hold CI until its own limit.
fn watchdog(root: PathBuf, bin: PathBuf, as_postgres: bool) -> std::sync::mpsc::Sender<()> {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if finished.recv_timeout(DEADLINE) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        let steps = PROGRESS
            .lock()
            .map(|steps| steps.join("\n"))
            .unwrap_or_default();
        // Straight to the process's stderr: the test harness captures what `eprintln!` writes.
        let _ = std::io::stderr().write_all(
            format!(
                "failover suite stuck after {DEADLINE:?}; its steps:\n{steps}\nthe receivers' log: {}/failover-journal.log\n",
                env!("CARGO_TARGET_TMPDIR")
            )
            .as_bytes(),
        );
        for port in PORTS {
            let data = root.join(format!("pg{port}"));
            let mut command = if as_postgres {
                let mut command = Command::new("runuser");
                command
                    .args(["-u", "postgres", "--"])
                    .arg(bin.join("pg_ctl"));
                command
            } else {
                Command::new(bin.join("pg_ctl"))
            };
            let _ = command
                .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
                .output();
        }
        std::process::exit(101);
    });
    done
}

/// Every log line of the process (warnings and errors), to look for read-only errors after
/// the recovery.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<u8>>>);

impl Write for Journal {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Journal {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn since(&self, at: usize) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()[at..]).into_owned()
    }
}

/// One delivery's answer: its job_id, status, and when it was sent and answered.
#[derive(Clone, Debug)]
struct Sent {
    job_id: String,
    /// A new job_id, not a resend (which may be answered from memory, without the ledger).
    fresh: bool,
    status: u16,
    sent: Instant,
    answered: Instant,
}

/// What one fault did to the deliveries and the work.
struct Figures {
    fault: &'static str,
    /// When the fault began and when the new primary was there (the same for a fault
    /// without a promotion), on the wall clock the ledger's times use.
    at_ms: i64,
    promoted_ms: i64,
    acknowledged: usize,
    unavailable: Duration,
    first_claim_after_promotion: Duration,
}

/// A test of its own runtime, so that the watchdog stays armed until the runtime is dropped.
#[test]
fn three_failovers_under_load_lose_nothing_and_recover_without_a_restart() {
    let test = "three_failovers_under_load_lose_nothing_and_recover_without_a_restart";
    if std::env::var_os(VARIABLE).is_none() {
        skip(
            test,
            &format!(
                "set {VARIABLE}=1 (needs PostgreSQL's server binaries; as root, a postgres user)"
            ),
        );
        return;
    }
    // The receivers' log, to find read-only errors after the recovery.
    let journal = Journal::default();
    let writer = journal.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let clusters = Clusters::new();
    let armed = watchdog(
        clusters.root.path().to_owned(),
        clusters.bin.clone(),
        clusters.as_postgres,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // Backend::run: the receivers' config is PostgreSQL's (the database is the clusters').
    runtime.block_on(Backend::Postgres.run(test, failovers(&clusters, journal)));
    drop(runtime);
    drop(clusters);
    let _ = armed.send(());
}

async fn failovers(clusters: &Clusters, journal: Journal) {
    let started = Instant::now();
    let [first, second] = PORTS;
    let mut primary = clusters.primary(first);
    sql(
        first,
        "CREATE ROLE sume LOGIN; CREATE DATABASE sume OWNER sume",
    );
    let mut standby = clusters.standby(first, second);
    clusters.synchronous_again(&primary);
    let url = format!(
        "postgres://sume@127.0.0.1:{first},127.0.0.1:{second}/sume?target_session_attrs=read-write"
    );
    let runs = clusters.root.path().join("runs");
    let handler = format!(
        "[server]\nclaim_timeout = \"2s\"\n[handler]\ncommand = [\"sh\", \"-c\", \"echo $SUME_JOB_ID >> {}\"]\n\
         concurrency = {CONCURRENCY}\nbackoff = \"50ms\"\nmax_backoff = \"200ms\"\ntimeout = \"5s\"\n\
         [sweeper]\ninterval = \"1s\"\n",
        runs.display()
    );
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("postgres-url"), &url).unwrap();
        receivers.push(Arc::new(TestServer::start_in(dir, &handler).await));
    }
    // A third ledger on the same URL, idle, to see what wakes a receiver's worker.
    let watcher = Ledger::open(&receivers[0].config.database).await.unwrap();

    // Load on both receivers: new job_ids, and 15 % resends of earlier ones.
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..8 {
        let (stop, next, sent) = (stop.clone(), next.clone(), sent.clone());
        let receiver = receivers[sender % 2].clone();
        senders.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let fresh = next.load(Ordering::SeqCst);
                let resend = fresh > 0 && fastrand::u8(..100) < 15;
                let job_id = if resend {
                    format!("failover-{}", fastrand::usize(..fresh))
                } else {
                    format!("failover-{}", next.fetch_add(1, Ordering::SeqCst))
                };
                let at = Instant::now();
                let answer = receiver.deliver(&job_body(&job_id)).await;
                let status = answer.status.as_u16();
                assert!(matches!(status, 200 | 503), "{job_id}: {status}");
                if status == 503 {
                    assert!(
                        answer.headers.get("retry-after").is_some(),
                        "503 without Retry-After"
                    );
                }
                sent.lock().unwrap().push(Sent {
                    job_id,
                    fresh: !resend,
                    status,
                    sent: at,
                    answered: Instant::now(),
                });
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    let settle = Duration::from_secs(2);
    let mut figures = Vec::new();

    // 1. The primary killed, the standby promoted a second later.
    tokio::time::sleep(settle).await;
    progress("fault 1: the primary killed");
    let fault = Instant::now();
    clusters.kill(&primary);
    tokio::time::sleep(Duration::from_secs(1)).await;
    clusters.promote(&standby);
    let promoted = Instant::now();
    tokio::time::sleep(settle).await;
    figures.push(measure(
        "primary killed, standby promoted 1 s later",
        &sent,
        fault,
        promoted,
    ));
    // The old primary comes back as the new one's standby: the URL's first host is read-only.
    primary = clusters.standby(second, first);
    clusters.synchronous_again(&standby);
    std::mem::swap(&mut primary, &mut standby);

    // 2. Every receiver connection terminated, the first host a standby.
    tokio::time::sleep(settle).await;
    progress("fault 2: sessions terminated");
    let fault = Instant::now();
    sql(
        primary.port,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'sume'",
    );
    tokio::time::sleep(settle).await;
    figures.push(measure(
        "sessions terminated, the first host a standby",
        &sent,
        fault,
        fault,
    ));

    // 3. The primary turns read-only under open connections while the standby is promoted.
    tokio::time::sleep(settle).await;
    progress("fault 3: the primary read-only");
    let fault = Instant::now();
    let fault_log = journal.len();
    sql(
        primary.port,
        "ALTER SYSTEM SET default_transaction_read_only = on; SELECT pg_reload_conf()",
    );
    clusters.promote(&standby);
    let promoted = Instant::now();
    tokio::time::sleep(settle + settle).await;
    figures.push(measure(
        "read-only flip under open connections, standby promoted",
        &sent,
        fault,
        promoted,
    ));
    std::mem::swap(&mut primary, &mut standby);
    let flipped_log = journal.len();
    tokio::time::sleep(settle).await;
    stop.store(true, Ordering::SeqCst);
    progress("load stopped");
    while let Some(result) = senders.join_next().await {
        result.unwrap();
    }

    // Kept for a failed run's reader.
    std::fs::write(
        concat!(env!("CARGO_TARGET_TMPDIR"), "/failover-journal.log"),
        journal.since(0),
    )
    .unwrap();
    let sent = sent.lock().unwrap().clone();
    // Each receiver claims again: a commit left waiting for a standby that was promoted away
    // is given up (it took a claim batch slot for ever, and with both taken the receiver
    // refused every claim while the other served the load).
    for (index, receiver) in receivers.iter().enumerate() {
        let job_id = format!("after-the-failovers-{index}");
        let mut status = 0;
        for _ in 0..40 {
            status = receiver.deliver(&job_body(&job_id)).await.status.as_u16();
            if status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(
            status, 200,
            "receiver {index} claims nothing after the failovers"
        );
    }
    let acknowledged: std::collections::HashSet<&str> = sent
        .iter()
        .filter(|answer| answer.status == 200)
        .map(|answer| answer.job_id.as_str())
        .collect();
    // 0 acknowledged lost: every 200's job_id is on the last primary.
    let stored: std::collections::HashSet<String> =
        sql_rows(primary.port, "SELECT job_id FROM jobs")
            .into_iter()
            .collect();
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|id| !stored.contains(**id))
        .collect();
    assert!(lost.is_empty(), "acknowledged, then lost: {lost:?}");
    // Every acknowledged job ends done: none left running by a failover.
    progress("waiting for every job to be done");
    let mut unfinished = Vec::new();
    for _ in 0..150 {
        unfinished = sql_rows(
            primary.port,
            "SELECT job_id || ' ' || state FROM jobs WHERE state <> 'done'",
        );
        if unfinished.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(unfinished.is_empty(), "not done: {unfinished:?}");
    // Re-runs bounded by the attempts the faults could interrupt.
    let run_lines = std::fs::read_to_string(&runs).unwrap_or_default();
    let runs_total = run_lines.lines().count();
    let distinct: std::collections::HashSet<&str> = run_lines.lines().collect();
    let reruns = runs_total - distinct.len();
    let bound = 3 * receivers.len() * CONCURRENCY;
    assert!(
        reruns <= bound,
        "{reruns} re-runs, more than the {bound} attempts three faults could interrupt"
    );
    // Every ledger LISTENs on the last primary, and a NOTIFY there (what a claim sends) wakes
    // the idle one: not its poll, which never resolves `work_added_elsewhere`.
    let listening = sql_rows(
        primary.port,
        "SELECT count(*)::text FROM pg_stat_activity WHERE application_name LIKE '%(LISTEN)'",
    );
    assert_eq!(listening, ["3"], "each ledger LISTENs on the new primary");
    // The wake-ups of its reconnections, if any are still pending.
    while tokio::time::timeout(Duration::from_millis(200), watcher.work_added_elsewhere())
        .await
        .is_ok()
    {}
    with_postgres(&admin_url(primary.port, "sume"), |client| {
        client.batch_execute("NOTIFY sume_jobs").unwrap()
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(5), watcher.work_added_elsewhere())
            .await
            .is_ok(),
        "a NOTIFY on the new primary never reached the idle ledger"
    );
    watcher.close().await;
    // Ready, the work side writing, and no read-only or recovery error logged once recovered.
    for receiver in &receivers {
        let answer = receiver
            .request(hyper::Method::GET, "/readyz", &[], "")
            .await
            .unwrap();
        let body = json(&answer);
        assert_eq!(answer.status, 200, "{body}");
        assert_eq!(body["work_side"]["can_write"], true, "{body}");
    }
    let after = journal.since(flipped_log);
    for needle in ["read-only transaction", "during recovery", "read_only"] {
        assert!(
            !after.contains(needle),
            "{needle:?} logged after the recovery:\n{after}"
        );
    }
    let during = journal.since(fault_log);
    assert!(
        during.contains("lost the PostgreSQL primary"),
        "the loss is logged:\n{during}"
    );

    println!(
        "failover suite: {} deliveries, {} acknowledged, 0 lost, {reruns} re-runs, {:.1} s",
        sent.len(),
        acknowledged.len(),
        started.elapsed().as_secs_f64()
    );
    for figure in &figures {
        // The work side is back when a job finishes on the new primary.
        let finished = sql_rows(
            primary.port,
            &format!(
                "SELECT (min(finished_at) - {})::text FROM jobs WHERE finished_at >= {}",
                figure.at_ms, figure.promoted_ms
            ),
        );
        println!(
            "  {}: {} acknowledged during and after, unavailable {} ms, first claim {} ms after the promotion, work back {} ms after the fault",
            figure.fault,
            figure.acknowledged,
            figure.unavailable.as_millis(),
            figure.first_claim_after_promotion.as_millis(),
            finished[0]
        );
        assert!(
            figure.first_claim_after_promotion <= Duration::from_secs(5),
            "{}: no new claim within 5 s of the promotion",
            figure.fault
        );
    }
    progress("stopping the receivers");
    for receiver in receivers {
        Arc::into_inner(receiver).unwrap().stop().await.0.unwrap();
    }
}

/// A fault's figures from the answers so far: unavailability from the first 503 after the
/// fault to the first claim (a new job_id's 200) sent after that; the first claim sent after
/// the promotion.
fn measure(
    fault: &'static str,
    sent: &Mutex<Vec<Sent>>,
    at: Instant,
    promoted: Instant,
) -> Figures {
    let wall = |instant: Instant| unix_ms() - i64::try_from(instant.elapsed().as_millis()).unwrap();
    let sent = sent.lock().unwrap();
    let after: Vec<&Sent> = sent.iter().filter(|answer| answer.sent >= at).collect();
    let claimed = |answer: &&&Sent| answer.status == 200 && answer.fresh;
    let first_refusal = after
        .iter()
        .filter(|answer| answer.status == 503)
        .map(|answer| answer.answered)
        .min();
    let unavailable = first_refusal.map_or(Duration::ZERO, |refused| {
        after
            .iter()
            .filter(|answer| claimed(answer) && answer.sent >= refused)
            .map(|answer| answer.answered - refused)
            .min()
            .unwrap_or(Duration::MAX)
    });
    let first_claim_after_promotion = after
        .iter()
        .filter(|answer| claimed(answer) && answer.sent >= promoted)
        .map(|answer| answer.answered - promoted)
        .min()
        .unwrap_or(Duration::MAX);
    Figures {
        fault,
        at_ms: wall(at),
        promoted_ms: wall(promoted),
        acknowledged: after.iter().filter(|answer| answer.status == 200).count(),
        unavailable,
        first_claim_after_promotion,
    }
}
