//! The hold's judgement of failures, alone: blame, streaks, probes.

use super::*;
use crate::config::HandlerKind;

fn breaker() -> Arc<Breaker> {
    let config = HandlerConfig {
        kind: HandlerKind::Command(vec!["true".into()]),
        ca_file: None,
        timeout: Duration::from_secs(1),
        concurrency: 4,
        max_attempts: 5,
        backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(8),
        hold: HoldConfig::default(),
    };
    Breaker::new(
        crate::route_name::RouteName::default_route(),
        &config,
        Duration::ZERO,
    )
}

fn failed(breaker: &Breaker, job_id: &str, failure: Failure, sign: Sign) -> Verdict {
    breaker.started(false);
    let job_id = JobId::parse(job_id).unwrap();
    breaker.finished(&job_id, None, Err((&failure, sign)))
}

fn status(code: u16) -> Failure {
    Failure {
        http_status: Some(code),
        ..Failure::new(format!("handler answered {code}"))
    }
}

#[test]
fn content_failures_never_blame_the_downstream() {
    let config = HoldConfig::default();
    for code in [400, 404, 409, 422] {
        assert_eq!(
            blame(&config, &status(code), Sign::Failed),
            Blame::Job,
            "{code}"
        );
    }
    for code in [408, 500, 502] {
        assert_eq!(
            blame(&config, &status(code), Sign::Failed),
            Blame::Maybe,
            "{code}"
        );
    }
    let exit = |code| Failure {
        exit_status: Some(code),
        ..Failure::new("exited")
    };
    assert_eq!(blame(&config, &exit(65), Sign::Failed), Blame::Job);
    assert_eq!(blame(&config, &exit(1), Sign::Failed), Blame::Maybe);
    assert_eq!(
        blame(&config, &exit(75), Sign::Failed),
        Blame::Downstream(None)
    );
    let after = Some(Duration::from_secs(7));
    assert_eq!(
        blame(&config, &status(503), Sign::Busy(after)),
        Blame::Downstream(after)
    );
}

#[test]
fn one_job_failing_again_and_again_is_not_an_outage() {
    let breaker = breaker();
    for _ in 0..10 {
        let verdict = failed(&breaker, "poison", status(500), Sign::Failed);
        assert_eq!(verdict.change, HoldChange::None);
        assert!(verdict.counts);
    }
    for i in 0..3 {
        let verdict = failed(&breaker, &format!("job-{i}"), status(500), Sign::Failed);
        assert_eq!(
            verdict.change,
            HoldChange::None,
            "only {} different jobs",
            i + 2
        );
    }
    // A success between clears the streak.
    breaker.started(false);
    breaker.finished(&JobId::parse("fine").unwrap(), None, Ok(()));
    for i in 0..4 {
        let verdict = failed(&breaker, &format!("again-{i}"), status(502), Sign::Failed);
        assert_eq!(verdict.change, HoldChange::None);
    }
    let verdict = failed(&breaker, "again-4", status(502), Sign::TimedOut);
    assert!(verdict.counts, "the failure that reveals the outage counts");
    let HoldChange::Open(hold) = verdict.change else {
        panic!("5 different jobs in a row open a hold: {verdict:?}");
    };
    assert_eq!(hold.next_probe_at - hold.since, 5_000);
    assert!(hold.reason.contains("5 different jobs"), "{}", hold.reason);
}

#[test]
fn once_held_outage_failures_are_given_back_and_a_failed_probe_doubles_the_wait() {
    let breaker = breaker();
    let verdict = failed(&breaker, "a", Failure::new("refused"), Sign::Unreachable);
    let HoldChange::Open(hold) = verdict.change else {
        panic!("an unreachable downstream opens a hold at once: {verdict:?}");
    };
    breaker.observe(Some(hold.clone()), Instant::now());
    let during = failed(&breaker, "b", status(500), Sign::Failed);
    assert_eq!((during.counts, during.change), (false, HoldChange::None));
    let content = failed(&breaker, "c", status(422), Sign::Failed);
    assert!(
        content.counts,
        "a content failure is the job's own, held or not"
    );

    let taken_to = breaker.probe_until(&hold);
    breaker.probe_taken(&hold, taken_to);
    let probe = breaker.finished(
        &JobId::parse("d").unwrap(),
        Some(taken_to),
        Err((&status(503), Sign::Busy(Some(Duration::from_secs(3600))))),
    );
    assert!(!probe.counts, "a failed probe costs no attempt");
    let HoldChange::MoveProbe(ProbeMove {
        from,
        to,
        interval_ms,
        ..
    }) = probe.change
    else {
        panic!("{probe:?}");
    };
    assert_eq!((from, interval_ms), (taken_to, 10_000));
    // A Retry-After of an hour is bounded by max_probe_interval (5 min).
    assert!((to - now_ms() - 300_000).abs() < 1_000, "{}", to - now_ms());

    breaker.started(false);
    let success = breaker.finished(&JobId::parse("e").unwrap(), None, Ok(()));
    assert_eq!(success.change, HoldChange::End { since: hold.since });
}
