//! Spans: the tracer that starts them (or nothing, when tracing is off), and what an ended one holds.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use super::context::SpanContext;
use crate::metrics::METRICS;

/// How a span relates to the one it follows.
pub enum Parent<'a> {
    /// A new trace.
    Root,
    /// A child in the same trace: an inbound `traceparent`, or a span of ours.
    Child(&'a SpanContext),
    /// A new trace linked to this one: a job's retry, so that one trace does not grow for days.
    Link(&'a SpanContext),
}

/// OTLP's span kinds (`opentelemetry.proto.trace.v1.Span.SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Consumer = 5,
}

/// Which traces are recorded: the parent's decision where there is one (parent-based), else
/// this ratio of the new trace ids.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    pub ratio: f64,
    pub parent_based: bool,
}

impl Sampler {
    fn samples(&self, trace_id: &[u8; 16]) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        // The trace id's last 8 bytes are random (W3C level 2): compared with the ratio of
        // their range, every receiver decides alike for one trace id.
        let random = u64::from_be_bytes(trace_id[8..].try_into().expect("8 bytes"));
        (random as f64) < self.ratio * (u64::MAX as f64)
    }
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(String),
    Int(i64),
    Bool(bool),
}

/// What may be an attribute's value, turned into one only when the span records (so that a
/// span that does not record costs no allocation).
pub trait IntoValue {
    fn into_value(self) -> Value;
}

impl IntoValue for &str {
    fn into_value(self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl IntoValue for String {
    fn into_value(self) -> Value {
        Value::Text(self)
    }
}

impl IntoValue for i64 {
    fn into_value(self) -> Value {
        Value::Int(self)
    }
}

impl IntoValue for u32 {
    fn into_value(self) -> Value {
        Value::Int(self.into())
    }
}

impl IntoValue for u16 {
    fn into_value(self) -> Value {
        Value::Int(self.into())
    }
}

impl IntoValue for bool {
    fn into_value(self) -> Value {
        Value::Bool(self)
    }
}

/// A span that ended, for the exporter.
#[derive(Debug, Clone)]
pub struct SpanData {
    pub name: String,
    pub kind: Kind,
    pub context: SpanContext,
    pub parent_span_id: Option<[u8; 8]>,
    pub links: Vec<SpanContext>,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// The status: `None` unset, `Some(message)` an error.
    pub error: Option<String>,
}

/// Starts spans; a clone is cheap. Off, it starts spans that are nothing.
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<TracerInner>>);

struct TracerInner {
    sampler: Sampler,
    queue: mpsc::Sender<SpanData>,
}

/// Where a step's spans go: the tracer, and the span they are children of.
#[derive(Clone, Copy)]
pub struct Within<'a> {
    pub tracer: &'a Tracer,
    pub parent: Option<&'a SpanContext>,
}

impl Within<'_> {
    /// No spans (the command line's runs).
    pub fn nothing() -> Within<'static> {
        Within {
            tracer: Tracer::off(),
            parent: None,
        }
    }

    /// A child of the parent; nothing without one.
    pub fn start(&self, name: &str, kind: Kind) -> Span {
        match self.parent {
            Some(parent) => self.tracer.start(name, kind, Parent::Child(parent)),
            None => Span::default(),
        }
    }
}

