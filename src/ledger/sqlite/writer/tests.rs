//! The writer thread alone: its batches, its syncs and its queue.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use super::super::jobs::CLAIM_SQL;
use super::super::wal_sync::held_sync;
use super::*;
use crate::config::SqliteConfig;
use crate::job_id::JobId;
use crate::ledger::model::Source;

fn ledger(dir: &tempfile::TempDir) -> (Connection, Connection) {
    let config = SqliteConfig {
        path: dir.path().join("ledger.sqlite3"),
        ..SqliteConfig::default()
    };
    let (conn, _) = super::super::open_for_writing(&config).unwrap();
    (conn, Connection::open(&config.path).unwrap())
}

fn claim(job_id: &str) -> NewClaim {
    NewClaim {
        job_id: JobId::parse(job_id).unwrap(),
        event_type: None,
        body: "{}".into(),
        source: Source::Webhook,
        trace_context: None,
        routing: crate::ledger::model::Routing::default_route(),
    }
}

/// Regression: every claim made SQLite copy the pages it was about to change into a
/// statement journal (`CLAIM_SQL` says why). A statement may abort midway when its program
/// checks a constraint with ABORT (`Halt`/`HaltIfNull` with P2 = 2); the claim's checks are
/// FAIL (3), and still refuse what they refused, leaving nothing behind.
#[test]
fn a_claim_may_not_abort_midway_so_sqlite_journals_none_of_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, reader) = ledger(&dir);
    let mut explain = writer.prepare(&format!("EXPLAIN {CLAIM_SQL}")).unwrap();
    let checks: Vec<(String, i64)> = explain
        .query_map([rusqlite::types::Null; 8], |row| {
            Ok((row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .filter(|(opcode, code, _): &(String, i64, i64)| opcode.starts_with("Halt") && *code != 0)
        .map(|(opcode, _, on_error)| (opcode, on_error))
        .collect();
    assert!(!checks.is_empty());
    assert!(
        checks.iter().all(|(_, on_error)| *on_error == 3),
        "{checks:?}"
    );

    writer.execute_batch("BEGIN").unwrap();
    let no_time = rusqlite::params![
        "j1",
        "webhook",
        None::<String>,
        "{}",
        None::<i64>,
        "claimed",
        None::<String>,
        None::<String>
    ];
    let refused = writer.execute(CLAIM_SQL, no_time).unwrap_err().to_string();
    assert!(refused.contains("NOT NULL constraint failed"), "{refused}");
    writer.execute_batch("COMMIT").unwrap();
    assert!(!stored(&reader, "j1"));
}

fn stored(reader: &Connection, job_id: &str) -> bool {
    reader
        .query_row(
            "SELECT count(*) FROM jobs WHERE job_id = ?1",
            [job_id],
            |row| row.get::<_, i64>(0),
        )
        .unwrap()
        == 1
}

/// A writer thread whose WAL syncs wait for the test.
struct HeldWriter {
    writer: Arc<Writer>,
    thread: std::thread::JoinHandle<()>,
    syncing: std_mpsc::Receiver<String>,
    release: std_mpsc::Sender<()>,
    reader: Connection,
    _dir: tempfile::TempDir,
}

impl HeldWriter {
    fn start() -> HeldWriter {
        let dir = tempfile::tempdir().unwrap();
        let (conn, reader) = ledger(&dir);
        let (sync, syncing, release) = held_sync();
        let durability = Durability::AfterWalSync(sync);
        let (writer, thread) = Writer::start(conn, 64, durability, Arc::default(), || ()).unwrap();
        HeldWriter {
            writer: Arc::new(writer),
            thread,
            syncing,
            release,
            reader,
            _dir: dir,
        }
    }

    fn claim(
        &self,
        job_id: &'static str,
    ) -> tokio::task::JoinHandle<Result<ClaimOutcome, StorageError>> {
        let writer = self.writer.clone();
        tokio::spawn(async move { writer.try_claim(claim(job_id)).await })
    }

    /// The name of the thread that runs it.
    fn wait_for_a_sync_to_begin(&self) -> String {
        tokio::task::block_in_place(|| self.syncing.recv().unwrap())
    }

    fn stored(&self, job_id: &str) -> bool {
        stored(&self.reader, job_id)
    }

    fn stop(self) {
        self.writer.stop();
        drop(self.release);
        self.thread.join().unwrap();
    }
}

/// On a fast disk the writer syncs the WAL itself: a hand-off to the syncer's thread would
/// cost both threads a wake-up per batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_answered_after_the_wal_sync_on_the_writers_thread() {
    let held = HeldWriter::start();
    let answer = held.claim("job-a");
    assert_eq!(held.wait_for_a_sync_to_begin(), "ledger-writer");
    assert!(held.stored("job-a"), "committed before its sync");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!answer.is_finished(), "answered before the WAL was synced");

    held.release.send(()).unwrap();
    assert_eq!(answer.await.unwrap().unwrap(), ClaimOutcome::Claimed);
    held.stop();
}

/// Regression: the service's own changes could fill the whole queue while the disk
/// stalled (one per handler slot, two once a slot takes its next job while its last
/// job's end commits), and every delivery meanwhile was turned away with a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_own_changes_leave_claims_room_in_the_queue() {
    let held = HeldWriter::start();
    let first = held.claim("job-a");
    held.wait_for_a_sync_to_begin();
    let changes: Vec<_> = (0..QUEUE_CAPACITY)
        .map(|_| {
            let writer = held.writer.clone();
            tokio::spawn(async move {
                writer
                    .submit(|conn| conn.execute("UPDATE job_counts SET jobs = jobs", []))
                    .await
            })
        })
        .collect();
    let filled = async {
        while held.writer.queued() < OWN_CHANGES {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), filled)
        .await
        .expect("the changes were never queued");
    // The rest had their chance to queue too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(held.writer.queued(), OWN_CHANGES);
    let second = held.claim("job-b");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!second.is_finished(), "the claim found no room: {second:?}");
    for _ in 0..QUEUE_CAPACITY {
        held.release.send(()).unwrap();
    }
    assert_eq!(first.await.unwrap().unwrap(), ClaimOutcome::Claimed);
    assert_eq!(second.await.unwrap().unwrap(), ClaimOutcome::Claimed);
    for change in changes {
        change.await.unwrap().unwrap();
    }
    held.stop();
}

