//! Handlers: run one attempt of a job as a command (body on stdin) or as an HTTP POST.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Request, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::config::{HandlerKind, HandlerUrl};
use crate::http_client::{self, HttpClient, SendError};
use crate::ledger::{Attempt, Failure};
use crate::logging::Escaped;
use crate::traces::{Kind, Span, Within};

/// How much of a failing handler's stderr (or HTTP answer) is kept as the job's last error.
const ERROR_TAIL_BYTES: usize = 2048;
/// After the handler exits, how long a grandchild that inherited stderr may keep it open.
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// Why an attempt did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptError {
    /// The handler failed: what the ledger records, and what it says of the downstream.
    Failed(Failure, Sign),
    /// The receiver is shutting down and stopped the handler: not the job's fault, not counted
    /// here. The job stays `running` and the next start recovers it.
    Interrupted,
}

/// What a failure says about the handler's downstream, beyond the job (the hold reads it, with
/// the failure's exit or HTTP status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sign {
    /// Nothing more than its status.
    Failed,
    /// The handler did not finish (or answer) within its timeout.
    TimedOut,
    /// The downstream could not be reached at all.
    Unreachable,
    /// It said it is overloaded or unavailable (HTTP 429, 503), with its `Retry-After`.
    Busy(Option<Duration>),
}

pub enum Handler {
    Command(Vec<String>),
    Http {
        client: Box<HttpClient>,
        url: hyper::Uri,
        /// The URL's `user:password@`, as `Basic ...` (marked sensitive: never logged).
        authorization: Option<HeaderValue>,
    },
}

impl Handler {
    /// `ca_file`: CA certificates an https URL may be signed by, besides the system's.
    pub fn new(kind: HandlerKind, ca_file: Option<&Path>) -> anyhow::Result<Self> {
        Ok(match kind {
            HandlerKind::Command(argv) => Handler::Command(argv),
            HandlerKind::Url(url) => {
                let target = HandlerUrl::parse(&url).map_err(anyhow::Error::msg)?;
                let authorization = target
                    .basic_auth
                    .map(|(user, password)| basic_authorization(&user, password.expose()))
                    .transpose()?;
                Handler::Http {
                    client: Box::new(
                        http_client::client_trusting(ca_file).context("handler.ca_file")?,
                    ),
                    url: target.uri,
                    authorization,
                }
            }
        })
    }

    /// Runs one attempt. `stop` interrupts it (shutdown grace is over); `timeout` fails it.
    /// Its span (the command's run, the HTTP request) is a child of `within`'s, and its
    /// context is passed on: `TRACEPARENT` in the command's environment, `traceparent` header.
    pub async fn run(
        &self,
        attempt: &Attempt,
        timeout: Duration,
        stop: &CancellationToken,
        within: Within<'_>,
    ) -> Result<(), AttemptError> {
        match self {
            Handler::Command(argv) => {
                let mut span = within.start("command", Kind::Internal);
                if span.is_recording() {
                    let program = Path::new(&argv[0]).file_name().unwrap_or_default();
                    span.set("process.executable.name", &*program.to_string_lossy());
                }
                let outcome = run_command(argv, attempt, timeout, stop, &span).await;
                if let Err(AttemptError::Failed(failure, _)) = &outcome {
                    if let Some(code) = failure.exit_status {
                        span.set("process.exit.code", i64::from(code));
                    }
                    span.fail(sign_type(&outcome), || failure.error.clone());
                }
                outcome
            }
            Handler::Http {
                client,
                url,
                authorization,
            } => {
                let mut span = within.start("POST", Kind::Client);
                if span.is_recording() {
                    span.set("http.request.method", "POST");
                    span.set("server.address", url.host().unwrap_or_default());
                    if let Some(port) = url.port_u16() {
                        span.set("server.port", port);
                    }
                }
                let outcome = tokio::select! {
                    result = post(client, (url, authorization.as_ref()), attempt, timeout, &mut span) => {
                        result.map_err(|(failure, sign)| AttemptError::Failed(failure, sign))
                    }
                    () = stop.cancelled() => Err(AttemptError::Interrupted),
                };
                match &outcome {
                    Ok(()) => {}
                    Err(AttemptError::Failed(failure, _)) => {
                        span.fail(sign_type(&outcome), || failure.error.clone());
                    }
                    Err(AttemptError::Interrupted) => span.fail("interrupted", String::new),
                }
                outcome
            }
        }
    }
}