impl Tracer {
    /// A tracer that is off, for what never traces (the command line).
    pub fn off() -> &'static Tracer {
        static OFF: Tracer = Tracer(None);
        &OFF
    }

    /// A tracer whose ended spans go to `queue` (never waiting: a full queue drops them).
    pub fn new(sampler: Sampler, queue: mpsc::Sender<SpanData>) -> Tracer {
        Tracer(Some(Arc::new(TracerInner { sampler, queue })))
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Starts a span named `name` now. Off, the span is nothing (no context, no allocation).
    pub fn start(&self, name: &str, kind: Kind, parent: Parent<'_>) -> Span {
        let Some(inner) = &self.0 else {
            return Span::default();
        };
        let sampler = &inner.sampler;
        let (context, parent_span_id, link) = match parent {
            Parent::Root => {
                let mut context = SpanContext::root(true);
                context.sampled = sampler.samples(&context.trace_id);
                (context, None, None)
            }
            Parent::Child(parent) => {
                let mut context = parent.child();
                if !sampler.parent_based {
                    context.sampled = sampler.samples(&context.trace_id);
                }
                (context, Some(parent.span_id), None)
            }
            Parent::Link(linked) => {
                let mut context = SpanContext::root(true);
                context.trace_state = linked.trace_state.clone();
                // One job is recorded, or not, as a whole: its retries follow its first trace.
                context.sampled = if sampler.parent_based {
                    linked.sampled
                } else {
                    sampler.samples(&context.trace_id)
                };
                (context, None, Some(linked.clone()))
            }
        };
        let recording = context.sampled.then(|| {
            Box::new(Recording {
                data: SpanData {
                    name: name.to_owned(),
                    kind,
                    context: context.clone(),
                    parent_span_id,
                    links: link.into_iter().collect(),
                    start_unix_nanos: unix_nanos(),
                    end_unix_nanos: 0,
                    attributes: Vec::new(),
                    error: None,
                },
                queue: inner.queue.clone(),
            })
        });
        Span {
            context: Some(context),
            recording,
        }
    }
}

/// A started span: ended (and queued for export, when recorded) when dropped.
#[derive(Default)]
pub struct Span {
    /// `None` when tracing is off; present, to be passed on, when the trace is not recorded.
    context: Option<SpanContext>,
    recording: Option<Box<Recording>>,
}

struct Recording {
    data: SpanData,
    queue: mpsc::Sender<SpanData>,
}

impl Span {
    /// Its context, to pass on (a child's parent, a header, a handler's environment).
    pub fn context(&self) -> Option<&SpanContext> {
        self.context.as_ref()
    }

    pub fn is_recording(&self) -> bool {
        self.recording.is_some()
    }

    /// Sets an attribute (nothing when the span does not record).
    pub fn set(&mut self, key: &'static str, value: impl IntoValue) {
        if let Some(recording) = &mut self.recording {
            recording.data.attributes.push((key, value.into_value()));
        }
    }

    /// Marks the span failed: `error.type` (a short class, low in cardinality) and the status.
    pub fn fail(&mut self, error_type: &str, message: impl FnOnce() -> String) {
        if let Some(recording) = &mut self.recording {
            recording
                .data
                .attributes
                .push(("error.type", error_type.into_value()));
            recording.data.error = Some(message());
        }
    }

    /// The log's span for the lines written while this one runs: they carry its `trace_id`
    /// and `span_id` (JSON: under `span`). None when it does not record.
    pub fn log_span(&self) -> tracing::Span {
        match (&self.context, &self.recording) {
            (Some(context), Some(_)) => tracing::info_span!(
                "trace",
                trace_id = %hex::encode(context.trace_id),
                span_id = %hex::encode(context.span_id),
            ),
            _ => tracing::Span::none(),
        }
    }

