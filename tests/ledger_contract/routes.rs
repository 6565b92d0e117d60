//! Routes: a claim's work on each route it takes, written with it; each route's work run,
//! retried, held and finished on its own; the job done once every route's work is.

use super::*;

fn route(name: &str) -> RouteName {
    RouteName::parse(name).unwrap()
}

fn routed_claim(job_id: &str, routes: &[&str]) -> NewClaim {
    NewClaim {
        routing: ledger::Routing::Routes(routes.iter().map(|name| route(name)).collect()),
        ..new_claim(job_id)
    }
}

async fn start_on(ledger: &Ledger, job_id: &str, on: &str) -> Option<Attempt> {
    ledger
        .start_attempt(&id(job_id), &route(on), ledger::now_ms(), i64::MAX)
        .await
        .unwrap()
}

async fn due_on(ledger: &Ledger, on: &str) -> Vec<String> {
    let due = ledger
        .due_jobs(&route(on), ledger::now_ms(), 10)
        .await
        .unwrap();
    due.runnable
        .iter()
        .map(|job_id| job_id.as_str().to_owned())
        .collect()
}

on_both_ledgers! {
    /// A fan-out claim writes the work of each route in its transaction; a duplicate writes
    /// none; each route's due work is its own.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_claim_writes_each_routes_work_once_and_each_route_sees_its_own() {
        let (_dir, ledger) = fresh().await;
        let claim = routed_claim("fan", &["pager", "archive"]);
        assert_eq!(ledger.claim(claim.clone()).await.unwrap(), ClaimOutcome::Claimed);
        assert_eq!(ledger.claim(claim).await.unwrap(), ClaimOutcome::Duplicate);
        assert_eq!(
            ledger.claim(routed_claim("fan", &["other"])).await.unwrap(),
            ClaimOutcome::Duplicate,
            "a duplicate writes no work, whatever the routes say now"
        );
        ledger.claim(routed_claim("archive-only", &["archive"])).await.unwrap();
        assert_eq!(due_on(&ledger, "pager").await, ["fan"]);
        assert_eq!(due_on(&ledger, "archive").await, ["fan", "archive-only"]);
        assert!(due_on(&ledger, "other").await.is_empty());
        let snapshot = ledger.metrics_snapshot().await.unwrap();
        assert_eq!(
            snapshot.work,
            [("archive".to_owned(), 2, 0), ("pager".to_owned(), 1, 0)]
        );
        ledger.close().await;
    }

    /// Each route's attempt is fenced by its own number; the job runs while one route runs,
    /// waits while one waits, and is done only once every route is; a route's failure counts
    /// against that route alone.
    #[tokio::test(flavor = "multi_thread")]
    async fn each_routes_work_runs_and_finishes_on_its_own_and_the_job_sums_them_up() {
        let (_dir, ledger) = fresh().await;
        ledger.claim(routed_claim("both", &["a", "b"])).await.unwrap();
        let on_a = start_on(&ledger, "both", "a").await.expect("a's work was due");
        assert_eq!((on_a.route.as_str(), on_a.number), ("a", 1));
        assert!(start_on(&ledger, "both", "a").await.is_none(), "started once");
        assert_eq!(state_of(&ledger, "both").await, Some(State::Running));
        let retry_at = ledger::now_ms() + 60_000;
        assert_eq!(
            ledger.finish_attempt(&on_a, &failed(Some(retry_at)), ledger::now_ms()).await.unwrap(),
            Some(State::Retrying)
        );
        assert_eq!(state_of(&ledger, "both").await, Some(State::Retrying));
        let on_b = start_on(&ledger, "both", "b").await.expect("b's work was due");
        assert_eq!(on_b.number, 1, "b counts its own attempts");
        assert_eq!(
            ledger.finish_attempt(&on_b, &AttemptEnd::Done, ledger::now_ms()).await.unwrap(),
            Some(State::Done)
        );
        assert_eq!(state_of(&ledger, "both").await, Some(State::Retrying), "a still waits");
        assert!(due_on(&ledger, "b").await.is_empty());
        assert!(ledger.run_now(&id("both"), None, &ledger::Actor::new("cli:test"), ledger::now_ms()).await.unwrap());
        let again = start_on(&ledger, "both", "a").await.expect("a's retry is due now");
        assert_eq!(again.number, 2);
        assert_eq!(
            ledger.finish_attempt(&on_a, &AttemptEnd::Done, ledger::now_ms()).await.unwrap(),
            None,
            "the first attempt no longer owns a's work"
        );
        assert_eq!(
            ledger.finish_attempt(&again, &AttemptEnd::Done, ledger::now_ms()).await.unwrap(),
            Some(State::Done)
        );
        let job = ledger.show_job(&id("both")).await.unwrap().unwrap();
        assert_eq!((job.summary.state.as_str(), job.summary.attempts), ("done", 3));
        assert!(job.summary.finished_at.is_some());
        let history: Vec<(&str, u32, Option<&str>)> = job
            .history
            .iter()
            .map(|a| (a.route.as_str(), a.number, a.outcome.as_deref()))
            .collect();
        assert_eq!(
            history,
            [("a", 1, Some("failed")), ("b", 1, Some("done")), ("a", 2, Some("done"))]
        );
        ledger.close().await;
    }

    /// One route dead and the others done: the job is dead; a retry runs the dead route's
    /// work again, not the done ones'.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_dead_route_makes_the_job_dead_and_a_retry_runs_that_route_alone() {
        let (_dir, ledger) = fresh().await;
        ledger.claim(routed_claim("half", &["ok", "bad"])).await.unwrap();
        let ok = start_on(&ledger, "half", "ok").await.unwrap();
        ledger.finish_attempt(&ok, &AttemptEnd::Done, ledger::now_ms()).await.unwrap();
        let bad = start_on(&ledger, "half", "bad").await.unwrap();
        ledger.finish_attempt(&bad, &failed(None), ledger::now_ms()).await.unwrap();
        assert_eq!(state_of(&ledger, "half").await, Some(State::Dead));
        ledger.retry_job(&id("half"), None, &ledger::Actor::new("cli:test"), ledger::now_ms()).await.unwrap();
        assert_eq!(state_of(&ledger, "half").await, Some(State::Claimed));
        assert_eq!(due_on(&ledger, "bad").await, ["half"]);
        assert!(due_on(&ledger, "ok").await.is_empty(), "the done route is not run again");
        ledger.close().await;
    }

    /// Cancel, run-now and retry on one route leave the job's other routes as they were; a
    /// route the job does not have is refused as unknown.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_action_on_one_route_changes_that_routes_work_alone() {
        let (_dir, ledger) = fresh().await;
        ledger.claim(routed_claim("picked", &["a", "b", "c"])).await.unwrap();
        let by = ledger::Actor::because("cli:test", Some("not for c"));
        let now = ledger::now_ms();
        assert!(ledger.cancel_job(&id("picked"), Some(&route("c")), &by, now).await.unwrap());
        assert!(!ledger.cancel_job(&id("picked"), Some(&route("c")), &by, now).await.unwrap(), "c is dead already");
        assert_eq!(due_on(&ledger, "a").await, ["picked"]);
        assert!(due_on(&ledger, "c").await.is_empty());
        for on in ["a", "b"] {
            let attempt = start_on(&ledger, "picked", on).await.unwrap();
            let retry_at = ledger::now_ms() + 60_000;
            ledger.finish_attempt(&attempt, &failed(Some(retry_at)), ledger::now_ms()).await.unwrap();
        }
        let operator = ledger::Actor::new("cli:test");
        assert!(ledger.run_now(&id("picked"), Some(&route("b")), &operator, ledger::now_ms()).await.unwrap());
        assert_eq!(due_on(&ledger, "b").await, ["picked"]);
        assert!(due_on(&ledger, "a").await.is_empty(), "a still waits out its backoff");
        ledger.retry_job(&id("picked"), Some(&route("c")), &operator, ledger::now_ms()).await.unwrap();
        assert_eq!(due_on(&ledger, "c").await, ["picked"], "c runs again, alone");
        assert!(matches!(
            ledger.retry_job(&id("picked"), Some(&route("a")), &operator, ledger::now_ms()).await,
            Err(RetryError::NotFinished { state, .. }) if state == "retrying"
        ));
        assert!(matches!(
            ledger.retry_job(&id("picked"), Some(&route("zzz")), &operator, ledger::now_ms()).await,
            Err(RetryError::Unknown(_))
        ));
        ledger.close().await;
    }

    /// An event no route takes is recorded finished at its claim, with why, and has no work.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_event_no_route_takes_is_finished_at_its_claim_and_never_dropped() {
        let (_dir, ledger) = fresh().await;
        for (job_id, state) in [("unrouted-dead", ledger::FinishedState::Dead), ("unrouted-done", ledger::FinishedState::Done)] {
            let claim = NewClaim {
                routing: ledger::Routing::Unrouted {
                    state,
                    error: "no route takes event type \"job.odd\"".into(),
                },
                ..new_claim(job_id)
            };
            assert_eq!(ledger.claim(claim).await.unwrap(), ClaimOutcome::Claimed);
            let job = ledger.show_job(&id(job_id)).await.unwrap().unwrap();
            assert_eq!(job.summary.state, state.as_str());
            assert!(job.summary.finished_at.is_some());
            assert_eq!(job.summary.last_error.as_deref(), Some("no route takes event type \"job.odd\""));
        }
        assert!(due_on(&ledger, "default").await.is_empty());
        ledger.close().await;
    }

    /// A route's hold is that route's alone: another route opens, moves and ends its own.
    #[tokio::test(flavor = "multi_thread")]
    async fn each_route_holds_on_its_own() {
        let (_dir, ledger) = fresh().await;
        let hold = |on: &str, since| ledger::Hold {
            route: on.into(),
            since,
            reason: format!("{on}'s downstream cannot be reached"),
            sample_error: "connection refused".into(),
            next_probe_at: since + 5_000,
            probe_interval_ms: 5_000,
        };
        assert!(ledger.open_hold(&hold("a", 1_000)).await.unwrap());
        assert_eq!(ledger.hold(&route("b")).await.unwrap(), None);
        assert!(ledger.open_hold(&hold("b", 2_000)).await.unwrap(), "b holds on its own");
        assert!(!ledger.open_hold(&hold("a", 3_000)).await.unwrap(), "a was held");
        let moved = ProbeMove { route: "a".into(), since: 1_000, from: 6_000, to: 9_000, interval_ms: 5_000 };
        assert!(ledger.move_probe(&moved).await.unwrap());
        assert!(!ledger.move_probe(&ProbeMove { route: "b".into(), ..moved }).await.unwrap(), "not b's hold");
        assert_eq!(ledger.end_hold(&route("b"), 1_000, 4_000).await.unwrap(), None, "not b's since");
        assert!(ledger.end_hold(&route("a"), 1_000, 4_000).await.unwrap().is_some());
        let left: Vec<String> = ledger.holds().await.unwrap().into_iter().map(|h| h.route).collect();
        assert_eq!(left, ["b"]);
        let stops = ledger.dispatch_stops(0, 10_000, 10).await.unwrap();
        let stops: Vec<(Option<&str>, Option<i64>)> =
            stops.iter().map(|s| (s.route.as_deref(), s.ended_at)).collect();
        assert_eq!(stops, [(Some("a"), Some(4_000)), (Some("b"), None)]);
        ledger.close().await;
    }

    /// A lease taken back is that route's attempt's; the job's other route is untouched.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_lease_taken_back_is_one_routes() {
        let (_dir, ledger) = fresh().await;
        ledger.claim(routed_claim("leased", &["a", "b"])).await.unwrap();
        let on_a = ledger
            .start_attempt(&id("leased"), &route("a"), ledger::now_ms(), 100)
            .await
            .unwrap()
            .unwrap();
        let on_b = start_on(&ledger, "leased", "b").await.unwrap();
        let now = ledger::now_ms();
        let taken = ledger
            .expire_leases(Leases::ExpiredBefore(200), now, |_| 5, "lease expired", |_, _| false)
            .await
            .unwrap();
        assert_eq!(taken, 1, "only a's lease expired");
        assert_eq!(due_on(&ledger, "a").await, ["leased"]);
        assert_eq!(
            ledger.finish_attempt(&on_b, &AttemptEnd::Done, now).await.unwrap(),
            Some(State::Done)
        );
        assert_eq!(ledger.finish_attempt(&on_a, &AttemptEnd::Done, now).await.unwrap(), None);
        assert_eq!(state_of(&ledger, "leased").await, Some(State::Retrying));
        ledger.close().await;
    }
}
