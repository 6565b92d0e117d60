//! Operator actions: retry, run now, cancel, bulk retry, dead-letter groups.

use super::*;

on_both_ledgers! {
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
        ledger.retry_job(&id(kept), None, &ledger::Actor::new("test"), now).await.unwrap();
        let job = ledger.show_job(&id(kept)).await.unwrap().unwrap();
        assert_eq!((job.summary.state.as_str(), job.summary.attempts), ("claimed", 0));
        assert!(matches!(
            ledger.retry_job(&id(purged), None, &ledger::Actor::new("test"), now).await,
            Err(RetryError::BodyPurged(_))
        ));
        assert!(matches!(
            ledger.retry_job(&id("retry-waiting"), None, &ledger::Actor::new("test"), now).await,
            Err(RetryError::NotFinished { .. })
        ));
        assert!(matches!(
            ledger.retry_job(&id("retry-unknown"), None, &ledger::Actor::new("test"), now).await,
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
        assert!(ledger.due_jobs(&default_route(), now, 10).await.unwrap().runnable.is_empty());
        assert!(ledger.run_now(&id("backoff"), None, &ledger::Actor::new("test"), now).await.unwrap());
        let due = ledger.due_jobs(&default_route(), now, 10).await.unwrap();
        assert_eq!(due.runnable, [JobId::parse("backoff").unwrap()]);
        let job = ledger.show_job(&id("backoff")).await.unwrap().unwrap();
        assert_eq!((job.summary.state.as_str(), job.summary.attempts), ("retrying", 1));
        // Only a job waiting for its retry: not a claimed, running, finished or unknown one.
        claimed(&ledger, "waiting").await;
        for job_id in ["waiting", "unknown"] {
            assert!(!ledger.run_now(&id(job_id), None, &ledger::Actor::new("test"), now).await.unwrap(), "{job_id}");
        }
        started(&ledger, "backoff", i64::MAX).await;
        assert!(!ledger.run_now(&id("backoff"), None, &ledger::Actor::new("test"), now).await.unwrap(), "a running job");
        ledger.close().await;
    }

    /// An operator's cancel makes a waiting job dead, keeps it (its redeliveries stay
    /// duplicates), and says who and why; a running or finished job is not cancelled.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_waiting_job_can_be_cancelled_with_a_reason() {
        let (_dir, ledger) = fresh().await;
        let now = ledger::now_ms();
        claimed(&ledger, "unwanted").await;
        assert!(ledger.cancel_job(&id("unwanted"), None, &ledger::Actor::because("cli:bob", Some("duplicate order")), now).await.unwrap());
        let job = ledger.show_job(&id("unwanted")).await.unwrap().unwrap();
        assert_eq!(job.summary.state, "dead");
        assert_eq!(job.summary.last_error.as_deref(), Some("cancelled by cli:bob: duplicate order"));
        assert_eq!(job.actions[0].action, "cancel");
        assert_eq!(job.actions[0].actor, "cli:bob");
        assert!(ledger.due_jobs(&default_route(), now + 1, 10).await.unwrap().runnable.is_empty());
        assert_eq!(ledger.claim(new_claim("unwanted")).await.unwrap(), ClaimOutcome::Duplicate);
        claimed(&ledger, "busy").await;
        started(&ledger, "busy", i64::MAX).await;
        for job_id in ["unwanted", "busy", "unknown"] {
            assert!(!ledger.cancel_job(&id(job_id), None, &ledger::Actor::because("cli:bob", Some("no")), now).await.unwrap(), "{job_id}");
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
            let batch = ledger.retry_matching(&filter, &ledger::Actor::because("cli:carol", Some("bulk")), 10_000, 1).await.unwrap();
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
            assert!(ledger.cancel_job(&id(job_id), None, &ledger::Actor::because(by, Some(&format!("{job_id} is a test"))), 6_000).await.unwrap());
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
        let first = ledger.retry_dead_group(downstream, &ledger::Actor::new("console:alice"), 7_000, 2).await.unwrap();
        assert_eq!((first.retried, first.refused, first.left), (2, 0, 1));
        let rest = ledger.retry_dead_group(downstream, &ledger::Actor::new("console:alice"), 7_000, 2).await.unwrap();
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
        assert_eq!(ledger.retry_dead_group(downstream, &ledger::Actor::new("console:alice"), 8_000, 2).await.unwrap(), Default::default());
        ledger.close().await;
    }
}