    /// Ends the span without exporting it (a sweep that found nothing).
    pub fn discard(&mut self) {
        self.recording = None;
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(mut recording) = self.recording.take() else {
            return;
        };
        recording.data.end_unix_nanos = unix_nanos();
        if recording.queue.try_send(recording.data).is_err() {
            METRICS.traces.record_dropped("queue_full", 1);
        }
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracer(ratio: f64, parent_based: bool) -> (Tracer, mpsc::Receiver<SpanData>) {
        let (queue, spans) = mpsc::channel(8);
        let sampler = Sampler {
            ratio,
            parent_based,
        };
        (Tracer::new(sampler, queue), spans)
    }

    #[test]
    fn off_a_span_is_nothing() {
        let mut span = Tracer::default().start("delivery", Kind::Server, Parent::Root);
        span.set("sume.job_id", "j1");
        assert!(span.context().is_none());
        assert!(!span.is_recording());
    }

    #[test]
    fn an_ended_span_is_queued_with_its_parent_and_attributes() {
        let (tracer, mut spans) = tracer(1.0, true);
        let mut parent = tracer.start("delivery", Kind::Server, Parent::Root);
        let child = tracer.start(
            "claim",
            Kind::Internal,
            Parent::Child(parent.context().unwrap()),
        );
        let child_context = child.context().unwrap().clone();
        drop(child);
        parent.set("sume.job_id", "j1");
        parent.fail("timeout", || "claim not committed".into());
        let parent_context = parent.context().unwrap().clone();
        drop(parent);
        let claim = spans.try_recv().unwrap();
        assert_eq!(claim.context, child_context);
        assert_eq!(claim.parent_span_id, Some(parent_context.span_id));
        let delivery = spans.try_recv().unwrap();
        assert_eq!(delivery.parent_span_id, None);
        assert!(delivery.end_unix_nanos >= delivery.start_unix_nanos);
        assert_eq!(
            delivery.attributes[0],
            ("sume.job_id", Value::Text("j1".into()))
        );
        assert_eq!(delivery.error.as_deref(), Some("claim not committed"));
    }

    #[test]
    fn a_retry_is_a_new_trace_linked_to_the_first() {
        let (tracer, mut spans) = tracer(1.0, true);
        let first = SpanContext::root(true);
        drop(tracer.start("attempt", Kind::Consumer, Parent::Link(&first)));
        let retry = spans.try_recv().unwrap();
        assert_ne!(retry.context.trace_id, first.trace_id);
        assert_eq!(retry.links, [first]);
    }

    #[test]
    fn sampling_follows_the_parent_or_the_ratio() {
        let (tracer, mut spans) = tracer(0.0, true);
        assert!(!tracer
            .start("delivery", Kind::Server, Parent::Root)
            .is_recording());
        let sampled = SpanContext::root(true);
        assert!(tracer
            .start("attempt", Kind::Consumer, Parent::Child(&sampled))
            .is_recording());
        let unsampled = SpanContext::root(false);
        let span = tracer.start("attempt", Kind::Consumer, Parent::Link(&unsampled));
        assert!(!span.is_recording());
        assert!(span.context().is_some(), "passed on, unsampled");
        drop(span);
        spans.try_recv().unwrap();
        assert!(spans.try_recv().is_err());

        let half = Sampler {
            ratio: 0.5,
            parent_based: true,
        };
        let kept = (0..10_000)
            .filter(|_| half.samples(&SpanContext::root(true).trace_id))
            .count();
        assert!((4_500..5_500).contains(&kept), "{kept}");
    }

    /// Every JSON line written inside a recorded span carries its ids.
    #[test]
    fn log_lines_inside_a_span_carry_its_ids() {
        #[derive(Clone, Default)]
        struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_writer(move || writer.clone())
            .finish();
        let (tracer, _spans) = tracer(1.0, true);
        let span = tracer.start("attempt", Kind::Consumer, Parent::Root);
        let context = span.context().unwrap().clone();
        tracing::subscriber::with_default(subscriber, || {
            let _entered = span.log_span().entered();
            tracing::info!(job_id = "j1", "job done");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(line["span"]["trace_id"], hex::encode(context.trace_id));
        assert_eq!(line["span"]["span_id"], hex::encode(context.span_id));
        assert!(Span::default().log_span().is_none());
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (tracer, _spans) = tracer(1.0, true);
        let before = METRICS.traces.dropped("queue_full");
        for _ in 0..10 {
            drop(tracer.start("delivery", Kind::Server, Parent::Root));
        }
        assert!(METRICS.traces.dropped("queue_full") >= before + 2);
    }
}
