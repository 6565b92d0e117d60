//! An event's message and fields as one logfmt line: `message name=value name="two words"`.
//!
//! What the text format prints and journald's `MESSAGE` holds: every value bare when it is one
//! word, quoted otherwise, so a line parses as logfmt whichever way its value was recorded.
//! (tracing's default format quotes the `&str` fields and leaves `%Display` ones bare, spaces
//! and all.)

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// The text format's fields, as [`Fields`] writes them.
pub struct LogfmtFields;

impl<'writer> FormatFields<'writer> for LogfmtFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut recorded = Fields::default();
        fields.record(&mut recorded);
        write!(writer, "{recorded}")
    }
}

/// The message and the other fields of an event, each as its `%` (Display) or `?` (Debug) form.
#[derive(Default)]
pub(super) struct Fields {
    message: String,
    pub(super) values: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            name => self.values.push((name, value.to_owned())),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            name => self.values.push((name, format!("{value:?}"))),
        }
    }
}

/// The message, then each field as ` name=value`.
impl fmt::Display for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        for (at, (name, value)) in self.values.iter().enumerate() {
            let space = if at == 0 && self.message.is_empty() {
                ""
            } else {
                " "
            };
            write!(f, "{space}{name}={}", Logfmt(value))?;
        }
        Ok(())
    }
}

/// A value in the message as logfmt writes it: bare if it is one word, else quoted with `"`
/// and `\` escaped, and control characters (a newline a stranger put in a value could forge a
/// log line) written as escapes, as tracing's own quoting of `&str` fields did.
pub(super) struct Logfmt<'a>(pub(super) &'a str);

impl fmt::Display for Logfmt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bare = !self.0.is_empty()
            && !self
                .0
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=' || c == '\\');
        if bare {
            return f.write_str(self.0);
        }
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' | '\\' => write!(f, "\\{c}")?,
                c if c.is_control() => write!(f, "{}", c.escape_default())?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Regression: the text format printed `outcome="unauthorized" ... error=bad signature: x`,
    /// the `&str` field quoted and the `%Display` one with its spaces bare.
    #[test]
    fn the_text_format_prints_a_line_that_parses_as_logfmt() {
        let printed = Arc::new(Mutex::new(Vec::new()));
        let writer = printed.clone();
        let layer = tracing_subscriber::fmt::layer()
            .fmt_fields(LogfmtFields)
            .without_time()
            .with_target(false)
            .with_ansi(false)
            .with_writer(move || Buffer(writer.clone()));
        let subscriber =
            tracing_subscriber::layer::SubscriberExt::with(tracing_subscriber::registry(), layer);
        tracing::subscriber::with_default(subscriber, || {
            let error = "bad signature: no signature entry matches any configured secret";
            tracing::warn!(
                peer = "203.0.113.9:50412",
                outcome = "unauthorized",
                status = 401,
                latency_ms = 0.21,
                error = %error,
                "delivery refused"
            );
        });
        let line = String::from_utf8(printed.lock().unwrap().clone()).unwrap();
        assert_eq!(
            line.trim_start(),
            "WARN delivery refused peer=203.0.113.9:50412 outcome=unauthorized status=401 \
             latency_ms=0.21 error=\"bad signature: no signature entry matches any configured \
             secret\"\n"
        );
    }

    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn message_values_are_bare_words_or_quoted() {
        assert_eq!(Logfmt("claimed").to_string(), "claimed");
        assert_eq!(
            Logfmt("exited with status 143").to_string(),
            "\"exited with status 143\""
        );
        assert_eq!(Logfmt(r#"a "b" \c"#).to_string(), r#""a \"b\" \\c""#);
        assert_eq!(Logfmt("").to_string(), "\"\"");
        // A newline never ends the line early.
        assert_eq!(Logfmt("a\nforged=line").to_string(), r#""a\nforged=line""#);
        assert_eq!(Logfmt("tab\there").to_string(), r#""tab\there""#);
    }
}
