//! W3C trace context: `traceparent` and `tracestate` read strictly, written, and kept with a job.

use std::fmt;

/// Longest `tracestate` kept: W3C allows 32 members of up to 256 characters, and a proxy that
/// sends more is cut off rather than carried into every attempt's environment.
const MAX_TRACESTATE: usize = 512;

/// One span's place in a trace, as `traceparent` carries it, with the `tracestate` beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// Whether the trace is recorded (the `sampled` flag).
    pub sampled: bool,
    /// The vendors' `tracestate`, passed on as it came (empty when none).
    pub trace_state: String,
}

impl SpanContext {
    /// A new span id in the same trace.
    pub fn child(&self) -> SpanContext {
        SpanContext {
            span_id: new_span_id(),
            ..self.clone()
        }
    }

    /// A new trace: a fresh trace id and span id.
    pub fn root(sampled: bool) -> SpanContext {
        SpanContext {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            sampled,
            trace_state: String::new(),
        }
    }

    /// Reads an inbound `traceparent` (and `tracestate`): version 00 exactly as W3C writes it,
    /// or a later version's first four fields; anything else is `None`, never an error, since
    /// it is not Sume's fault that a proxy sent a bad one.
    pub fn from_headers(traceparent: &[u8], tracestate: Option<&[u8]>) -> Option<SpanContext> {
        let text = std::str::from_utf8(traceparent).ok()?;
        let mut fields = text.split('-');
        let version = fields.next()?;
        let trace_id = fields.next()?;
        let span_id = fields.next()?;
        let flags = fields.next()?;
        let more = fields.next();
        let version = lower_hex::<1>(version)?[0];
        // ff is forbidden; 00 has exactly four fields; a later version may append some.
        if version == 0xff || (version == 0 && more.is_some()) {
            return None;
        }
        let trace_id = lower_hex::<16>(trace_id)?;
        let span_id = lower_hex::<8>(span_id)?;
        let flags = lower_hex::<1>(flags)?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
            trace_state: tracestate.and_then(valid_tracestate).unwrap_or_default(),
        })
    }

    /// The `traceparent` header's value: `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            u8::from(self.sampled)
        )
    }

    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The form kept in the ledger's `jobs.trace_context`: the `traceparent`, then the
    /// `tracestate` on a second line when there is one.
    pub fn to_stored(&self) -> String {
        if self.trace_state.is_empty() {
            self.traceparent()
        } else {
            format!("{}\n{}", self.traceparent(), self.trace_state)
        }
    }

    /// Reads [`SpanContext::to_stored`]'s form back; `None` for anything else.
    pub fn from_stored(stored: &str) -> Option<SpanContext> {
        let (traceparent, tracestate) = match stored.split_once('\n') {
            Some((traceparent, tracestate)) => (traceparent, Some(tracestate.as_bytes())),
            None => (stored, None),
        };
        SpanContext::from_headers(traceparent.as_bytes(), tracestate)
    }
}

impl fmt::Display for SpanContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent())
    }
}

/// `N` bytes from exactly `2N` lowercase hex digits (W3C refuses uppercase).
fn lower_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut bytes = [0; N];
    hex::decode_to_slice(text, &mut bytes).ok()?;
    Some(bytes)
}

/// A `tracestate` worth passing on: printable ASCII without a control character, within
/// [`MAX_TRACESTATE`]; members are the vendors' business and are not parsed further.
fn valid_tracestate(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let printable = text.bytes().all(|b| (b' '..=b'~').contains(&b));
    (printable && !text.is_empty() && text.len() <= MAX_TRACESTATE).then(|| text.to_owned())
}

/// A random, non-zero trace id.
pub fn new_trace_id() -> [u8; 16] {
    fastrand::u128(1..).to_be_bytes()
}

/// A random, non-zero span id.
pub fn new_span_id() -> [u8; 8] {
    fastrand::u64(1..).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn parse(traceparent: &str) -> Option<SpanContext> {
        SpanContext::from_headers(traceparent.as_bytes(), None)
    }

    #[test]
    fn reads_and_writes_the_w3c_example() {
        let context = parse(GOOD).unwrap();
        assert!(context.sampled);
        assert_eq!(context.traceparent(), GOOD);
        assert_eq!(context.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let unsampled = parse(&GOOD.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn a_malformed_traceparent_is_ignored() {
        for bad in [
            "",
            "00",
            &GOOD.to_uppercase(),
            &GOOD.replace("00-4bf", "ff-4bf"),
            &format!("{GOOD}-extra"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            SpanContext::from_headers(&[0xff, 0xfe], None),
            None,
            "not UTF-8"
        );
    }

    #[test]
    fn a_later_version_is_read_for_its_first_fields() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert_eq!(parse(later).unwrap().traceparent(), GOOD);
    }

    #[test]
    fn tracestate_is_kept_when_printable_and_short() {
        let read = |state: &[u8]| SpanContext::from_headers(GOOD.as_bytes(), Some(state));
        assert_eq!(
            read(b"congo=t61rcWkgMzE").unwrap().trace_state,
            "congo=t61rcWkgMzE"
        );
        assert_eq!(read(b"a=1\r\nx-forged: 1").unwrap().trace_state, "");
        assert_eq!(read(&[b'a'; 600]).unwrap().trace_state, "");
    }

    #[test]
    fn the_stored_form_reads_back() {
        let mut context = parse(GOOD).unwrap();
        assert_eq!(
            SpanContext::from_stored(&context.to_stored()),
            Some(context.clone())
        );
        context.trace_state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7".into();
        assert_eq!(
            SpanContext::from_stored(&context.to_stored()),
            Some(context)
        );
        assert_eq!(SpanContext::from_stored("garbage"), None);
    }

    #[test]
    fn new_ids_are_never_zero_and_children_keep_the_trace() {
        let root = SpanContext::root(true);
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_ne!(root.trace_id, [0; 16]);
    }
}
