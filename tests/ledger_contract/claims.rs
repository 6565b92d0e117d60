//! Claims and due work: a job_id claimed once, due jobs in order, duplicates, readiness, the command line's ledger.

use super::*;

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

    /// The trace context kept at the claim reads back for the job's attempts (tracestate on
    /// its second line); none for a job claimed without one, or not in the ledger.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_claims_trace_context_is_kept_with_its_job() {
        let (_dir, ledger) = fresh().await;
        let kept = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ncongo=t61rcWkgMzE";
        let traced = NewClaim {
            trace_context: Some(kept.to_owned()),
            ..new_claim("traced")
        };
        assert_eq!(ledger.claim(traced).await.unwrap(), ClaimOutcome::Claimed);
        claimed(&ledger, "untraced").await;
        assert_eq!(ledger.trace_context(&id("traced")).await.unwrap().as_deref(), Some(kept));
        assert_eq!(ledger.trace_context(&id("untraced")).await.unwrap(), None);
        assert_eq!(ledger.trace_context(&id("never")).await.unwrap(), None);
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn due_jobs_come_oldest_first_up_to_the_limit() {
        let (_dir, ledger) = fresh().await;
        for job_id in ["due-1", "due-2", "due-3"] {
            claimed(&ledger, job_id).await;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let due = ledger.due_jobs(&default_route(), ledger::now_ms(), 2).await.unwrap();
        let ids: Vec<&str> = due.runnable.iter().map(JobId::as_str).collect();
        assert_eq!(ids, ["due-1", "due-2"]);
        assert!(due.unrunnable.is_empty());
        assert!(due.next_at.is_some());
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
        cli.retry_job(&id("shared"), None, &ledger::Actor::new("test"), ledger::now_ms()).await.unwrap();
        assert_eq!(cli.claim(new_claim("shared")).await.unwrap(), ClaimOutcome::Duplicate);
        assert_eq!(cli.claim(new_claim("from-cli")).await.unwrap(), ClaimOutcome::Claimed);
        cli.close().await;
        assert_eq!(state_of(&service, "shared").await, Some(State::Claimed));
        assert_eq!(state_of(&service, "from-cli").await, Some(State::Claimed));
        service.close().await;
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
