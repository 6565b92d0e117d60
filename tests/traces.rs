//! Traces, end to end with a real OTLP receiver (tests/common/otlp.rs): a delivery's trace
//! chains delivery -> attempt -> handler, the handler gets the context, a retry is linked, and
//! a collector that is down costs no delivery.

mod common;

use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::otlp::{attribute, traceparent_of, Collector};
use common::*;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::trace::v1::Span;

const INBOUND_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const INBOUND: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A downstream that answers 204 and keeps each request's `traceparent`.
async fn downstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let kept = kept.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let traceparent = request
                            .headers()
                            .get("traceparent")
                            .map(|value| value.to_str().unwrap().to_owned())
                            .unwrap_or_default();
                        kept.lock().unwrap().push(traceparent);
                        let mut answer = Response::new(Full::new(Bytes::new()));
                        *answer.status_mut() = hyper::StatusCode::NO_CONTENT;
                        Ok::<_, Infallible>(answer)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}/jobs"), seen)
}

/// Delivers `body`, signed, with these extra headers.
async fn deliver_with_headers(
    server: &TestServer,
    body: &str,
    extra: &[(&'static str, &str)],
) -> u16 {
    let mut headers: Vec<(&str, String)> = signed_headers(body, unix_now(), &[SECRET]).into();
    headers.extend(
        extra
            .iter()
            .map(|(name, value)| (*name, (*value).to_owned())),
    );
    let answer = server
        .request(Method::POST, WEBHOOK_PATH, &headers, body)
        .await
        .unwrap();
    answer.status.as_u16()
}

/// Waits until the collector holds spans of `job_id` that `done` accepts.
async fn spans_when(
    collector: &Collector,
    job_id: &str,
    done: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    let ready = eventually(Duration::from_secs(15), || {
        done(&collector.spans_of(job_id))
    })
    .await;
    let spans = collector.spans_of(job_id);
    assert!(
        ready,
        "{:#?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    spans
}

fn named<'a>(spans: &'a [Span], prefix: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|span| span.name.starts_with(prefix))
        .collect()
}

on_both_ledgers! {
    /// A delivery with an inbound `traceparent`: its trace chains the delivery (a child of
    /// the inbound span), the attempt, and the handler's request, whose `traceparent` the
    /// downstream receives.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_delivery_chains_into_the_attempt_and_the_handlers_request() {
        let collector = Collector::start().await;
        let (url, seen) = downstream().await;
        let dir = tempfile::tempdir().unwrap();
        let admin_port = free_port();
        std::fs::write(dir.path().join("admin_token"), peers::OPERATOR_TOKEN).unwrap();
        let config = format!(
            "{}service_name = \"hooks-test\"\ntrace_url = \"https://tempo.example/trace/{{trace_id}}?from=sume&to=now\"\n\n\
             [handler]\nurl = \"{url}\"\n\n\
             [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n",
            collector.config()
        );
        let server = TestServer::start_in(dir, &config).await;
        let body = job_body("traced");
        assert_eq!(deliver_with_headers(&server, &body, &[("traceparent", INBOUND), ("tracestate", "congo=t61rcWkgMzE")]).await, 200);
        let spans = spans_when(&collector, "traced", |spans| {
            named(spans, "attempt").len() == 1 && named(spans, "POST /").len() == 1
        })
        .await;
        let delivery = named(&spans, "POST /sume/webhook")[0];
        assert_eq!(hex::encode(&delivery.trace_id), INBOUND_TRACE);
        assert_eq!(hex::encode(&delivery.parent_span_id), "00f067aa0ba902b7");
        assert_eq!(delivery.kind, 2, "server");
        assert_eq!(delivery.trace_state, "congo=t61rcWkgMzE");
        assert_eq!(attribute(delivery, "http.response.status_code").as_deref(), Some("200"));
        assert_eq!(attribute(delivery, "sume.duplicate").as_deref(), Some("false"));
        assert_eq!(attribute(delivery, "sume.event_type").as_deref(), Some("job.completed"));
        let attempt = named(&spans, "attempt")[0];
        assert_eq!(attempt.trace_id, delivery.trace_id);
        assert_eq!(attempt.parent_span_id, delivery.span_id);
        assert_eq!(attribute(attempt, "sume.attempt").as_deref(), Some("1"));
        assert_eq!(attribute(attempt, "sume.route").as_deref(), Some("default"));
        // The handler's request span has no job id of its own: found by its parent.
        let all = collector.spans();
        let request = all
            .iter()
            .find(|span| span.parent_span_id == attempt.span_id && span.name == "POST")
            .expect("the handler's request span");
        assert_eq!(request.kind, 3, "client");
        assert_eq!(attribute(request, "http.response.status_code").as_deref(), Some("204"));
        assert_eq!(attribute(request, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(seen.lock().unwrap().clone(), [traceparent_of(request)]);
        assert!(collector.services().iter().all(|name| name == "hooks-test"));
        // The console's job page shows the trace, linked by the template, escaped in HTML.
        let (status, cookie) = peers::sign_in(peers::OPERATOR, admin_port, peers::OPERATOR_TOKEN).await;
        assert_eq!(status, 303);
        let (status, page) = peers::page_text(admin_port, &cookie.unwrap(), "/console/jobs/traced").await;
        assert_eq!(status, 200);
        let link = format!("<a href=\"https://tempo.example/trace/{INBOUND_TRACE}?from=sume&amp;to=now\" rel=\"noreferrer\"><code>{INBOUND_TRACE}</code></a>");
        assert!(page.contains(&link), "{page}");
        // Nothing secret in any attribute: no signature, no body.
        for span in &all {
            for kv in &span.attributes {
                let value = format!("{:?}", kv.value);
                assert!(!value.contains("sume-v1=") && !value.contains("{\\\"job_id"), "{}: {value}", kv.key);
            }
        }
        server.stop().await.0.unwrap();
    }

    /// A command handler finds `TRACEPARENT` of its attempt's trace in its environment; its
    /// retry starts a new trace linked to the delivery's.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_command_sees_traceparent_and_its_retry_is_linked() {
        let collector = Collector::start().await;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("handler.sh");
        let env_dir = dir.path().join("env");
        std::fs::create_dir(&env_dir).unwrap();
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nprintf '%s' \"$TRACEPARENT\" > {env}/$SUME_ATTEMPT\n\
                 [ \"$SUME_ATTEMPT\" -ge 2 ] || exit 3\n",
                env = env_dir.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = format!(
            "{}\n[handler]\ncommand = [\"{}\"]\nmax_attempts = 2\nbackoff = \"50ms\"\n",
            collector.config(),
            script.display()
        );
        let server = TestServer::start_in(dir, &config).await;
        assert_eq!(deliver_with_headers(&server, &job_body("retried"), &[("traceparent", INBOUND)]).await, 200);
        let spans = spans_when(&collector, "retried", |spans| named(spans, "attempt").len() == 2).await;
        let delivery = named(&spans, "POST /sume/webhook")[0];
        let attempts = named(&spans, "attempt");
        let first = attempts.iter().find(|a| attribute(a, "sume.attempt").as_deref() == Some("1")).unwrap();
        let retry = attempts.iter().find(|a| attribute(a, "sume.attempt").as_deref() == Some("2")).unwrap();
        assert_eq!(first.trace_id, delivery.trace_id);
        assert_eq!(first.parent_span_id, delivery.span_id);
        assert_eq!(first.status.as_ref().map(|s| s.code), Some(2), "failed: an error status");
        assert_ne!(retry.trace_id, delivery.trace_id, "a retry is a trace of its own");
        assert!(retry.parent_span_id.is_empty());
        assert_eq!(retry.links.len(), 1);
        assert_eq!(retry.links[0].trace_id, delivery.trace_id);
        assert_eq!(retry.links[0].span_id, delivery.span_id);
        // Each run's TRACEPARENT is its command span's, a child of its attempt.
        let all = collector.spans();
        for (attempt, number) in [(first, 1), (retry, 2)] {
            let command = all
                .iter()
                .find(|span| span.parent_span_id == attempt.span_id && span.name == "command")
                .expect("the command's span");
            let seen = std::fs::read_to_string(server.dir.path().join(format!("env/{number}"))).unwrap();
            assert_eq!(seen, traceparent_of(command), "attempt {number}");
        }
        server.stop().await.0.unwrap();
    }
}

/// The collector stopped for 30 s under load: every delivery is still answered 200, and its
/// spans dropped and counted; once it is back, no span of a new delivery is lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_collector_down_for_30_seconds_costs_no_delivery() {
    const OUTAGE: Duration = Duration::from_secs(30);
    let mut collector = Collector::start().await;
    let config = format!("{}\n[log]\naccess = false\n", collector.config());
    let server = Arc::new(TestServer::start(&config).await);
    collector.stop();
    let started = std::time::Instant::now();
    let mut deliveries = tokio::task::JoinSet::new();
    for task in 0..8 {
        let server = server.clone();
        deliveries.spawn(async move {
            let mut sent = 0;
            while started.elapsed() < OUTAGE {
                let answer = server
                    .deliver(&job_body(&format!("down-{task}-{sent}")))
                    .await;
                assert_eq!(answer.status, 200);
                sent += 1;
                // Load, not a flood: the outage's length is what is tested.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        });
    }
    let mut sent = 0;
    while let Some(done) = deliveries.join_next().await {
        sent += done.unwrap();
    }
    let dropped = |metrics: &str| -> f64 {
        metrics
            .lines()
            .filter(|line| line.starts_with("sume_trace_spans_dropped_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // Two spans a delivery (its own and its claim's), all dropped within a few exports.
    let spans = 2.0 * sent as f64;
    let mut metrics = server.metrics().await;
    for _ in 0..100 {
        if dropped(&metrics) >= spans {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        metrics = server.metrics().await;
    }
    assert!(dropped(&metrics) >= spans, "{sent} deliveries: {metrics}");
    eprintln!("{sent} deliveries in {OUTAGE:?} with the collector down, every one 200");
    collector.restart().await;
    let after: Vec<String> = (0..20).map(|n| format!("after-{n}")).collect();
    for job_id in &after {
        assert_eq!(server.deliver(&job_body(job_id)).await.status, 200);
    }
    spans_when(&collector, "after-19", |spans| {
        !named(spans, "POST /").is_empty()
    })
    .await;
    for job_id in &after {
        assert!(
            !collector.spans_of(job_id).is_empty(),
            "no span of {job_id} after the collector came back"
        );
    }
    assert!(collector.spans_of("down-0-0").is_empty());
    Arc::into_inner(server).unwrap().stop().await.0.unwrap();
}

/// An operator's actions are spans of their own, with the actor; the retried job's next run
/// joins its trace again.
#[tokio::test(flavor = "multi_thread")]
async fn operator_actions_are_spans_with_their_actor() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    std::fs::write(dir.path().join("admin_token"), peers::OPERATOR_TOKEN).unwrap();
    let config = format!(
        "{}\n[handler]\ncommand = [\"true\"]\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"admin_token\"\n",
        collector.config()
    );
    let server = TestServer::start_in(dir, &config).await;
    assert_eq!(server.deliver(&job_body("acted")).await.status, 200);
    let done = eventually(Duration::from_secs(10), || {
        server.state_of("acted").as_deref() == Some("done")
    })
    .await;
    assert!(done);
    let bearer = format!("Bearer {}", peers::OPERATOR_TOKEN);
    let url = format!("http://127.0.0.1:{admin_port}/v1/jobs/acted/retry");
    let answer = send_to(Method::POST, &url, &[("authorization", &bearer)]).await;
    assert_eq!(answer.status, 200);
    let spans = spans_when(&collector, "acted", |spans| {
        !named(spans, "retry").is_empty() && named(spans, "attempt").len() == 2
    })
    .await;
    let retry = named(&spans, "retry")[0];
    assert_eq!(attribute(retry, "sume.action").as_deref(), Some("retry"));
    assert!(attribute(retry, "sume.actor").is_some_and(|actor| !actor.is_empty()));
    let delivery = named(&spans, "POST /sume/webhook")[0];
    assert!(named(&spans, "attempt")
        .iter()
        .all(|attempt| attempt.trace_id == delivery.trace_id));

    // The command line's actions too, with the operator's name, from a process of its own.
    let again = eventually(Duration::from_secs(10), || {
        server.state_of("acted").as_deref() == Some("done")
    })
    .await;
    assert!(again);
    let cli_config = server.dir.path().join("cli.toml");
    std::fs::write(
        &cli_config,
        config_text(server.dir.path(), &collector.config()),
    )
    .unwrap();
    let retried = common::service::cli(&cli_config, &["jobs", "retry", "acted"]);
    assert!(retried.status.success(), "{retried:?}");
    let spans = spans_when(&collector, "acted", |spans| {
        named(spans, "retry").len() == 2 && named(spans, "attempt").len() == 3
    })
    .await;
    let by_cli: Vec<_> = named(&spans, "retry")
        .into_iter()
        .filter(|retry| attribute(retry, "sume.actor").is_some_and(|by| by.starts_with("cli:")))
        .collect();
    assert_eq!(by_cli.len(), 1, "{spans:?}");
    assert_eq!(
        attribute(by_cli[0], "sume.job_id").as_deref(),
        Some("acted")
    );
    server.stop().await.0.unwrap();
}

/// The reconciler's poll of Sume is a span, and the job it recovers keeps the poll's trace: its
/// attempt joins it. The sweeper's take-back of a lease left by the run before is a span of its
/// own.
#[tokio::test(flavor = "multi_thread")]
async fn the_reconcilers_polls_and_the_sweepers_take_backs_are_spans() {
    use common::sume::{MockSume, StatusAnswer, API_KEY};
    use sume_receiver::ledger::{NewClaim, Routing, Source};
    use sume_receiver::route_name::RouteName;
    let dir = tempfile::tempdir().unwrap();
    // The run before: a job started, its receiver killed before it ended.
    let (_, ledger) = open_ledger(dir.path()).await;
    let left_behind = sume_receiver::job_id::JobId::parse("left-behind").unwrap();
    let claim = NewClaim {
        job_id: left_behind.clone(),
        event_type: None,
        body: job_body("left-behind").into(),
        source: Source::Webhook,
        trace_context: None,
        routing: Routing::default_route(),
    };
    ledger.claim(claim).await.unwrap();
    let now = sume_receiver::ledger::now_ms();
    let route = RouteName::default_route();
    let started = ledger.start_attempt(&left_behind, &route, now, now + 600_000);
    assert!(started.await.unwrap().is_some());
    ledger.close().await;

    let collector = Collector::start().await;
    // Nothing is delivered: the expected job reaches the receiver by polling alone.
    let sume = MockSume::start("http://127.0.0.1:9/", &[SECRET], Duration::from_millis(20)).await;
    std::fs::write(dir.path().join("api_key"), API_KEY).unwrap();
    let sume_api = format!(
        "[sume_api]\nbase_url = \"{}\"\napi_key_file = \"api_key\"\nreconcile_after = \"100ms\"\n\
         poll_backoff = \"100ms\"\nmax_poll_backoff = \"400ms\"\n",
        sume.base_url()
    );
    let config = format!(
        "{}\n[handler]\ncommand = [\"true\"]\n\n{sume_api}",
        collector.config()
    );
    let server = TestServer::start_in(dir, &config).await;
    let spans = spans_when(&collector, "left-behind", |spans| {
        !named(spans, "attempt").is_empty()
    })
    .await;
    let taken_back = collector
        .spans()
        .into_iter()
        .find(|span| span.name == "take back leases")
        .expect("a span of the take-back at the start");
    assert_eq!(
        attribute(&taken_back, "sume.leases_taken_back").as_deref(),
        Some("1")
    );
    assert_eq!(named(&spans, "attempt").len(), 1, "the job ran again, once");

    sume.set_answers("polled", vec![StatusAnswer::status("polled", "completed")]);
    let cli_config = server.dir.path().join("cli.toml");
    std::fs::write(&cli_config, config_text(server.dir.path(), &sume_api)).unwrap();
    let expected = common::service::cli(&cli_config, &["jobs", "expect", "polled"]);
    assert!(expected.status.success(), "{expected:?}");
    let spans = spans_when(&collector, "polled", |spans| {
        !named(spans, "poll Sume").is_empty() && !named(spans, "attempt").is_empty()
    })
    .await;
    let poll = named(&spans, "poll Sume")[0];
    assert_eq!(
        attribute(poll, "sume.poll_result").as_deref(),
        Some("recovered")
    );
    assert_eq!(named(&spans, "attempt")[0].trace_id, poll.trace_id);
    server.stop().await.0.unwrap();
}
