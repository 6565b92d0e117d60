//! The ledger contract's conformance suite: every operation, through `Ledger`, on both backends
//! (PostgreSQL where SUME_TEST_POSTGRES_URL names a server). A backend passes when it behaves
//! as the contract says, whatever its SQL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{
    self, Attempt, AttemptEnd, ClaimOutcome, Failure, LeasedAttempt, Leases, Ledger, MinuteRollup,
    NewClaim, PollResult, ProbeMove, Release, RetentionStep, RetryError, Source, State,
    StorageError,
};

fn new_claim(job_id: &str) -> NewClaim {
    NewClaim {
        job_id: JobId::parse(job_id).unwrap(),
        event_type: Some(ledger_event_type()),
        body: job_body(job_id).into(),
        source: Source::Webhook,
    }
}

/// A job id the test knows to be valid.
fn id(text: &str) -> JobId {
    JobId::parse(text).unwrap()
}

fn ledger_event_type() -> sume_receiver::event_type::EventType {
    sume_receiver::event_type::EventType::parse("job.completed").unwrap()
}

/// A fresh service ledger; the directory lives as long as the test holds it.
async fn fresh() -> (tempfile::TempDir, Arc<Ledger>) {
    let dir = tempfile::tempdir().unwrap();
    let (_config, ledger) = open_ledger(dir.path()).await;
    (dir, ledger)
}

async fn claimed(ledger: &Ledger, job_id: &str) {
    assert_eq!(
        ledger.claim(new_claim(job_id)).await.unwrap(),
        ClaimOutcome::Claimed
    );
}

async fn started(ledger: &Ledger, job_id: &str, lease_expires_at: i64) -> Attempt {
    let job_id = JobId::parse(job_id).unwrap();
    ledger
        .start_attempt(&job_id, ledger::now_ms(), lease_expires_at)
        .await
        .unwrap()
        .expect("the job was waiting to run")
}

async fn state_of(ledger: &Ledger, job_id: &str) -> Option<State> {
    let job = ledger.show_job(&id(job_id)).await.unwrap()?;
    Some(job.summary.state.parse().unwrap())
}

fn failed(retry_at: Option<i64>) -> AttemptEnd {
    AttemptEnd::Failed {
        failure: ledger::Failure {
            error: "exited with status 1".into(),
            exit_status: Some(1),
            http_status: None,
        },
        retry_at,
    }
}

