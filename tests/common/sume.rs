//! A Sume simulator on loopback: the job API (status, redeliver) and a webhook sender that
//! behaves as SUME.md documents (up to 10 attempts, a fixed delay, a 10 s timeout per attempt,
//! a fresh timestamp and signature per attempt, one `sume-v1` entry per signing secret).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sume_receiver::http_client::{self, HttpClient};
use sume_receiver::ingest::{SIGNATURE_HEADER, TIMESTAMP_HEADER};
use sume_receiver::signature;

pub const API_KEY: &str = "sume_test_api_key";
pub const MAX_ATTEMPTS: usize = 10;
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// One answer of the status endpoint.
#[derive(Debug, Clone)]
pub struct StatusAnswer {
    pub code: u16,
    pub body: String,
    pub retry_after: Option<u64>,
}

impl StatusAnswer {
    pub fn status(job_id: &str, status: &str) -> Self {
        let body = format!(r#"{{"job_id":"{job_id}","status":"{status}","output":{{"rows":3}}}}"#);
        StatusAnswer {
            code: 200,
            body,
            retry_after: None,
        }
    }

    pub fn error(code: u16, retry_after: Option<u64>) -> Self {
        StatusAnswer {
            code,
            body: r#"{"error":"nope"}"#.into(),
            retry_after,
        }
    }
}

#[derive(Default)]
struct State {
    /// Answers per job, used in order; the last one repeats.
    answers: HashMap<String, Vec<StatusAnswer>>,
    /// (job_id, when) of every status call.
    status_calls: Vec<(String, Instant)>,
    redeliver_calls: Vec<String>,
    /// What redeliver sends: the terminal event per job, and where to.
    events: HashMap<String, String>,
    webhook_url: Option<String>,
    secrets: Vec<String>,
    accepted_key: String,
}

/// What one delivery run (up to 10 attempts) saw.
#[derive(Debug, Clone)]
pub struct DeliveryRun {
    pub attempts: usize,
    /// The status of each attempt; 0 for a connection error or a timeout.
    pub statuses: Vec<u16>,
    /// The answer body of the accepted attempt.
    pub accepted_body: Option<serde_json::Value>,
}

#[derive(Clone)]
pub struct MockSume {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    client: HttpClient,
    pub retry_delay: Duration,
}

impl MockSume {
    /// Starts the job API on a fresh port; webhooks go to `webhook_url`, signed with `secrets`.
    pub async fn start(webhook_url: &str, secrets: &[&str], retry_delay: Duration) -> MockSume {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            webhook_url: Some(webhook_url.to_owned()),
            secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
            accepted_key: API_KEY.to_owned(),
            ..State::default()
        }));
        let sume = MockSume {
            addr,
            state,
            client: http_client::new_client(),
            retry_delay,
        };
        let server = sume.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let sume = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let sume = sume.clone();
                        async move { Ok::<_, Infallible>(sume.answer(request)) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        sume
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_answers(&self, job_id: &str, answers: Vec<StatusAnswer>) {
        self.state
            .lock()
            .unwrap()
            .answers
            .insert(job_id.to_owned(), answers);
    }

    /// The event Sume holds for a job (what a delivery or a Redeliver sends).
    pub fn set_event(&self, job_id: &str, body: &str) {
        self.state
            .lock()
            .unwrap()
            .events
            .insert(job_id.to_owned(), body.to_owned());
    }

    pub fn set_secrets(&self, secrets: &[&str]) {
        self.state.lock().unwrap().secrets = secrets.iter().map(|s| (*s).to_owned()).collect();
    }

    pub fn set_accepted_key(&self, key: &str) {
        self.state.lock().unwrap().accepted_key = key.to_owned();
    }

    pub fn status_calls(&self, job_id: &str) -> Vec<Instant> {
        let state = self.state.lock().unwrap();
        state
            .status_calls
            .iter()
            .filter(|(id, _)| id == job_id)
            .map(|(_, at)| *at)
            .collect()
    }

    pub fn all_status_calls(&self) -> Vec<Instant> {
        self.state
            .lock()
            .unwrap()
            .status_calls
            .iter()
            .map(|(_, at)| *at)
            .collect()
    }

    pub fn redeliver_calls(&self) -> Vec<String> {
        self.state.lock().unwrap().redeliver_calls.clone()
    }

    fn answer(&self, request: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path().to_owned();
        let mut state = self.state.lock().unwrap();
        let authorized = request.headers().get("authorization").is_some_and(|value| {
            value.to_str().unwrap() == format!("Bearer {}", state.accepted_key)
        });
        let job_id = path
            .strip_prefix("/v1/jobs/")
            .and_then(|rest| rest.split_once('/'))
            .map(|(id, action)| {
                (
                    percent_encoding::percent_decode_str(id)
                        .decode_utf8()
                        .unwrap()
                        .into_owned(),
                    action.to_owned(),
                )
            });
        let reply = |code: u16, body: String, retry_after: Option<u64>| {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = StatusCode::from_u16(code).unwrap();
            if let Some(seconds) = retry_after {
                response.headers_mut().insert("retry-after", seconds.into());
            }
            response
        };
        let Some((job_id, action)) = job_id else {
            return reply(404, "{}".into(), None);
        };
        match action.as_str() {
            "status" => {
                state.status_calls.push((job_id.clone(), Instant::now()));
                if !authorized {
                    return reply(401, r#"{"error":"bad api key"}"#.into(), None);
                }
                let Some(answers) = state.answers.get_mut(&job_id) else {
                    return reply(404, r#"{"error":"no such job"}"#.into(), None);
                };
                let answer = if answers.len() > 1 {
                    answers.remove(0)
                } else {
                    answers[0].clone()
                };
                reply(answer.code, answer.body, answer.retry_after)
            }
            "webhook/redeliver" if request.method() == hyper::Method::POST => {
                if !authorized {
                    return reply(401, r#"{"error":"bad api key"}"#.into(), None);
                }
                state.redeliver_calls.push(job_id.clone());
                let Some(body) = state.events.get(&job_id).cloned() else {
                    return reply(404, r#"{"error":"no such job"}"#.into(), None);
                };
                let sume = self.clone();
                tokio::spawn(async move { sume.deliver(&body).await });
                reply(202, r#"{"redelivery":"queued"}"#.into(), None)
            }
            _ => reply(404, "{}".into(), None),
        }
    }

    /// Delivers one event the way Sume does: until a 2xx, at most 10 attempts, a fixed delay
    /// between them, a fresh timestamp and signature each time.
    pub async fn deliver(&self, body: &str) -> DeliveryRun {
        let (url, secrets) = {
            let state = self.state.lock().unwrap();
            (state.webhook_url.clone().unwrap(), state.secrets.clone())
        };
        let mut run = DeliveryRun {
            attempts: 0,
            statuses: Vec::new(),
            accepted_body: None,
        };
        for attempt in 1..=MAX_ATTEMPTS {
            run.attempts = attempt;
            let timestamp = unix_now().to_string();
            let request = Request::post(url.as_str())
                .header("content-type", "application/json")
                .header(TIMESTAMP_HEADER, &timestamp)
                .header(
                    SIGNATURE_HEADER,
                    signature::sign(&secrets, &timestamp, body.as_bytes()),
                )
                .body(Full::new(Bytes::from(body.to_owned())))
                .unwrap();
            match http_client::send(&self.client, request, ATTEMPT_TIMEOUT, 64 * 1024).await {
                Ok(answer) if answer.status.is_success() => {
                    run.statuses.push(answer.status.as_u16());
                    run.accepted_body = serde_json::from_slice(&answer.body).ok();
                    return run;
                }
                Ok(answer) => run.statuses.push(answer.status.as_u16()),
                Err(_) => run.statuses.push(0),
            }
            if attempt < MAX_ATTEMPTS {
                tokio::time::sleep(self.retry_delay).await;
            }
        }
        run
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