#[test]
fn syncs_are_handed_over_only_for_a_slow_disk_or_a_backlog() {
    let fast = Duration::from_micros(400);
    let slow = Duration::from_micros(800);
    assert!(
        !overlap_pays(0, (1, 0), Duration::ZERO),
        "nothing synced yet"
    );
    assert!(!overlap_pays(5, (20, 18), fast));
    assert!(overlap_pays(0, (1, 1), slow));
    // A backlog: as many queued as the last two batches had.
    assert!(overlap_pays(20, (20, 18), fast));
    assert!(
        !overlap_pays(5, (3, 20), fast),
        "one small batch is no backlog"
    );
}

#[test]
fn a_failed_sync_on_the_writers_thread_fails_the_claim_and_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let (conn, _reader) = ledger(&dir);
    let failing: super::super::wal_sync::SyncWal = Box::new(|| Err(std::io::Error::other("EIO")));
    let failure = Arc::new(Failure::default());
    let answering = Answering::start(
        Durability::AfterWalSync(failing),
        failure.clone(),
        Answerer::inline(),
    )
    .unwrap();
    let answers = [
        commit_claim_alone(&conn, "job-a", &answering),
        commit_claim_alone(&conn, "job-b", &answering),
    ];
    answering.finish();
    assert_eq!(failure.cause(), Some(Cause::StorageLost));
    for mut answer in answers {
        let error = answer.try_recv().unwrap().unwrap_err().to_string();
        assert!(error.contains("fsync of the WAL failed: EIO"), "{error}");
    }
}

/// One claim committed as the writer thread commits it with nothing else queued: its sync
/// runs on this thread.
fn commit_claim_alone(
    conn: &Connection,
    job_id: &str,
    answering: &Answering,
) -> oneshot::Receiver<Result<ClaimOutcome, StorageError>> {
    let (item, answer) = claim_item(claim(job_id));
    let settled = commit_batch(
        conn,
        std::iter::once(item),
        &mut Throttled::new("claims failed"),
        &answering.failure,
    );
    answering.answer(settled, answering.overlap_pays(0, (1, 1)));
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_disks_syncs_run_on_the_syncer_thread_while_the_next_batch_commits() {
    let held = HeldWriter::start();
    let first = held.claim("job-a");
    assert_eq!(held.wait_for_a_sync_to_begin(), "ledger-writer");
    // A slow disk: this sync takes far longer than SLOW_SYNC.
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release.send(()).unwrap();
    first.await.unwrap().unwrap();

    let second = held.claim("job-b");
    assert_eq!(held.wait_for_a_sync_to_begin(), "ledger-wal-sync");
    let third = held.claim("job-c");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        held.stored("job-c"),
        "on a slow disk, the next commit does not wait for the running sync"
    );
    assert!(!third.is_finished(), "answered before its own sync");

    held.release.send(()).unwrap();
    second.await.unwrap().unwrap();
    held.wait_for_a_sync_to_begin();
    held.release.send(()).unwrap();
    assert_eq!(third.await.unwrap().unwrap(), ClaimOutcome::Claimed);
    held.stop();
}