on_both_ledgers! {
    #[tokio::test(flavor = "multi_thread")]
    async fn a_job_id_is_claimed_once() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "once").await;
        assert_eq!(
            ledger.claim(new_claim("once")).await.unwrap(),
            ClaimOutcome::Duplicate
        );
        let job = ledger.show_job(&id("once")).await.unwrap().unwrap();
        assert_eq!(job.summary.state, "claimed");
        assert_eq!(job.summary.source, "webhook");
        assert_eq!(job.summary.event_type.as_deref(), Some("job.completed"));
        assert_eq!(job.summary.attempts, 0);
        assert_eq!(job.body.as_deref(), Some(job_body("once").as_str()));
        assert_eq!(ledger.show_job(&id("never")).await.unwrap().map(|j| j.summary.job_id), None);
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_attempt_starts_once_and_hands_out_the_stored_job() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "start").await;
        let attempt = started(&ledger, "start", i64::MAX).await;
        assert_eq!(attempt.number, 1);
        assert_eq!(attempt.body, job_body("start"));
        assert_eq!(attempt.event_type.as_deref(), Some("job.completed"));
        assert_eq!(attempt.source, Source::Webhook);
        assert_eq!(state_of(&ledger, "start").await, Some(State::Running));
        let again = JobId::parse("start").unwrap();
        let unknown = JobId::parse("unknown").unwrap();
        for job_id in [&again, &unknown] {
            let start = ledger.start_attempt(job_id, ledger::now_ms(), i64::MAX).await;
            assert!(start.unwrap().is_none(), "{job_id} started");
        }
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_attempt_ends_done_retrying_or_dead() {
        let (_dir, ledger) = fresh().await;
        let now = ledger::now_ms();
        for (job_id, end, state) in [
            ("ends-done", AttemptEnd::Done, State::Done),
            ("ends-retrying", failed(Some(now + 60_000)), State::Retrying),
            ("ends-dead", failed(None), State::Dead),
        ] {
            claimed(&ledger, job_id).await;
            let attempt = started(&ledger, job_id, i64::MAX).await;
            assert_eq!(ledger.finish_attempt(&attempt, &end, now).await.unwrap(), Some(state));
            let job = ledger.show_job(&id(job_id)).await.unwrap().unwrap();
            assert_eq!(job.summary.state, state.as_str());
            assert_eq!(job.summary.finished_at.is_some(), state.is_finished(), "{job_id}");
            assert_eq!(job.summary.last_error.is_some(), state != State::Done, "{job_id}");
        }
        let retrying = ledger.show_job(&id("ends-retrying")).await.unwrap().unwrap();
        assert_eq!(retrying.summary.next_attempt_at, Some(now + 60_000));
        // Not due before its retry time; due at it.
        let due = ledger.due_jobs(now, 10).await.unwrap();
        assert!(due.runnable.is_empty(), "{:?}", due.runnable);
        assert_eq!(due.next_at, Some(now + 60_000));
        let due = ledger.due_jobs(now + 60_000, 10).await.unwrap();
        assert_eq!(due.runnable, [JobId::parse("ends-retrying").unwrap()]);
        let stats = ledger.job_stats(now).await.unwrap();
        assert_eq!((stats.by_state["done"], stats.by_state["dead"]), (1, 1));
        ledger.close().await;
    }

    /// The counts by state (`jobs stats`, `/metrics`, the console) are kept, not counted: after
    /// every kind of change they equal what the lists hold, and a duplicate changes none.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_kept_counts_follow_every_change() {
        let (_dir, ledger) = fresh().await;
        let agree = |when: &'static str| {
            let ledger = ledger.clone();
            async move {
                let mut listed = std::collections::BTreeMap::new();
                for state in State::ALL {
                    let page = ledger.list_jobs(Some(state), None, None, 1000).await.unwrap();
                    listed.insert(state.as_str().to_owned(), page.jobs.len() as u64);
                }
                let stats = ledger.job_stats(ledger::now_ms()).await.unwrap();
                assert_eq!(stats.by_state, listed, "{when}");
                let snapshot = ledger.metrics_snapshot().await.unwrap();
                for (state, count) in snapshot.jobs {
                    assert_eq!(listed[state], count, "{when}: {state}");
                }
                listed
            }
        };
        for job_id in ["count-a", "count-b", "count-c", "count-d", "count-e"] {
            claimed(&ledger, job_id).await;
        }
        ledger.claim(new_claim("count-a")).await.unwrap();
        assert_eq!(agree("claimed, one duplicate").await["claimed"], 5);
        let now = ledger::now_ms();
        let a = started(&ledger, "count-a", i64::MAX).await;
        let b = started(&ledger, "count-b", i64::MAX).await;
        let c = started(&ledger, "count-c", 100).await;
        started(&ledger, "count-d", i64::MAX).await;
        agree("running").await;
        ledger.finish_attempt(&a, &AttemptEnd::Done, now).await.unwrap();
        ledger.finish_attempt(&b, &failed(Some(now + 60_000)), now).await.unwrap();
        let lease = LeasedAttempt { job_id: c.job_id.to_string(), number: c.number.into() };
        ledger.take_back_lease(&lease, 200, now, 1, "lease expired").await.unwrap();
        agree("done, retrying, taken back dead").await;
        ledger.cancel_job(&id("count-e"), "test", "not wanted", now).await.unwrap();
        ledger.give_up("count-b", "given up", now).await.unwrap();
        agree("cancelled, given up").await;
        ledger.retry_job(&id("count-c"), "test", now).await.unwrap();
        ledger.run_now(&id("count-c"), "test", now).await.unwrap();
        agree("retried").await;
        ledger.fold_counts().await.unwrap();
        let forgotten = ledger.retention_step(RetentionStep::DeleteFinished, i64::MAX, 10);
        assert_eq!(forgotten.await.unwrap(), 3);
        let listed = agree("retention forgot the finished").await;
        assert_eq!(
            listed.into_iter().filter(|(_, n)| *n > 0).collect::<Vec<_>>(),
            [("claimed".to_owned(), 1), ("running".to_owned(), 1)]
        );
        ledger.close().await;
    }

    /// A list filtered by event type keeps only that type, a page at a time; `since` and
    /// `before` bound the list's time (here: received) on both ends.
    #[tokio::test(flavor = "multi_thread")]
    async fn jobs_are_found_by_event_type_and_time() {
        let (_dir, ledger) = fresh().await;
        for (job_id, event_type) in [
            ("find-1", "job.completed"),
            ("find-2", "job.failed"),
            ("find-3", "job.completed"),
            ("find-4", "job.failed"),
            ("find-5", "job.completed"),
        ] {
            let claim = NewClaim {
                event_type: Some(sume_receiver::event_type::EventType::parse(event_type).unwrap()),
                ..new_claim(job_id)
            };
            ledger.claim(claim).await.unwrap();
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let ids = |page: &ledger::JobPage| -> Vec<String> {
            page.jobs.iter().map(|job| job.job_id.clone()).collect()
        };
        let failed = ledger::JobFilter {
            event_type: Some("job.failed".into()),
            ..Default::default()
        };
        let none = ledger.find_jobs(&failed, None, 0).await.unwrap();
        assert!(none.jobs.is_empty(), "a page of 0 holds none: {none:?}");
        let first = ledger.find_jobs(&failed, None, 1).await.unwrap();
        assert_eq!(ids(&first), ["find-4"]);
        let second = ledger.find_jobs(&failed, first.next.as_ref(), 1).await.unwrap();
        assert_eq!(ids(&second), ["find-2"]);
        let third = ledger.find_jobs(&failed, second.next.as_ref(), 1).await.unwrap();
        assert!(third.jobs.is_empty() && third.next.is_none(), "{third:?}");
        let received = |job_id: &'static str| {
            let ledger = ledger.clone();
            async move { ledger.show_job(&id(job_id)).await.unwrap().unwrap().summary.received_at }
        };
        let since = ledger::JobFilter {
            since: Some(received("find-3").await),
            ..Default::default()
        };
        let page = ledger.find_jobs(&since, None, 10).await.unwrap();
        assert_eq!(ids(&page), ["find-5", "find-4", "find-3"]);
        let between = ledger::JobFilter {
            before: Some(received("find-4").await),
            ..since.clone()
        };
        assert_eq!(ids(&ledger.find_jobs(&between, None, 10).await.unwrap()), ["find-3"]);
        let both = ledger::JobFilter {
            event_type: Some("job.completed".into()),
            ..between
        };
        assert_eq!(ids(&ledger.find_jobs(&both, None, 10).await.unwrap()), ["find-3"]);
        ledger.close().await;
    }

    /// A page filtered by a type few jobs have reads a bounded number of rows: it ends short
    /// with where to go on, and the next page finds the job further down.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_filtered_page_reads_a_bounded_number_of_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (config, ledger) = open_ledger(dir.path()).await;
        claimed(&ledger, "rare-type").await;
        // Received before the rows below: the list reaches it after all of them.
        ledger_execute(&config, "UPDATE jobs SET received_at = 0", &[]);
        let many = ledger::ROWS_READ_PER_FILTERED_PAGE + 500;
        insert_jobs(
            &config,
            (0..many).map(|i| (format!("other-{i:05}"), "done", "{}".to_owned(), Some(1))),
        );
        let rare = ledger::JobFilter {
            event_type: Some("job.completed".into()),
            ..Default::default()
        };
        let first = ledger.find_jobs(&rare, None, 10).await.unwrap();
        assert!(first.jobs.is_empty(), "{:?}", first.jobs);
        let next = first.next.expect("a short page says where it stopped");
        let second = ledger.find_jobs(&rare, Some(&next), 10).await.unwrap();
        let found: Vec<&str> = second.jobs.iter().map(|job| job.job_id.as_str()).collect();
        assert_eq!(found, ["rare-type"]);
        assert_eq!(second.next, None);
        ledger.close().await;
    }

    /// The attempt number fences an attempt whose lease was taken back: it cannot overwrite
    /// the outcome of the attempt that started after it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_stale_attempt_cannot_record_its_end() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "fenced").await;
        let stale = started(&ledger, "fenced", 100).await;
        let lease = LeasedAttempt { job_id: "fenced".into(), number: 1 };
        let now = ledger::now_ms();
        assert_eq!(
            ledger.take_back_lease(&lease, 200, now, 5, "lease expired").await.unwrap(),
            Some(State::Retrying)
        );
        let current = started(&ledger, "fenced", i64::MAX).await;
        assert_eq!((stale.number, current.number), (1, 2));
        assert_eq!(ledger.finish_attempt(&stale, &failed(None), now).await.unwrap(), None);
        assert!(!ledger.release_attempt(&stale, &Release::Shutdown, now).await.unwrap());
        assert_eq!(
            ledger.finish_attempt(&current, &AttemptEnd::Done, now).await.unwrap(),
            Some(State::Done)
        );
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_released_attempt_does_not_count() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "released").await;
        let attempt = started(&ledger, "released", i64::MAX).await;
        let now = ledger::now_ms();
        let refused = Failure { http_status: Some(503), ..Failure::new("HTTP 503") };
        let release = Release::Held(refused);
        assert!(ledger.release_attempt(&attempt, &release, now).await.unwrap());
        let job = ledger.show_job(&id("released")).await.unwrap().unwrap();
        // Its history says why, and the next attempt's cause is the hold, not a restart.
        let released = &job.history[0];
        assert_eq!(released.outcome.as_deref(), Some("released"));
        assert_eq!(
            released.error.as_deref(),
            Some(
                "given back uncounted: failed during a handler hold (the downstream looks \
                 down): HTTP 503"
            )
        );
        assert_eq!(released.http_status, Some(503));
        assert_eq!((job.summary.state.as_str(), job.summary.attempts), ("claimed", 0));
        assert_eq!(job.summary.next_attempt_at, Some(now));
        assert_eq!(started(&ledger, "released", i64::MAX).await.number, 1);
        let job = ledger.show_job(&id("released")).await.unwrap().unwrap();
        assert_eq!(job.history[1].cause, "hold");
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn expired_leases_are_taken_back_once_and_the_last_attempt_goes_dead() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "lease-a").await;
        claimed(&ledger, "lease-b").await;
        claimed(&ledger, "lease-held").await;
        started(&ledger, "lease-a", 100).await;
        started(&ledger, "lease-b", 100).await;
        started(&ledger, "lease-held", 10_000).await;
        let mut found: Vec<String> = ledger
            .leases_to_take_back(Leases::ExpiredBefore(200))
            .await
            .unwrap()
            .into_iter()
            .map(|lease| lease.job_id)
            .collect();
        found.sort();
        assert_eq!(found, ["lease-a", "lease-b"]);
        let now = ledger::now_ms();
        // The one algorithm above the backends: lease-b is still running here, lease-a has
        // used its only attempt.
        let taken = ledger
            .expire_leases(Leases::ExpiredBefore(200), now, 1, "lease expired", |job_id| {
                job_id == "lease-b"
            })
            .await
            .unwrap();
        assert_eq!(taken, 1);
        assert_eq!(state_of(&ledger, "lease-a").await, Some(State::Dead));
        assert_eq!(state_of(&ledger, "lease-b").await, Some(State::Running));
        let lease = LeasedAttempt { job_id: "lease-a".into(), number: 1 };
        let again = ledger.take_back_lease(&lease, 200, now, 1, "lease expired").await;
        assert_eq!(again.unwrap(), None, "taken back twice");
        // At start, every lease this receiver held, expired or not.
        let taken = ledger
            .expire_leases(Leases::HeldBeforeThisStart, now, 5, "interrupted", |_| false)
            .await
            .unwrap();
        assert_eq!(taken, 2);
        assert_eq!(state_of(&ledger, "lease-held").await, Some(State::Retrying));
        let held = ledger.show_job(&id("lease-held")).await.unwrap().unwrap();
        assert_eq!(held.summary.last_error.as_deref(), Some("interrupted"));
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn due_jobs_come_oldest_first_up_to_the_limit() {
        let (_dir, ledger) = fresh().await;
        for job_id in ["due-1", "due-2", "due-3"] {
            claimed(&ledger, job_id).await;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let due = ledger.due_jobs(ledger::now_ms(), 2).await.unwrap();
        let ids: Vec<&str> = due.runnable.iter().map(JobId::as_str).collect();
        assert_eq!(ids, ["due-1", "due-2"]);
        assert!(due.unrunnable.is_empty());
        assert!(due.next_at.is_some());
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_job_given_up_is_dead_with_the_reason_and_only_once() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "given-up").await;
        let now = ledger::now_ms();
        assert!(ledger.give_up("given-up", "cannot run", now).await.unwrap());
        assert!(!ledger.give_up("given-up", "cannot run", now).await.unwrap());
        let job = ledger.show_job(&id("given-up")).await.unwrap().unwrap();
        assert_eq!(job.summary.state, "dead");
        assert_eq!(job.summary.last_error.as_deref(), Some("cannot run"));
        assert_eq!(job.summary.attempts, 0);
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn retention_purges_bodies_then_forgets_jobs_and_never_touches_unfinished_work() {
        let (_dir, ledger) = fresh().await;
        for job_id in ["old-1", "old-2", "waiting"] {
            claimed(&ledger, job_id).await;
        }
        for job_id in ["old-1", "old-2"] {
            let attempt = started(&ledger, job_id, i64::MAX).await;
            ledger.finish_attempt(&attempt, &AttemptEnd::Done, 1_000).await.unwrap();
        }
        let purge = |limit| ledger.retention_step(RetentionStep::PurgeBodies, 2_000, limit);
        assert_eq!(purge(1).await.unwrap(), 1, "at most the limit");
        assert_eq!(purge(10).await.unwrap(), 1);
        assert_eq!(purge(10).await.unwrap(), 0);
        assert_eq!(ledger.show_job(&id("old-1")).await.unwrap().unwrap().body, None);
        let forget = ledger.retention_step(RetentionStep::DeleteFinished, 2_000, 10);
        assert_eq!(forget.await.unwrap(), 2);
        assert!(ledger.show_job(&id("old-1")).await.unwrap().is_none());
        // A forgotten job_id is a new job.
        claimed(&ledger, "old-1").await;
        assert_eq!(state_of(&ledger, "waiting").await, Some(State::Claimed));
        assert!(ledger.show_job(&id("waiting")).await.unwrap().unwrap().body.is_some());
        // Nothing resolved to forget yet.
        let resolved = ledger.retention_step(RetentionStep::DeleteResolvedExpectations, i64::MAX, 10);
        assert_eq!(resolved.await.unwrap(), 0);
        // Nothing to release is not an error.
        ledger.release_free_pages(16).await.unwrap();
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_expectation_is_resolved_by_its_webhook_or_by_polls() {
        let (_dir, ledger) = fresh().await;
        let now = ledger::now_ms();
        let arrives = JobId::parse("expected-arrives").unwrap();
        let polled = JobId::parse("expected-polled").unwrap();
        assert!(ledger.expect_job(&arrives, now, now).await.unwrap());
        assert!(!ledger.expect_job(&arrives, now, now).await.unwrap(), "registered twice");
        assert!(ledger.expect_job(&polled, now + 1, now).await.unwrap());
        claimed(&ledger, "expected-arrives").await;
        assert_eq!(ledger.resolve_arrived(now).await.unwrap(), 1);
        let due = ledger.due_expectations(now, 10, Duration::from_secs(30)).await.unwrap();
        let ids: Vec<&str> = due.iter().map(|due| due.job_id.as_str()).collect();
        assert_eq!(ids, ["expected-polled"]);
        assert_eq!(due[0].polls, 0);
        let again = PollResult::Again {
            status: Some("running".into()),
            error: None,
            next_poll_at: now + 5_000,
        };
        ledger.record_poll("expected-polled", &again, now).await.unwrap();
        ledger
            .record_poll("expected-polled", &PollResult::GivenUp { error: Some("gone".into()) }, now)
            .await
            .unwrap();
        let listed = ledger.list_expectations(10).await.unwrap();
        let states: Vec<(&str, &str, u32)> = listed
            .iter()
            .map(|e| (e.job_id.as_str(), e.state.as_str(), e.polls))
            .collect();
        assert_eq!(
            states,
            [("expected-polled", "given_up", 2), ("expected-arrives", "arrived", 0)]
        );
        assert_eq!(listed[0].last_status.as_deref(), Some("running"));
        assert_eq!(listed[0].last_error.as_deref(), Some("gone"));
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_snapshot_counts_unfinished_work_and_expectations() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "snap-claimed").await;
        claimed(&ledger, "snap-running").await;
        started(&ledger, "snap-running", i64::MAX).await;
        let now = ledger::now_ms();
        ledger.expect_job(&JobId::parse("snap-expected").unwrap(), now, now).await.unwrap();
        let snapshot = ledger.metrics_snapshot().await.unwrap();
        assert_eq!(
            snapshot.jobs,
            [("claimed", 1), ("running", 1), ("retrying", 0), ("done", 0), ("dead", 0)]
        );
        assert!(snapshot.expected.contains(&("waiting", 1)), "{:?}", snapshot.expected);
        assert!(snapshot.oldest_unfinished_age_seconds >= 0.0);
        assert!(snapshot.ledger_bytes > 0);
        assert_eq!(snapshot.wal_bytes.is_some(), !ledger.is_shared(), "a WAL only on SQLite");
        assert_eq!(snapshot.claim_queue_depth, 0);
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_open_ledger_is_ready_probes_and_says_where_it_is() {
        let (_dir, ledger) = fresh().await;
        assert_eq!(ledger.readiness(), Ok(()));
        ledger.probe().await.unwrap();
        assert_eq!(ledger.claim_queue_depth(), 0);
        assert!(!ledger.location().is_empty());
        assert!(!ledger.is_storage_lost());
        assert_eq!(ledger.is_shared(), Backend::current() == Backend::Postgres);
        let failed = tokio::time::timeout(Duration::from_millis(50), ledger.failed()).await;
        assert!(failed.is_err(), "a healthy ledger reported itself failed");
        ledger.close().await;
        assert_eq!(
            ledger.claim(new_claim("after-close")).await,
            Err(StorageError::Closed)
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn jobs_are_listed_newest_first_and_counted() {
        let (_dir, ledger) = fresh().await;
        for job_id in ["list-1", "list-2", "list-3"] {
            claimed(&ledger, job_id).await;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let attempt = started(&ledger, "list-2", i64::MAX).await;
        ledger.finish_attempt(&attempt, &failed(None), ledger::now_ms()).await.unwrap();
        let ids = |page: &ledger::JobPage| -> Vec<String> {
            page.jobs.iter().map(|job| job.job_id.clone()).collect()
        };
        // Newest first, a page at a time: a full page names where the next one starts.
        let first = ledger.list_jobs(None, None, None, 2).await.unwrap();
        assert_eq!(ids(&first), ["list-3", "list-2"]);
        let cursor = first.next.expect("a full page has a next one");
        assert_eq!(cursor.to_string().parse::<ledger::Cursor>().unwrap(), cursor);
        let second = ledger.list_jobs(None, Some(&cursor), None, 2).await.unwrap();
        assert_eq!(ids(&second), ["list-1"]);
        assert_eq!(second.next, None);
        let dead = ledger.list_jobs(Some(State::Dead), None, None, 10).await.unwrap();
        assert_eq!(ids(&dead), ["list-2"]);
        let claimed = ledger.list_jobs(Some(State::Claimed), None, None, 10).await.unwrap();
        assert_eq!(ids(&claimed).len(), 2);
        let stats = ledger.job_stats(ledger::now_ms()).await.unwrap();
        assert_eq!(stats.by_state["claimed"], 2);
        assert_eq!(stats.by_state["dead"], 1);
        assert_eq!(stats.by_state["done"], 0);
        assert_eq!(stats.received_last_hour, 3);
        assert_eq!(stats.dead_last_day, 1);
        assert!(stats.oldest_unfinished_received_at.is_some());
        let mut like = ledger.job_ids_like("list-%").await.unwrap();
        like.sort();
        assert_eq!(like, ["list-1", "list-2", "list-3"]);
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn only_a_finished_job_with_its_body_can_be_retried() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "retry-dead").await;
        claimed(&ledger, "retry-waiting").await;
        claimed(&ledger, "retry-purged").await;
        for job_id in ["retry-dead", "retry-purged"] {
            let attempt = started(&ledger, job_id, i64::MAX).await;
            ledger.finish_attempt(&attempt, &failed(None), 1_000).await.unwrap();
        }
        ledger.retention_step(RetentionStep::PurgeBodies, 2_000, 1).await.unwrap();
        let purged = ledger.show_job(&id("retry-dead")).await.unwrap().unwrap().body.is_none();
        let (purged, kept) = if purged {
            ("retry-dead", "retry-purged")
        } else {
            ("retry-purged", "retry-dead")
        };
        let now = ledger::now_ms();
        ledger.retry_job(&id(kept), "test", now).await.unwrap();
        let job = ledger.show_job(&id(kept)).await.unwrap().unwrap();
        assert_eq!((job.summary.state.as_str(), job.summary.attempts), ("claimed", 0));
        assert!(matches!(
            ledger.retry_job(&id(purged), "test", now).await,
            Err(RetryError::BodyPurged(_))
        ));
        assert!(matches!(
            ledger.retry_job(&id("retry-waiting"), "test", now).await,
            Err(RetryError::NotFinished { .. })
        ));
        assert!(matches!(
            ledger.retry_job(&id("retry-unknown"), "test", now).await,
            Err(RetryError::Unknown(_))
        ));
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_job_in_backoff_can_be_run_now_and_nothing_else_can() {
        let (_dir, ledger) = fresh().await;
        let now = ledger::now_ms();
        claimed(&ledger, "backoff").await;
        let attempt = started(&ledger, "backoff", i64::MAX).await;
        ledger.finish_attempt(&attempt, &failed(Some(now + 3_600_000)), now).await.unwrap();
        assert!(ledger.due_jobs(now, 10).await.unwrap().runnable.is_empty());
        assert!(ledger.run_now(&id("backoff"), "test", now).await.unwrap());
        let due = ledger.due_jobs(now, 10).await.unwrap();
        assert_eq!(due.runnable, [JobId::parse("backoff").unwrap()]);
        let job = ledger.show_job(&id("backoff")).await.unwrap().unwrap();
        assert_eq!((job.summary.state.as_str(), job.summary.attempts), ("retrying", 1));
        // Only a job waiting for its retry: not a claimed, running, finished or unknown one.
        claimed(&ledger, "waiting").await;
        for job_id in ["waiting", "unknown"] {
            assert!(!ledger.run_now(&id(job_id), "test", now).await.unwrap(), "{job_id}");
        }
        started(&ledger, "backoff", i64::MAX).await;
        assert!(!ledger.run_now(&id("backoff"), "test", now).await.unwrap(), "a running job");
        ledger.close().await;
    }

    /// The command line's ledger (no background tasks) sees the service's, and the service
    /// sees its changes.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_command_line_ledger_shares_the_service_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let (config, service) = open_ledger(dir.path()).await;
        claimed(&service, "shared").await;
        let attempt = started(&service, "shared", i64::MAX).await;
        service.finish_attempt(&attempt, &AttemptEnd::Done, ledger::now_ms()).await.unwrap();
        let cli = Ledger::open_existing(&config.database).await.unwrap();
        assert_eq!(state_of(&cli, "shared").await, Some(State::Done));
        cli.retry_job(&id("shared"), "test", ledger::now_ms()).await.unwrap();
        assert_eq!(cli.claim(new_claim("shared")).await.unwrap(), ClaimOutcome::Duplicate);
        assert_eq!(cli.claim(new_claim("from-cli")).await.unwrap(), ClaimOutcome::Claimed);
        cli.close().await;
        assert_eq!(state_of(&service, "shared").await, Some(State::Claimed));
        assert_eq!(state_of(&service, "from-cli").await, Some(State::Claimed));
        service.close().await;
    }

    /// Every attempt is a row of the job's history, with what caused it and how it ended;
    /// a manual retry appends (the earlier attempts stay), and is itself recorded.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_history_keeps_every_attempt_and_action() {
        let (_dir, ledger) = fresh().await;
        let now = ledger::now_ms();
        claimed(&ledger, "told").await;
        let first = started(&ledger, "told", i64::MAX).await;
        ledger.finish_attempt(&first, &failed(Some(now)), now + 5).await.unwrap();
        let second = started(&ledger, "told", i64::MAX).await;
        let http_failure = AttemptEnd::Failed {
            failure: ledger::Failure {
                error: "handler answered 502 Bad Gateway: upstream".into(),
                exit_status: None,
                http_status: Some(502),
            },
            retry_at: None,
        };
        ledger.finish_attempt(&second, &http_failure, now + 9).await.unwrap();
        ledger.retry_job(&id("told"), "cli:alice", now + 10).await.unwrap();
        let third = started(&ledger, "told", i64::MAX).await;
        assert_eq!(third.number, 1, "a retry starts a new set of attempts");
        ledger.finish_attempt(&third, &AttemptEnd::Done, now + 20).await.unwrap();

        let job = ledger.show_job(&id("told")).await.unwrap().unwrap();
        let summary: Vec<_> = job
            .history
            .iter()
            .map(|a| (a.number, a.cause.as_str(), a.outcome.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                (1, "first", Some("failed")),
                (2, "backoff", Some("dead")),
                (1, "manual_retry", Some("done")),
            ]
        );
        assert_eq!(job.history[0].exit_status, Some(1));
        assert_eq!(job.history[0].ended_at, Some(now + 5));
        assert_eq!(job.history[0].error.as_deref(), Some("exited with status 1"));
        assert_eq!(job.history[1].http_status, Some(502));
        assert_eq!(job.history[2].error, None);
        assert_eq!(job.actions.len(), 1);
        assert_eq!(
            (job.actions[0].action.as_str(), job.actions[0].actor.as_str(), job.actions[0].at),
            ("retry", "cli:alice", now + 10)
        );
        ledger.close().await;
    }

    /// A lease taken back and an attempt our shutdown stopped end their history rows too, and
    /// the next attempt says why it runs.
    #[tokio::test(flavor = "multi_thread")]
    async fn taken_back_and_released_attempts_are_in_the_history() {
        let (_dir, ledger) = fresh().await;
        let now = ledger::now_ms();
        claimed(&ledger, "interrupted").await;
        let first = started(&ledger, "interrupted", 100).await;
        let lease = LeasedAttempt { job_id: "interrupted".into(), number: first.number.into() };
        let taken = ledger.take_back_lease(&lease, 200, now, 5, "lease expired").await.unwrap();
        assert_eq!(taken, Some(State::Retrying));
        let second = started(&ledger, "interrupted", i64::MAX).await;
        assert!(ledger.release_attempt(&second, &Release::Shutdown, now + 1).await.unwrap());
        started(&ledger, "interrupted", i64::MAX).await;
        let job = ledger.show_job(&id("interrupted")).await.unwrap().unwrap();
        let summary: Vec<_> = job
            .history
            .iter()
            .map(|a| (a.number, a.cause.as_str(), a.outcome.as_deref(), a.error.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                (1, "first", Some("taken_back"), Some("lease expired")),
                (
                    2,
                    "take_back",
                    Some("released"),
                    Some("given back uncounted: the handler was stopped by this receiver's shutdown")
                ),
                (2, "restart", None, None),
            ]
        );
        ledger.close().await;
    }

    /// However often a job runs again, its history keeps the newest attempts and actions only.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_job_history_is_bounded() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "restless").await;
        let rounds = ledger::HISTORY_PER_JOB as u32 + 5;
        for _ in 0..rounds {
            let attempt = started(&ledger, "restless", i64::MAX).await;
            ledger.finish_attempt(&attempt, &failed(None), 1_000).await.unwrap();
            ledger.retry_job(&id("restless"), "test", 1_000).await.unwrap();
        }
        let job = ledger.show_job(&id("restless")).await.unwrap().unwrap();
        assert_eq!(job.history.len(), ledger::HISTORY_PER_JOB as usize);
        assert_eq!(job.actions.len(), ledger::HISTORY_PER_JOB as usize);
        ledger.close().await;
    }

    /// Retention forgets a job's history with the job: a Redeliver after it is a new job with
    /// none.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_forgotten_job_leaves_no_history() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "forgotten").await;
        let attempt = started(&ledger, "forgotten", i64::MAX).await;
        ledger.finish_attempt(&attempt, &failed(None), 1_000).await.unwrap();
        ledger.retry_job(&id("forgotten"), "test", 1_000).await.unwrap();
        let attempt = started(&ledger, "forgotten", i64::MAX).await;
        ledger.finish_attempt(&attempt, &AttemptEnd::Done, 1_000).await.unwrap();
        ledger.record_duplicates(&[(JobId::parse("forgotten").unwrap(), 2, 1_500)]).await.unwrap();
        let purged = ledger.retention_step(RetentionStep::PurgeBodies, 2_000, 10).await.unwrap();
        assert_eq!(purged, 1);
        let tombstone = ledger.show_job(&id("forgotten")).await.unwrap().unwrap();
        let purged_at = tombstone.body_purged_at.expect("the tombstone says when");
        assert!((ledger::now_ms() - purged_at).abs() < 60_000, "{purged_at}");
        assert_eq!(ledger.retention_step(RetentionStep::DeleteFinished, 2_000, 10).await.unwrap(), 1);
        claimed(&ledger, "forgotten").await;
        let job = ledger.show_job(&id("forgotten")).await.unwrap().unwrap();
        assert!(job.history.is_empty() && job.actions.is_empty(), "{job:?}");
        assert_eq!((job.duplicates, job.last_duplicate_at), (0, None));
        assert_eq!(job.body_purged_at, None);
        ledger.close().await;
    }

    /// An operator's cancel makes a waiting job dead, keeps it (its redeliveries stay
    /// duplicates), and says who and why; a running or finished job is not cancelled.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_waiting_job_can_be_cancelled_with_a_reason() {
        let (_dir, ledger) = fresh().await;
        let now = ledger::now_ms();
        claimed(&ledger, "unwanted").await;
        assert!(ledger.cancel_job(&id("unwanted"), "cli:bob", "duplicate order", now).await.unwrap());
        let job = ledger.show_job(&id("unwanted")).await.unwrap().unwrap();
        assert_eq!(job.summary.state, "dead");
        assert_eq!(job.summary.last_error.as_deref(), Some("cancelled by cli:bob: duplicate order"));
        assert_eq!(job.actions[0].action, "cancel");
        assert_eq!(job.actions[0].actor, "cli:bob");
        assert!(ledger.due_jobs(now + 1, 10).await.unwrap().runnable.is_empty());
        assert_eq!(ledger.claim(new_claim("unwanted")).await.unwrap(), ClaimOutcome::Duplicate);
        claimed(&ledger, "busy").await;
        started(&ledger, "busy", i64::MAX).await;
        for job_id in ["unwanted", "busy", "unknown"] {
            assert!(!ledger.cancel_job(&id(job_id), "cli:bob", "no", now).await.unwrap(), "{job_id}");
        }
        ledger.close().await;
    }

    /// A bulk retry counts exactly what its filter takes, then takes it a batch at a time,
    /// each job once, each recorded with the filter.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_bulk_retry_takes_what_its_filter_counts() {
        let (_dir, ledger) = fresh().await;
        let failing = |error: &str| AttemptEnd::Failed {
            failure: ledger::Failure::new(error),
            retry_at: None,
        };
        for (job_id, end, at) in [
            ("bulk-old", failing("connection refused"), 1_000),
            ("bulk-1", failing("connection refused"), 5_000),
            ("bulk-2", failing("connection refused by upstream"), 6_000),
            ("bulk-other", failing("exit status 3"), 6_000),
            ("bulk-done", AttemptEnd::Done, 6_000),
        ] {
            claimed(&ledger, job_id).await;
            let attempt = started(&ledger, job_id, i64::MAX).await;
            ledger.finish_attempt(&attempt, &end, at).await.unwrap();
        }
        let filter = ledger::RetryFilter {
            state: State::Dead,
            finished_since: Some(2_000),
            finished_before: 10_000,
            error_contains: Some("connection refused".into()),
        };
        let count = ledger.count_retry_matching(&filter).await.unwrap();
        assert_eq!(count, ledger::RetryCount { retryable: 2, body_purged: 0 });
        let mut retried = 0;
        loop {
            let batch = ledger.retry_matching(&filter, "cli:carol", "bulk", 10_000, 1).await.unwrap();
            assert!(batch <= 1, "at most the limit");
            if batch == 0 {
                break;
            }
            retried += batch;
        }
        assert_eq!(retried, 2);
        for (job_id, state) in [
            ("bulk-1", State::Claimed),
            ("bulk-2", State::Claimed),
            ("bulk-old", State::Dead),
            ("bulk-other", State::Dead),
            ("bulk-done", State::Done),
        ] {
            assert_eq!(state_of(&ledger, job_id).await, Some(state), "{job_id}");
        }
        let job = ledger.show_job(&id("bulk-2")).await.unwrap().unwrap();
        assert_eq!(job.actions[0].reason.as_deref(), Some("bulk"));
        assert_eq!(job.next_attempt_cause, "manual_retry");
        let all_dead = ledger::RetryFilter { finished_since: None, error_contains: None, ..filter };
        assert_eq!(ledger.count_retry_matching(&all_dead).await.unwrap().retryable, 2);
        ledger.close().await;
    }

    /// Dead letters group by what failed, the handler's own first line included (ids and
    /// numbers alike), every cancel in one group; a group's retry takes exactly its jobs, each
    /// recorded as the operator's retry.
    #[tokio::test(flavor = "multi_thread")]
    async fn dead_letters_group_by_what_failed_and_a_group_is_retried_alone() {
        let (_dir, ledger) = fresh().await;
        let failing = |error: &str| AttemptEnd::Failed {
            failure: ledger::Failure::new(error),
            retry_at: None,
        };
        let transient = "exited with status 1; stderr: downstream unavailable: 503 from billing-api";
        for (job_id, error) in [
            ("dl-1", format!("{transient} (request 7f3a9c01)\nat main.py:12")),
            ("dl-2", format!("{transient} (request 0b12ffe9)")),
            ("dl-3", format!("{transient} (request 99aa0011)")),
            ("dl-4", "exited with status 1; stderr: invalid payload: no amount".to_owned()),
        ] {
            claimed(&ledger, job_id).await;
            let attempt = started(&ledger, job_id, i64::MAX).await;
            ledger.finish_attempt(&attempt, &failing(&error), 5_000).await.unwrap();
        }
        for (job_id, by) in [("dl-cancel-1", "cli:bob"), ("dl-cancel-2", "console:alice")] {
            claimed(&ledger, job_id).await;
            assert!(ledger.cancel_job(&id(job_id), by, &format!("{job_id} is a test"), 6_000).await.unwrap());
        }
        let groups = ledger.dead_groups(10).await.unwrap();
        let found: Vec<(&str, u64)> =
            groups.iter().map(|group| (group.signature.as_str(), group.jobs)).collect();
        let downstream =
            "exited with status 1: downstream unavailable: 503 from billing-api (request #)";
        assert_eq!(
            found,
            [
                (downstream, 3),
                ("cancelled by an operator", 2),
                ("exited with status 1: invalid payload: no amount", 1),
            ]
        );
        assert_eq!(ledger.dead_groups(1).await.unwrap().len(), 1, "at most the limit");
        let mut members = ledger.dead_group_jobs(downstream).await.unwrap();
        members.sort();
        assert_eq!(members, ["dl-1", "dl-2", "dl-3"]);

        // In batches: 2, then the last one.
        let first = ledger.retry_dead_group(downstream, "console:alice", 7_000, 2).await.unwrap();
        assert_eq!((first.retried, first.refused, first.left), (2, 0, 1));
        let rest = ledger.retry_dead_group(downstream, "console:alice", 7_000, 2).await.unwrap();
        assert_eq!((rest.retried, rest.refused, rest.left), (1, 0, 0));
        for (job_id, state) in [
            ("dl-1", State::Claimed),
            ("dl-3", State::Claimed),
            ("dl-4", State::Dead),
            ("dl-cancel-1", State::Dead),
        ] {
            assert_eq!(state_of(&ledger, job_id).await, Some(state), "{job_id}");
        }
        let job = ledger.show_job(&id("dl-2")).await.unwrap().unwrap();
        let retry = job.actions.last().unwrap();
        assert_eq!((retry.action.as_str(), retry.actor.as_str()), ("retry", "console:alice"));
        assert_eq!(ledger.retry_dead_group(downstream, "console:alice", 8_000, 2).await.unwrap(), Default::default());
        ledger.close().await;
    }

    /// Duplicate counts add up per job; a job no longer in the ledger is skipped.
    #[tokio::test(flavor = "multi_thread")]
    async fn duplicates_are_counted_per_job() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "popular").await;
        let id = |text| JobId::parse(text).unwrap();
        let seen = |count, at| vec![(id("gone"), 1, 5), (id("popular"), count, at)];
        ledger.record_duplicates(&seen(2, 1_000)).await.unwrap();
        ledger.record_duplicates(&seen(3, 900)).await.unwrap();
        let job = ledger.show_job(&id("popular")).await.unwrap().unwrap();
        assert_eq!((job.duplicates, job.last_duplicate_at), (5, Some(1_000)));
        assert!(ledger.show_job(&id("gone")).await.unwrap().is_none());
        ledger.close().await;
    }

    /// A shared ledger names the receivers that hold running jobs; a ledger of one process
    /// has no one to name.
    #[tokio::test(flavor = "multi_thread")]
    async fn running_jobs_are_counted_per_receiver_where_there_are_several() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "held").await;
        started(&ledger, "held", i64::MAX).await;
        let receivers = ledger.running_by_receiver().await.unwrap();
        if ledger.is_shared() {
            assert_eq!(receivers.len(), 1, "{receivers:?}");
            assert_eq!(receivers[0].1, 1);
        } else {
            assert!(receivers.is_empty(), "{receivers:?}");
        }
        ledger.close().await;
    }

    /// Pausing dispatch is recorded once, with who; resuming likewise.
    #[tokio::test(flavor = "multi_thread")]
    async fn dispatch_can_be_paused_and_resumed() {
        let (_dir, ledger) = fresh().await;
        assert!(!ledger.dispatch().await.unwrap().paused);
        assert!(ledger.set_dispatch(true, "cli:dave", None, 1_000).await.unwrap());
        assert!(!ledger.set_dispatch(true, "cli:erin", None, 2_000).await.unwrap(), "already paused");
        let dispatch = ledger.dispatch().await.unwrap();
        assert_eq!(
            dispatch,
            ledger::Dispatch { paused: true, changed_at: Some(1_000), changed_by: Some("cli:dave".into()) }
        );
        assert!(ledger.set_dispatch(false, "cli:erin", None, 3_000).await.unwrap());
        assert!(!ledger.dispatch().await.unwrap().paused);
        ledger.close().await;
    }

    /// Every pause and hold is a stop in the log, with who, why, and when it began and ended (a
    /// resume ends both kinds); a span's stops are those in force during some of it.
    #[tokio::test(flavor = "multi_thread")]
    async fn dispatch_stops_are_logged_with_who_why_and_when() {
        let (_dir, ledger) = fresh().await;
        let stop = |kind, started_at, by: Option<&str>, reason: Option<&str>, ended_at, ended_by: Option<&str>| {
            ledger::DispatchStop {
                kind,
                started_at,
                started_by: by.map(str::to_owned),
                reason: reason.map(str::to_owned),
                ended_at,
                ended_by: ended_by.map(str::to_owned),
            }
        };
        let (pause, hold) = (ledger::StopKind::Pause, ledger::StopKind::Hold);
        let cause = "the handler's downstream cannot be reached";
        let opened = |since| ledger::Hold {
            since,
            reason: cause.into(),
            sample_error: "connection refused".into(),
            next_probe_at: since + 5_000,
            probe_interval_ms: 5_000,
        };
        assert!(ledger.set_dispatch(true, "cli:dave", Some("deploy «é»"), 1_000).await.unwrap());
        assert!(!ledger.set_dispatch(true, "cli:erin", Some("again"), 1_200).await.unwrap());
        assert!(ledger.open_hold(&opened(1_500)).await.unwrap());
        assert!(!ledger.open_hold(&opened(1_600)).await.unwrap(), "a hold was open");
        assert_eq!(
            ledger.dispatch_stops(0, 10_000, 20).await.unwrap(),
            [
                stop(pause, 1_000, Some("cli:dave"), Some("deploy «é»"), None, None),
                stop(hold, 1_500, None, Some(cause), None, None),
            ]
        );
        assert!(ledger.set_dispatch(false, "cli:erin", None, 3_000).await.unwrap());
        assert!(ledger.open_hold(&opened(4_000)).await.unwrap());
        assert_eq!(ledger.end_hold(4_000, 5_000).await.unwrap().map(|h| h.since), Some(4_000));
        assert!(ledger.set_dispatch(true, "cli:dave", None, 6_000).await.unwrap());
        let all = [
            stop(pause, 1_000, Some("cli:dave"), Some("deploy «é»"), Some(3_000), Some("cli:erin")),
            stop(hold, 1_500, None, Some(cause), Some(3_000), Some("cli:erin")),
            stop(hold, 4_000, None, Some(cause), Some(5_000), None),
            stop(pause, 6_000, Some("cli:dave"), None, None, None),
        ];
        assert_eq!(ledger.dispatch_stops(0, 10_000, 20).await.unwrap(), all);
        assert_eq!(ledger.dispatch_stops(0, 10_000, 2).await.unwrap(), all[..2]);
        // Begun before the span and lasting into it, begun within it, or still in force.
        assert_eq!(ledger.dispatch_stops(2_000, 2_500, 20).await.unwrap(), all[..2]);
        assert_eq!(ledger.dispatch_stops(3_500, 4_500, 20).await.unwrap(), all[2..3]);
        assert_eq!(ledger.dispatch_stops(9_000, 9_500, 20).await.unwrap(), all[3..]);
        assert_eq!(ledger.dispatch_stops(5_000, 5_900, 20).await.unwrap(), [], "ended as it began");
        ledger.close().await;
    }

    /// Retention forgets the stops that ended before its cutoff, a bounded batch at a time;
    /// one still in force stays.
    #[tokio::test(flavor = "multi_thread")]
    async fn retention_forgets_ended_stops_in_batches() {
        let (_dir, ledger) = fresh().await;
        for at in [1_000, 3_000, 5_000] {
            assert!(ledger.set_dispatch(true, "cli:dave", None, at).await.unwrap());
            assert!(ledger.set_dispatch(false, "cli:dave", None, at + 1_000).await.unwrap());
        }
        assert!(ledger.set_dispatch(true, "cli:dave", None, 7_000).await.unwrap());
        let step = RetentionStep::DeleteEndedStops;
        assert_eq!(ledger.retention_step(step, 5_000, 1).await.unwrap(), 1);
        assert_eq!(ledger.retention_step(step, 5_000, 10).await.unwrap(), 1);
        assert_eq!(ledger.retention_step(step, 5_000, 10).await.unwrap(), 0);
        let left: Vec<_> = ledger.dispatch_stops(0, 10_000, 20).await.unwrap()
            .iter().map(|stop| (stop.started_at, stop.ended_at)).collect();
        assert_eq!(left, [(5_000, Some(6_000)), (7_000, None)]);
        ledger.close().await;
    }

    /// A hold opens once (a second receiver's finds it open), its probe moves only from where
    /// it is (one receiver takes each probe), and it ends once, returning what it was.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_hold_opens_once_moves_its_probe_once_and_ends_once() {
        let (_dir, ledger) = fresh().await;
        assert_eq!(ledger.hold().await.unwrap(), None);
        let hold = ledger::Hold {
            since: 1_000,
            reason: "5 different jobs failed in a row".into(),
            sample_error: "handler answered 502 Bad Gateway: «é»".into(),
            next_probe_at: 6_000,
            probe_interval_ms: 5_000,
        };
        assert!(ledger.open_hold(&hold).await.unwrap());
        let second = ledger::Hold { since: 1_500, reason: "other".into(), ..hold.clone() };
        assert!(!ledger.open_hold(&second).await.unwrap(), "a hold was open");
        assert_eq!(ledger.hold().await.unwrap().as_ref(), Some(&hold));

        assert!(ledger.move_probe(&ProbeMove { since: 1_000, from: 6_000, to: 20_000, interval_ms: 10_000 }).await.unwrap());
        assert!(!ledger.move_probe(&ProbeMove { since: 1_000, from: 6_000, to: 21_000, interval_ms: 10_000 }).await.unwrap(), "taken already");
        assert!(!ledger.move_probe(&ProbeMove { since: 1_500, from: 20_000, to: 21_000, interval_ms: 10_000 }).await.unwrap(), "not that hold");
        let moved = ledger.hold().await.unwrap().unwrap();
        assert_eq!((moved.next_probe_at, moved.probe_interval_ms), (20_000, 10_000));

        assert_eq!(ledger.end_hold(1_500, 9_000).await.unwrap(), None, "not that hold");
        assert_eq!(ledger.end_hold(1_000, 9_000).await.unwrap(), Some(moved));
        assert_eq!(ledger.end_hold(1_000, 9_000).await.unwrap(), None, "ended already");
        assert_eq!(ledger.hold().await.unwrap(), None);
        ledger.close().await;
    }

    /// `jobs resume` ends a hold, and is then a change though dispatch was not paused; a
    /// pause leaves the hold as it is.
    #[tokio::test(flavor = "multi_thread")]
    async fn resuming_dispatch_ends_a_hold() {
        let (_dir, ledger) = fresh().await;
        let hold = ledger::Hold {
            since: 1_000,
            reason: "the handler's downstream cannot be reached".into(),
            sample_error: "connection refused".into(),
            next_probe_at: 6_000,
            probe_interval_ms: 5_000,
        };
        assert!(ledger.open_hold(&hold).await.unwrap());
        assert!(ledger.set_dispatch(true, "cli:dave", None, 2_000).await.unwrap());
        assert_eq!(ledger.hold().await.unwrap(), Some(hold.clone()), "a pause keeps the hold");
        assert!(ledger.set_dispatch(false, "cli:dave", None, 3_000).await.unwrap());
        assert_eq!(ledger.hold().await.unwrap(), None);

        assert!(ledger.open_hold(&hold).await.unwrap());
        assert!(ledger.set_dispatch(false, "cli:erin", None, 4_000).await.unwrap(), "a hold ended");
        assert_eq!(ledger.hold().await.unwrap(), None);
        assert_eq!(ledger.dispatch().await.unwrap().changed_by.as_deref(), Some("cli:erin"));
        assert!(!ledger.set_dispatch(false, "cli:erin", None, 5_000).await.unwrap(), "nothing to end");
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_minute_kept_twice_holds_its_last_values_and_reads_back_from_a_minute_on() {
        let (_dir, ledger) = fresh().await;
        let minute = |minute: i64, claimed: i64| MinuteRollup {
            minute,
            counts: [claimed, 1, 2, 3, 4, 5, 6, 7, 8],
            max_skew_secs: 9,
            timings: [[2, 3_000, 2_000], [1, 5_000_000, 5_000_000]],
        };
        for kept in [minute(1_000, 3), minute(1_001, 1), minute(1_000, 5), minute(1_002, 2)] {
            ledger.store_rollup(&kept).await.unwrap();
        }
        assert_eq!(
            ledger.rollups_since(1_000, 60).await.unwrap(),
            [minute(1_000, 5), minute(1_001, 1), minute(1_002, 2)],
            "the partial minute's second write replaced the first"
        );
        assert_eq!(ledger.rollups_since(1_001, 1).await.unwrap(), [minute(1_001, 1)]);
        assert_eq!(ledger.rollups_since(1_003, 60).await.unwrap(), []);

        // Retention forgets the minutes before its cutoff (Unix ms), a batch at a time.
        let cutoff = 1_002 * 60_000;
        let step = RetentionStep::DeleteOldRollups;
        assert_eq!(ledger.retention_step(step, cutoff, 1).await.unwrap(), 1);
        assert_eq!(ledger.retention_step(step, cutoff, 10).await.unwrap(), 1);
        assert_eq!(ledger.retention_step(step, cutoff, 10).await.unwrap(), 0);
        assert_eq!(ledger.rollups_since(0, 60).await.unwrap(), [minute(1_002, 2)]);
        ledger.close().await;
    }
}

