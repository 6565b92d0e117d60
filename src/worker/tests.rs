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

/// Regression (the failover suite, under load): a start whose outcome is unknown was said
/// to the sweeper while its job was still held here, for the second its slot waits; a
/// sweep in that second passed the job over (it leaves jobs held here alone) and spent
/// the news, and the job stayed `running` until its lease ended.
#[tokio::test]
async fn a_failed_start_is_left_to_the_sweeper_once_its_job_is_no_longer_held() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&crate::config::LedgerConfig::Sqlite(
        crate::config::SqliteConfig {
            path: dir.path().join("ledger.sqlite3"),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    // Every start fails now.
    ledger.close().await;
    let config = config();
    let breaker = Breaker::new(
        crate::route_name::RouteName::default_route(),
        &config,
        Duration::ZERO,
    );
    let (queue, _receiver) = Queue::new(breaker.clone());
    let job_id = JobId::parse("unconfirmed").unwrap();
    assert!(queue.enqueue(&job_id));
    let run = JobRun {
        route: crate::route_name::RouteName::default_route(),
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
    let running = tokio::spawn(run.run(job_id, crate::hold::Ticket::Attempt));
    tokio::time::sleep(IDLE_LOOK / 2).await;
    assert!(queue.holds("unconfirmed"), "the slot waits a while");
    assert!(
        !queue.take_lease_left_behind(),
        "said while the job was still held"
    );
    running.await.unwrap();
    assert!(!queue.holds("unconfirmed"));
    assert!(queue.take_lease_left_behind(), "never said");
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
