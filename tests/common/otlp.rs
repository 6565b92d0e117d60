//! A real OTLP/HTTP receiver for the tests: a hyper server decoding each export with the
//! OpenTelemetry project's own protocol definitions (opentelemetry-proto's types).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::task::JoinHandle;

/// The collector: every span it decoded, with the resource's `service.name`.
pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
    task: Option<JoinHandle<()>>,
}

impl Collector {
    pub async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut collector = Collector {
            addr: listener.local_addr().unwrap(),
            spans: Arc::default(),
            services: Arc::default(),
            task: None,
        };
        collector.serve(listener);
        collector
    }

    /// The `[tracing]` table that exports here.
    pub fn config(&self) -> String {
        format!("[tracing]\nendpoint = \"http://{}\"\n", self.addr)
    }

    /// Stops listening and closes its connections: the exporter's are refused.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Listens again on the same address.
    pub async fn restart(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let (spans, services) = (self.spans.clone(), self.services.clone());
        self.task = Some(tokio::spawn(async move {
            // Held here, so that a stop ends the exporter's kept-alive connections too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                while connections.try_join_next().is_some() {}
                let (spans, services) = (spans.clone(), services.clone());
                connections.spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let (spans, services) = (spans.clone(), services.clone());
                        async move {
                            assert_eq!(request.uri().path(), "/v1/traces");
                            assert_eq!(request.headers()["content-type"], "application/x-protobuf");
                            let body = request.into_body().collect().await.unwrap().to_bytes();
                            let export = ExportTraceServiceRequest::decode(body).unwrap();
                            for resource in export.resource_spans {
                                let name = resource
                                    .resource
                                    .iter()
                                    .flat_map(|r| &r.attributes)
                                    .find(|kv| kv.key == "service.name")
                                    .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?));
                                services.lock().unwrap().extend(name);
                                for scope in resource.scope_spans {
                                    spans.lock().unwrap().extend(scope.spans);
                                }
                            }
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }));
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    pub fn services(&self) -> Vec<String> {
        self.services.lock().unwrap().clone()
    }

    /// The spans of the job `job_id` (its `sume.job_id` attribute).
    pub fn spans_of(&self, job_id: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|span| attribute(span, "sume.job_id").as_deref() == Some(job_id))
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop();
    }
}

fn text(value: &any_value::Value) -> Option<String> {
    match value {
        any_value::Value::StringValue(text) => Some(text.clone()),
        any_value::Value::IntValue(number) => Some(number.to_string()),
        any_value::Value::BoolValue(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// A span's attribute as text (numbers and booleans written out).
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    let kv = span.attributes.iter().find(|kv| kv.key == key)?;
    text(kv.value.as_ref()?.value.as_ref()?)
}

/// The `traceparent` of a span: `00-<trace id>-<span id>-01`.
pub fn traceparent_of(span: &Span) -> String {
    format!(
        "00-{}-{}-01",
        hex::encode(&span.trace_id),
        hex::encode(&span.span_id)
    )
}
