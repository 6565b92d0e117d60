//! What the console and `jobs` read: counts, lists, filters, histories, the snapshot, minutes.

use super::*;

on_both_ledgers! {
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
        let lease = LeasedAttempt { route: "default".into(), job_id: c.job_id.to_string(), number: c.number.into() };
        ledger.take_back_lease(&lease, 200, now, 1, "lease expired").await.unwrap();
        agree("done, retrying, taken back dead").await;
        ledger.cancel_job(&id("count-e"), None, &ledger::Actor::because("test", Some("not wanted")), now).await.unwrap();
        ledger.give_up("count-b", "given up", now).await.unwrap();
        agree("cancelled, given up").await;
        ledger.retry_job(&id("count-c"), None, &ledger::Actor::new("test"), now).await.unwrap();
        ledger.run_now(&id("count-c"), None, &ledger::Actor::new("test"), now).await.unwrap();
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
        ledger.retry_job(&id("told"), None, &ledger::Actor::new("cli:alice"), now + 10).await.unwrap();
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
        let lease = LeasedAttempt { route: "default".into(), job_id: "interrupted".into(), number: first.number.into() };
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
            ledger.retry_job(&id("restless"), None, &ledger::Actor::new("test"), 1_000).await.unwrap();
        }
        let job = ledger.show_job(&id("restless")).await.unwrap().unwrap();
        assert_eq!(job.history.len(), ledger::HISTORY_PER_JOB as usize);
        assert_eq!(job.actions.len(), ledger::HISTORY_PER_JOB as usize);
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
