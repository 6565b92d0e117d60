//! Expected jobs: resolved by their webhook or by polls.

use super::*;

on_both_ledgers! {
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
}
