//! Where log lines go: journald (with priorities and fields) under systemd, JSON for log
//! shippers, plain text on a terminal. `RUST_LOG` overrides the level.

mod journal;
mod logfmt;

use std::fmt::{self, Write as _};
use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use journal::Journal;
use logfmt::LogfmtFields;

/// Installs the process's log subscriber; `default_level` applies unless `RUST_LOG` is set.
pub fn init(default_level: &str, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let registry = tracing_subscriber::registry().with(filter);
    match resolve(format) {
        LogFormat::Journald => match Journal::connect() {
            Ok(journal) => return registry.with(journal).init(),
            Err(error) => {
                eprintln!("cannot write to journald ({error}); logging to stderr instead")
            }
        },
        LogFormat::Json => {
            return registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .json()
                        .flatten_event(true)
                        .with_writer(std::io::stderr),
                )
                .init()
        }
        LogFormat::Auto | LogFormat::Text => {}
    }
    registry
        .with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(LogfmtFields)
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr),
        )
        .init();
}

/// `auto`: journald when systemd connected stderr to the journal (it sets `JOURNAL_STREAM`),
/// text otherwise.
fn resolve(format: LogFormat) -> LogFormat {
    match format {
        LogFormat::Auto if std::env::var_os("JOURNAL_STREAM").is_some() => LogFormat::Journald,
        LogFormat::Auto => LogFormat::Text,
        other => other,
    }
}

/// A value with every control character escaped (`\n`, `\u{1b}`), and every invisible format
/// or bidi character (`\u{202e}`, which reverses the text after it), and nothing else
/// changed: a handler's output, an error or an id from the ledger can neither split a log
/// line, drive the terminal that shows it, nor show itself as another id, and no Debug quotes
/// end up in a journal or JSON field.
pub struct Escaped<T>(pub T);

/// As [`Escaped`], but keeping line breaks and tabs: a text of many lines shown as such (a
/// payload, an attempt's error in the console), whose format characters are shown escaped.
pub struct EscapedLines<T>(pub T);

/// Unicode's format characters that change how text around them looks without showing
/// themselves: the bidi marks, embeddings, overrides and isolates, zero-width ones, the BOM.
fn is_format(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

/// Writes `value` with the characters `escaped` says escaped (`\u{202e}`).
fn write_escaped(
    f: &mut fmt::Formatter<'_>,
    value: &dyn fmt::Display,
    escaped: fn(char) -> bool,
) -> fmt::Result {
    struct Escaping<'a, 'b>(&'a mut fmt::Formatter<'b>, fn(char) -> bool);
    impl fmt::Write for Escaping<'_, '_> {
        fn write_str(&mut self, text: &str) -> fmt::Result {
            for c in text.chars() {
                if (self.1)(c) {
                    write!(self.0, "{}", c.escape_default())?;
                } else {
                    self.0.write_char(c)?;
                }
            }
            Ok(())
        }
    }
    write!(Escaping(f, escaped), "{value}")
}

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, &self.0, |c| c.is_control() || is_format(c))
    }
}

impl<T: fmt::Display> fmt::Display for EscapedLines<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, &self.0, |c| {
            (c.is_control() && !matches!(c, '\n' | '\t')) || is_format(c)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_values_keep_their_text_and_lose_their_control_characters() {
        assert_eq!(
            Escaped("exited with status 143").to_string(),
            "exited with status 143"
        );
        assert_eq!(
            Escaped("line\nforged \u{1b}[31m\"x\"").to_string(),
            "line\\nforged \\u{1b}[31m\"x\""
        );
        assert_eq!(
            Escaped("job\u{202e}gpj.exe\u{200b}").to_string(),
            "job\\u{202e}gpj.exe\\u{200b}"
        );
        assert_eq!(
            EscapedLines("{\n\t\"a\": \"\u{202e}b\r\"\n}").to_string(),
            "{\n\t\"a\": \"\\u{202e}b\\r\"\n}"
        );
    }
}