#[test]
fn the_next_batch_commits_while_the_last_one_is_synced() {
    let dir = tempfile::tempdir().unwrap();
    let (conn, reader) = ledger(&dir);
    let (sync, syncing, release) = held_sync();
    let answering = Answering::start(
        Durability::AfterWalSync(sync),
        Arc::default(),
        Answerer::inline(),
    )
    .unwrap();
    let first = commit_claims(&conn, vec![claim("job-a")], &answering);
    syncing.recv().unwrap();
    let second = commit_claims(&conn, vec![claim("job-b"), claim("job-a")], &answering);
    assert!(stored(&reader, "job-b"), "committed during the first sync");

    release.send(()).unwrap();
    syncing.recv().unwrap();
    release.send(()).unwrap();
    answering.finish();
    let outcomes = |answers: Vec<oneshot::Receiver<Result<ClaimOutcome, StorageError>>>| {
        answers
            .into_iter()
            .map(|mut answer| answer.try_recv().unwrap().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(outcomes(first), [ClaimOutcome::Claimed]);
    assert_eq!(
        outcomes(second),
        [ClaimOutcome::Claimed, ClaimOutcome::Duplicate]
    );
}

/// A batch's changes run bare, once, when none fails. When one fails, the batch runs again
/// with each change in its savepoint: the failed change's statements are undone, and only
/// those; every caller hears the result of its change's last run.
#[test]
fn a_failed_change_undoes_its_own_statements_and_no_others() {
    use std::sync::atomic::AtomicUsize;
    let dir = tempfile::tempdir().unwrap();
    let (conn, reader) = ledger(&dir);
    let runs = Arc::new(AtomicUsize::new(0));
    // A change that stores `job_id`, then fails if asked to (its insert is the part a failure
    // must take back); it answers which run of all the changes' runs it was.
    let change = |job_id: &'static str, fails: bool| {
        let runs = runs.clone();
        change_item(move |conn| {
            let run = runs.fetch_add(1, Ordering::SeqCst);
            insert_claim(conn, &claim(job_id), now_ms())?;
            if fails {
                return Err(rusqlite::Error::QueryReturnedNoRows);
            }
            Ok(run)
        })
    };
    let commit = |items: Vec<BatchItem>| {
        let settled = commit_batch(
            &conn,
            items.into_iter(),
            &mut Throttled::new("test batch failed"),
            &Failure::default(),
        );
        for completion in settled.completions {
            completion.complete(settled.outcome.clone());
        }
    };

    let (a, mut a_answer) = change("job-a", false);
    let (b, mut b_answer) = change("job-b", false);
    commit(vec![a, b]);
    assert_eq!(a_answer.try_recv().unwrap(), Ok(0));
    assert_eq!(b_answer.try_recv().unwrap(), Ok(1));
    runs.store(0, Ordering::SeqCst);

    let (c, mut c_answer) = change("job-c", false);
    let (failing, mut failing_answer) = change("job-failing", true);
    let (claimed, mut claimed_answer) = claim_item(claim("job-claimed"));
    let (d, mut d_answer) = change("job-d", false);
    commit(vec![c, failing, claimed, d]);
    // Bare: runs 0 (c) and 1 (the failure); then, each in its savepoint: 2, 3 and 4.
    assert_eq!(c_answer.try_recv().unwrap(), Ok(2));
    assert_eq!(
        failing_answer.try_recv().unwrap(),
        Err(StorageError::from(rusqlite::Error::QueryReturnedNoRows))
    );
    assert_eq!(
        claimed_answer.try_recv().unwrap(),
        Ok(ClaimOutcome::Claimed)
    );
    assert_eq!(d_answer.try_recv().unwrap(), Ok(4));
    for job_id in ["job-a", "job-b", "job-c", "job-claimed", "job-d"] {
        assert!(stored(&reader, job_id), "{job_id}");
    }
    assert!(!stored(&reader, "job-failing"));

    // A change after which SQLite has rolled the transaction back itself (as after a full
    // disk): the batch fails, runs no further and not again, and commits nothing.
    runs.store(0, Ordering::SeqCst);
    let (e, mut e_answer) = change("job-e", false);
    let (lost, _) = change_item(|conn| {
        conn.execute_batch("ROLLBACK")?;
        Err::<(), _>(rusqlite::Error::QueryReturnedNoRows)
    });
    let (f, mut f_answer) = change("job-f", false);
    commit(vec![e, lost, f]);
    assert!(e_answer.try_recv().unwrap().is_err());
    assert!(f_answer.try_recv().unwrap().is_err());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only the change before it ran"
    );
    assert!(!stored(&reader, "job-e") && !stored(&reader, "job-f"));
}