/// The command line never creates or migrates a ledger.
#[tokio::test]
async fn the_command_line_refuses_a_ledger_that_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        sume_receiver::config::Config::parse(&config_text(dir.path(), ""), dir.path()).unwrap();
    let error = Ledger::open_existing(&config.database)
        .await
        .err()
        .expect("opened a ledger that is not there");
    assert!(error.to_string().contains("no ledger at"), "{error}");
}

/// Receivers sharing a PostgreSQL ledger each keep and read their own minutes.
#[tokio::test(flavor = "multi_thread")]
async fn receivers_sharing_a_postgres_ledger_keep_their_own_minutes() {
    Backend::Postgres
        .run(
            "receivers_sharing_a_postgres_ledger_keep_their_own_minutes",
            async {
                let dir = tempfile::tempdir().unwrap();
                let mut config =
                    sume_receiver::config::Config::parse(&config_text(dir.path(), ""), dir.path())
                        .unwrap();
                config.database.name_receiver(8001);
                let first = Ledger::open(&config.database).await.unwrap();
                config.database.name_receiver(8002);
                let second = Ledger::open(&config.database).await.unwrap();
                let kept = |claimed| MinuteRollup {
                    minute: 1_000,
                    counts: [claimed, 0, 0, 0, 0, 0, 0, 0, 0],
                    ..MinuteRollup::default()
                };
                first.store_rollup(&kept(3)).await.unwrap();
                second.store_rollup(&kept(4)).await.unwrap();
                assert_eq!(first.rollups_since(0, 60).await.unwrap(), [kept(3)]);
                assert_eq!(second.rollups_since(0, 60).await.unwrap(), [kept(4)]);
                first.close().await;
                second.close().await;
            },
        )
        .await;
}
