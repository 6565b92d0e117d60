//! Attempts: started once, ended, fenced, released, taken back, given up.

use super::*;

on_both_ledgers! {
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
            let start = ledger.start_attempt(job_id, &default_route(), ledger::now_ms(), i64::MAX).await;
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
        let due = ledger.due_jobs(&default_route(), now, 10).await.unwrap();
        assert!(due.runnable.is_empty(), "{:?}", due.runnable);
        assert_eq!(due.next_at, Some(now + 60_000));
        let due = ledger.due_jobs(&default_route(), now + 60_000, 10).await.unwrap();
        assert_eq!(due.runnable, [JobId::parse("ends-retrying").unwrap()]);
        let stats = ledger.job_stats(now).await.unwrap();
        assert_eq!((stats.by_state["done"], stats.by_state["dead"]), (1, 1));
        ledger.close().await;
    }

    /// The attempt number fences an attempt whose lease was taken back: it cannot overwrite
    /// the outcome of the attempt that started after it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_stale_attempt_cannot_record_its_end() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "fenced").await;
        let stale = started(&ledger, "fenced", 100).await;
        let lease = LeasedAttempt { route: "default".into(), job_id: "fenced".into(), number: 1 };
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
            .expire_leases(Leases::ExpiredBefore(200), now, |_| 1, "lease expired", |job_id, _| {
                job_id == "lease-b"
            })
            .await
            .unwrap();
        assert_eq!(taken, 1);
        assert_eq!(state_of(&ledger, "lease-a").await, Some(State::Dead));
        assert_eq!(state_of(&ledger, "lease-b").await, Some(State::Running));
        let lease = LeasedAttempt { route: "default".into(), job_id: "lease-a".into(), number: 1 };
        let again = ledger.take_back_lease(&lease, 200, now, 1, "lease expired").await;
        assert_eq!(again.unwrap(), None, "taken back twice");
        // At start, every lease this receiver held, expired or not.
        let taken = ledger
            .expire_leases(Leases::HeldBeforeThisStart, now, |_| 5, "interrupted", |_, _| false)
            .await
            .unwrap();
        assert_eq!(taken, 2);
        assert_eq!(state_of(&ledger, "lease-held").await, Some(State::Retrying));
        let held = ledger.show_job(&id("lease-held")).await.unwrap().unwrap();
        assert_eq!(held.summary.last_error.as_deref(), Some("interrupted"));
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
}