/// A failed attempt's `error.type`: what its sign says of the downstream, else its status.
fn sign_type(outcome: &Result<(), AttemptError>) -> &'static str {
    match outcome {
        Ok(()) => "",
        Err(AttemptError::Interrupted) => "interrupted",
        Err(AttemptError::Failed(failure, sign)) => match sign {
            Sign::TimedOut => "timeout",
            Sign::Unreachable => "unreachable",
            Sign::Busy(_) => "busy",
            Sign::Failed if failure.http_status.is_some() => "http_status",
            Sign::Failed if failure.exit_status.is_some() => "exit_status",
            Sign::Failed => "failed",
        },
    }
}

async fn run_command(
    argv: &[String],
    attempt: &Attempt,
    timeout: Duration,
    stop: &CancellationToken,
    span: &Span,
) -> Result<(), AttemptError> {
    let mut command = tokio::process::Command::new(&argv[0]);
    // The W3C environment carrier: the command's own spans join its attempt's trace.
    if let Some(context) = span.context() {
        command.env("TRACEPARENT", context.traceparent());
        if !context.trace_state.is_empty() {
            command.env("TRACESTATE", &context.trace_state);
        }
    }
    command
        .args(&argv[1..])
        .env("SUME_JOB_ID", attempt.job_id.as_str())
        .env(
            "SUME_EVENT_TYPE",
            attempt.event_type.as_deref().unwrap_or(""),
        )
        .env("SUME_ATTEMPT", attempt.number.to_string())
        .env("SUME_DELIVERY_SOURCE", attempt.source.as_str())
        // The service's conversation with systemd is its own (NotifyAccess=main anyway).
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout can kill everything the handler started.
        .process_group(0)
        .kill_on_drop(true);
    // No pre_exec step (the ambient capabilities are cleared at the process's start: main.rs),
    // so the standard library starts it with posix_spawn, which does not copy the receiver's
    // page tables as a fork does: the receiver's CPU per `true` job went from about 1,000 to
    // about 270 µs (bench/work.sh, concurrency 32; docs/performance.md).
    let mut child = command.spawn().map_err(|e| {
        AttemptError::Failed(
            Failure::new(format!("cannot start {:?}: {e}", argv[0])),
            Sign::Failed,
        )
    })?;
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    let stderr_tail = tokio::spawn(read_tail(child.stderr.take()));
    // Fed from its own task: the exit status alone decides the attempt. A handler may exit
    // without reading its stdin, or hand it to a background child that never reads it; the
    // write then never finishes, and it is dropped with the attempt.
    let feed_stdin = tokio::spawn({
        let stdin = child.stdin.take();
        let body = attempt.body.clone();
        async move {
            if let Some(mut stdin) = stdin {
                // A handler that does not read its stdin is fine: ignore the broken pipe.
                let _ = stdin.write_all(body.as_bytes()).await;
            }
        }
    });
    let finished = tokio::select! {
        result = tokio::time::timeout(timeout, child.wait()) => Some(result),
        () = stop.cancelled() => None,
    };
    feed_stdin.abort();
    let outcome = match finished {
        Some(Ok(Ok(status))) if status.success() => Ok(()),
        Some(Ok(Ok(status))) => Err((
            Failure {
                error: describe_exit(status),
                exit_status: status.code(),
                http_status: None,
            },
            Sign::Failed,
        )),
        Some(Ok(Err(error))) => Err((
            Failure::new(format!("waiting for the handler failed: {error}")),
            Sign::Failed,
        )),
        Some(Err(_)) => {
            kill_group(group);
            Err((
                Failure::new(format!(
                    "timed out after {}; process group killed",
                    humantime::format_duration(timeout)
                )),
                Sign::TimedOut,
            ))
        }
        None => {
            kill_group(group);
            let _ = child.wait().await;
            stderr_tail.abort();
            return Err(AttemptError::Interrupted);
        }
    };
    let _ = child.wait().await;
    let tail = match tokio::time::timeout(STDERR_DRAIN, stderr_tail).await {
        Ok(Ok(tail)) => tail,
        _ => String::new(),
    };
    match outcome {
        Ok(()) => {
            if !tail.is_empty() {
                // What a successful handler says on stderr belongs in the service's log.
                tracing::info!(job_id = %attempt.job_id, output = %Escaped(&tail), "handler stderr");
            }
            Ok(())
        }
        Err((failure, sign)) if tail.is_empty() => Err(AttemptError::Failed(failure, sign)),
        Err((failure, sign)) => Err(AttemptError::Failed(
            Failure {
                error: format!("{}; stderr: {tail}", failure.error),
                ..failure
            },
            sign,
        )),
    }
}

