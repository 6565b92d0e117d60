//! The worker's queue, backoff and attempt runs, alone.

use super::*;
use crate::config::HandlerKind;

fn config() -> HandlerConfig {
    HandlerConfig {
        ca_file: None,
        kind: HandlerKind::Command(vec!["true".into()]),
        timeout: Duration::from_secs(1),
        concurrency: 1,
        max_attempts: 5,
        backoff: Duration::from_secs(10),
        max_backoff: Duration::from_secs(60),
        hold: Default::default(),
    }
}

#[test]
fn backoff_doubles_with_jitter_and_is_capped() {
    let config = config();
    for _ in 0..100 {
        let first = backoff(&config, 1).as_secs_f64();
        assert!((8.0..=12.0).contains(&first), "{first}");
        let third = backoff(&config, 3).as_secs_f64();
        assert!((32.0..=48.0).contains(&third), "{third}");
        let late = backoff(&config, 40).as_secs_f64();
        assert!((48.0..=72.0).contains(&late), "{late}");
    }
}

/// A ledger of its own in `dir`.
async fn sqlite_ledger(dir: &tempfile::TempDir) -> Arc<Ledger> {
    Ledger::open(&crate::config::LedgerConfig::Sqlite(
        crate::config::SqliteConfig {
            path: dir.path().join("ledger.sqlite3"),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
}

/// A run of `config`'s handler on the default route, and the queue that holds `job_id` for it.
fn job_run(
    ledger: Arc<Ledger>,
    config: HandlerConfig,
    job_id: &JobId,
    ends: Arc<Semaphore>,
) -> (JobRun, Queue) {
    let breaker = Breaker::new(
        crate::route_name::RouteName::default_route(),
        &config,
        Duration::ZERO,
    );
    let (queue, _receiver) = Queue::new(breaker.clone());
    assert!(queue.enqueue(job_id));
    let run = JobRun {
        route: crate::route_name::RouteName::default_route(),
        ends,
        ledger,
        handler: Arc::new(Handler::new(config.kind.clone(), None).unwrap()),
        config,
        lease_slack: Duration::ZERO,
        queue: queue.clone(),
        stop_handlers: CancellationToken::new(),
        start_failures: Arc::new(Mutex::new(Throttled::new("cannot start jobs"))),
        breaker,
        tracer: Tracer::default(),
    };
    (run, queue)
}

/// Regression (the failover suite, under load): a start whose outcome is unknown was said
/// to the sweeper while its job was still held here, for the second its slot waits; a
/// sweep in that second passed the job over (it leaves jobs held here alone) and spent
/// the news, and the job stayed `running` until its lease ended.
#[tokio::test]
async fn a_failed_start_is_left_to_the_sweeper_once_its_job_is_no_longer_held() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = sqlite_ledger(&dir).await;
    // Every start fails now.
    ledger.close().await;
    let job_id = JobId::parse("unconfirmed").unwrap();
    let slots = Arc::new(Semaphore::new(1));
    let (run, queue) = job_run(ledger, config(), &job_id, Arc::new(Semaphore::new(1)));
    let slot = slots.clone().acquire_owned().await.unwrap();
    let running = tokio::spawn(run.run(job_id, crate::hold::Ticket::Attempt, slot));
    tokio::time::sleep(IDLE_LOOK / 2).await;
    assert!(queue.holds("unconfirmed"), "the job waits a while");
    assert_eq!(slots.available_permits(), 0, "and its slot with it");
    assert!(
        !queue.take_lease_left_behind(),
        "said while the job was still held"
    );
    running.await.unwrap();
    assert!(!queue.holds("unconfirmed"));
    assert!(queue.take_lease_left_behind(), "never said");
}

/// The slot is given back once the handler is done, before the end is recorded: the next
/// job's start then goes to the writer with this end and shares its commit. The job stays
/// held (and `running` in the ledger) until its end is recorded.
#[tokio::test]
async fn a_slot_takes_the_next_job_while_the_end_of_the_last_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = sqlite_ledger(&dir).await;
    let job_id = JobId::parse("ends-later").unwrap();
    let claim = crate::ledger::NewClaim {
        job_id: job_id.clone(),
        event_type: None,
        body: "{}".into(),
        source: crate::ledger::Source::Webhook,
        trace_context: None,
        routing: crate::ledger::Routing::default_route(),
    };
    ledger.claim(claim).await.unwrap();
    // A handler that runs on (2 s) while the test closes the ledger under it; its end can then
    // not be recorded, and is tried again every IDLE_LOOK while its lease lasts.
    let config = HandlerConfig {
        kind: HandlerKind::Command(vec!["sleep".into(), "2".into()]),
        timeout: Duration::from_secs(10),
        ..config()
    };
    let (slots, ends) = (Arc::new(Semaphore::new(1)), Arc::new(Semaphore::new(1)));
    let (run, queue) = job_run(ledger.clone(), config, &job_id, ends.clone());
    let slot = slots.clone().acquire_owned().await.unwrap();
    let running = tokio::spawn(run.run(job_id.clone(), crate::hold::Ticket::Attempt, slot));
    let started = async {
        while ledger
            .show_job(&job_id)
            .await
            .unwrap()
            .unwrap()
            .summary
            .state
            != "running"
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("never started");
    assert_eq!(slots.available_permits(), 0, "the handler runs in the slot");
    ledger.close().await;
    // The slot comes back when the handler is done (2 s); before the fix, only once the end
    // was recorded or given up, at the lease's end (9 s).
    let given_back = slots.clone().acquire_owned();
    let slot = tokio::time::timeout(Duration::from_secs(5), given_back).await;
    assert!(
        slot.is_ok(),
        "the slot was not given back once the handler was done"
    );
    assert!(!running.is_finished(), "the end is still being tried");
    assert!(
        queue.holds("ends-later"),
        "the job stays held until its end is recorded"
    );
    assert_eq!(
        ends.available_permits(),
        0,
        "the end holds a place while it is tried"
    );
    running.abort();
}

#[test]
fn queue_refuses_a_job_it_already_holds() {
    let (queue, mut receiver) = Queue::new(Breaker::new(
        crate::route_name::RouteName::default_route(),
        &config(),
        Duration::ZERO,
    ));
    let a = JobId::parse("a").unwrap();
    assert!(queue.enqueue(&a));
    assert!(!queue.enqueue(&a));
    assert!(queue.holds("a"));
    assert_eq!(receiver.try_recv().unwrap(), a);
    queue.release(&a);
    assert!(queue.enqueue(&a));
}
