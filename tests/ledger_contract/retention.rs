//! Retention: bodies purged, jobs and ended stops forgotten, unfinished work never touched.

use super::*;

on_both_ledgers! {
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

    /// Retention forgets a job's history with the job: a Redeliver after it is a new job with
    /// none.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_forgotten_job_leaves_no_history() {
        let (_dir, ledger) = fresh().await;
        claimed(&ledger, "forgotten").await;
        let attempt = started(&ledger, "forgotten", i64::MAX).await;
        ledger.finish_attempt(&attempt, &failed(None), 1_000).await.unwrap();
        ledger.retry_job(&id("forgotten"), None, &ledger::Actor::new("test"), 1_000).await.unwrap();
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

    /// Retention forgets the stops that ended before its cutoff, a bounded batch at a time;
    /// one still in force stays.
    #[tokio::test(flavor = "multi_thread")]
    async fn retention_forgets_ended_stops_in_batches() {
        let (_dir, ledger) = fresh().await;
        for at in [1_000, 3_000, 5_000] {
            assert!(ledger.set_dispatch(true, &ledger::Actor::because("cli:dave", None), at).await.unwrap());
            assert!(ledger.set_dispatch(false, &ledger::Actor::because("cli:dave", None), at + 1_000).await.unwrap());
        }
        assert!(ledger.set_dispatch(true, &ledger::Actor::because("cli:dave", None), 7_000).await.unwrap());
        let step = RetentionStep::DeleteEndedStops;
        assert_eq!(ledger.retention_step(step, 5_000, 1).await.unwrap(), 1);
        assert_eq!(ledger.retention_step(step, 5_000, 10).await.unwrap(), 1);
        assert_eq!(ledger.retention_step(step, 5_000, 10).await.unwrap(), 0);
        let left: Vec<_> = ledger.dispatch_stops(0, 10_000, 20).await.unwrap()
            .iter().map(|stop| (stop.started_at, stop.ended_at)).collect();
        assert_eq!(left, [(5_000, Some(6_000)), (7_000, None)]);
        ledger.close().await;
    }
}