fn kill_group(group: Option<i32>) {
    if let Some(pgid) = group {
        // SAFETY: killpg has no memory-safety preconditions; the group is the handler's own.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("ended abnormally ({status})"),
    }
}

/// Reads a stream to its end, keeping only its last [`ERROR_TAIL_BYTES`].
async fn read_tail(stream: Option<impl AsyncRead + Unpin>) -> String {
    let Some(mut stream) = stream else {
        return String::new();
    };
    let mut tail = Vec::with_capacity(ERROR_TAIL_BYTES * 2);
    let mut chunk = [0u8; 4096];
    while let Ok(read) = stream.read(&mut chunk).await {
        if read == 0 {
            break;
        }
        tail.extend_from_slice(&chunk[..read]);
        if tail.len() > ERROR_TAIL_BYTES {
            tail.drain(..tail.len() - ERROR_TAIL_BYTES);
        }
    }
    String::from_utf8_lossy(&tail).trim().to_owned()
}

/// `Basic` credentials (RFC 7617), as a header value never shown in a log or a debug print.
fn basic_authorization(user: &str, password: &str) -> anyhow::Result<HeaderValue> {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}"))?;
    value.set_sensitive(true);
    Ok(value)
}

async fn post(
    client: &HttpClient,
    (url, authorization): (&hyper::Uri, Option<&HeaderValue>),
    attempt: &Attempt,
    timeout: Duration,
    span: &mut Span,
) -> Result<(), (Failure, Sign)> {
    let unsent = |e: String| (Failure::new(e), Sign::Failed);
    let mut request = Request::post(url.clone());
    if let Some(context) = span.context() {
        request = request.header("traceparent", context.traceparent());
        if !context.trace_state.is_empty() {
            request = request.header("tracestate", context.trace_state.as_str());
        }
    }
    if let Some(authorization) = authorization {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    let request = request
        .header(CONTENT_TYPE, "application/json")
        // As bytes: a UTF-8 id is obs-text, which a header may carry but `&str` would refuse.
        .header(
            "x-sume-job-id",
            HeaderValue::from_bytes(attempt.job_id.as_str().as_bytes())
                .map_err(|e| unsent(format!("cannot send the job_id as a header: {e}")))?,
        )
        .header("x-sume-attempt", attempt.number)
        .header("x-sume-delivery-source", attempt.source.as_str())
        .body(Full::new(Bytes::from(attempt.body.clone())))
        .map_err(|e| unsent(format!("cannot build the request: {e}")))?;
    let answer = http_client::send(client, request, timeout, ERROR_TAIL_BYTES)
        .await
        .map_err(|error| {
            let sign = match error {
                SendError::Unreachable(_) => Sign::Unreachable,
                SendError::TimedOut(_) => Sign::TimedOut,
                SendError::Failed(_) => Sign::Failed,
            };
            (Failure::new(error.to_string()), sign)
        })?;
    span.set("http.response.status_code", answer.status.as_u16());
    if let Some(why) = &answer.cut {
        // Judged by its status line alone, as curl would: a body cut short loses only its end.
        tracing::debug!(job_id = %attempt.job_id, status = %answer.status, why = %Escaped(why), "the handler's answer broke off after its status");
    }
    if answer.status.is_success() {
        return Ok(());
    }
    let sign = match answer.status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Sign::Busy(
            http_client::retry_after(&answer.headers, std::time::SystemTime::now()),
        ),
        _ => Sign::Failed,
    };
    let text = String::from_utf8_lossy(&answer.body);
    Err((
        Failure {
            error: format!("handler answered {}: {}", answer.status, text.trim()),
            exit_status: None,
            http_status: Some(answer.status.as_u16()),
        },
        sign,
    ))
}
