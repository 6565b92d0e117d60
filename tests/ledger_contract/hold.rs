//! Dispatch and the hold: pause and resume, the stops' log, one probe at a time.

use super::*;

on_both_ledgers! {
    /// Pausing dispatch is recorded once, with who; resuming likewise.
    #[tokio::test(flavor = "multi_thread")]
    async fn dispatch_can_be_paused_and_resumed() {
        let (_dir, ledger) = fresh().await;
        assert!(!ledger.dispatch().await.unwrap().paused);
        assert!(ledger.set_dispatch(true, &ledger::Actor::because("cli:dave", None), 1_000).await.unwrap());
        assert!(!ledger.set_dispatch(true, &ledger::Actor::because("cli:erin", None), 2_000).await.unwrap(), "already paused");
        let dispatch = ledger.dispatch().await.unwrap();
        assert_eq!(
            dispatch,
            ledger::Dispatch { paused: true, changed_at: Some(1_000), changed_by: Some("cli:dave".into()) }
        );
        assert!(ledger.set_dispatch(false, &ledger::Actor::because("cli:erin", None), 3_000).await.unwrap());
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
                route: (kind == ledger::StopKind::Hold).then(|| "default".to_owned()),
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
            route: "default".into(),
            since,
            reason: cause.into(),
            sample_error: "connection refused".into(),
            next_probe_at: since + 5_000,
            probe_interval_ms: 5_000,
        };
        assert!(ledger.set_dispatch(true, &ledger::Actor::because("cli:dave", Some("deploy «é»")), 1_000).await.unwrap());
        assert!(!ledger.set_dispatch(true, &ledger::Actor::because("cli:erin", Some("again")), 1_200).await.unwrap());
        assert!(ledger.open_hold(&opened(1_500)).await.unwrap());
        assert!(!ledger.open_hold(&opened(1_600)).await.unwrap(), "a hold was open");
        assert_eq!(
            ledger.dispatch_stops(0, 10_000, 20).await.unwrap(),
            [
                stop(pause, 1_000, Some("cli:dave"), Some("deploy «é»"), None, None),
                stop(hold, 1_500, None, Some(cause), None, None),
            ]
        );
        assert!(ledger.set_dispatch(false, &ledger::Actor::because("cli:erin", None), 3_000).await.unwrap());
        assert!(ledger.open_hold(&opened(4_000)).await.unwrap());
        assert_eq!(ledger.end_hold(&default_route(), 4_000, 5_000).await.unwrap().map(|h| h.since), Some(4_000));
        assert!(ledger.set_dispatch(true, &ledger::Actor::because("cli:dave", None), 6_000).await.unwrap());
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

    /// A hold opens once (a second receiver's finds it open), its probe moves only from where
    /// it is (one receiver takes each probe), and it ends once, returning what it was.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_hold_opens_once_moves_its_probe_once_and_ends_once() {
        let (_dir, ledger) = fresh().await;
        assert_eq!(ledger.hold(&default_route()).await.unwrap(), None);
        let hold = ledger::Hold {
            route: "default".into(),
            since: 1_000,
            reason: "5 different jobs failed in a row".into(),
            sample_error: "handler answered 502 Bad Gateway: «é»".into(),
            next_probe_at: 6_000,
            probe_interval_ms: 5_000,
        };
        assert!(ledger.open_hold(&hold).await.unwrap());
        let second = ledger::Hold { since: 1_500, reason: "other".into(), ..hold.clone() };
        assert!(!ledger.open_hold(&second).await.unwrap(), "a hold was open");
        assert_eq!(ledger.hold(&default_route()).await.unwrap().as_ref(), Some(&hold));

        assert!(ledger.move_probe(&ProbeMove { route: "default".into(), since: 1_000, from: 6_000, to: 20_000, interval_ms: 10_000 }).await.unwrap());
        assert!(!ledger.move_probe(&ProbeMove { route: "default".into(), since: 1_000, from: 6_000, to: 21_000, interval_ms: 10_000 }).await.unwrap(), "taken already");
        assert!(!ledger.move_probe(&ProbeMove { route: "default".into(), since: 1_500, from: 20_000, to: 21_000, interval_ms: 10_000 }).await.unwrap(), "not that hold");
        let moved = ledger.hold(&default_route()).await.unwrap().unwrap();
        assert_eq!((moved.next_probe_at, moved.probe_interval_ms), (20_000, 10_000));

        assert_eq!(ledger.end_hold(&default_route(), 1_500, 9_000).await.unwrap(), None, "not that hold");
        assert_eq!(ledger.end_hold(&default_route(), 1_000, 9_000).await.unwrap(), Some(moved));
        assert_eq!(ledger.end_hold(&default_route(), 1_000, 9_000).await.unwrap(), None, "ended already");
        assert_eq!(ledger.hold(&default_route()).await.unwrap(), None);
        ledger.close().await;
    }

    /// `jobs resume` ends a hold, and is then a change though dispatch was not paused; a
    /// pause leaves the hold as it is.
    #[tokio::test(flavor = "multi_thread")]
    async fn resuming_dispatch_ends_a_hold() {
        let (_dir, ledger) = fresh().await;
        let hold = ledger::Hold {
            route: "default".into(),
            since: 1_000,
            reason: "the handler's downstream cannot be reached".into(),
            sample_error: "connection refused".into(),
            next_probe_at: 6_000,
            probe_interval_ms: 5_000,
        };
        assert!(ledger.open_hold(&hold).await.unwrap());
        assert!(ledger.set_dispatch(true, &ledger::Actor::because("cli:dave", None), 2_000).await.unwrap());
        assert_eq!(ledger.hold(&default_route()).await.unwrap(), Some(hold.clone()), "a pause keeps the hold");
        assert!(ledger.set_dispatch(false, &ledger::Actor::because("cli:dave", None), 3_000).await.unwrap());
        assert_eq!(ledger.hold(&default_route()).await.unwrap(), None);

        assert!(ledger.open_hold(&hold).await.unwrap());
        assert!(ledger.set_dispatch(false, &ledger::Actor::because("cli:erin", None), 4_000).await.unwrap(), "a hold ended");
        assert_eq!(ledger.hold(&default_route()).await.unwrap(), None);
        assert_eq!(ledger.dispatch().await.unwrap().changed_by.as_deref(), Some("cli:erin"));
        assert!(!ledger.set_dispatch(false, &ledger::Actor::because("cli:erin", None), 5_000).await.unwrap(), "nothing to end");
        ledger.close().await;
    }
}
