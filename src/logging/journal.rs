//! Log lines to journald: one datagram of its native protocol per event, the fields shown in the
//! message as the text format shows them, and kept as `SUME_*` fields for `journalctl` to match.
//!
//! Our own rather than tracing-journald's: that one puts only the message text in `MESSAGE`, so
//! `journalctl -u sume-receiver` showed "delivery refused" with no job, reason or peer.

use std::io;
use std::os::unix::net::UnixDatagram;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

use super::logfmt::Fields;

const SOCKET: &str = "/run/systemd/journal/socket";
/// Our fields' prefix: bare `JOB_ID` is systemd's own field.
const PREFIX: &str = "SUME_";
/// The longest value sent; longer ones are cut. An event of up to 20 fields (ours have at most
/// 7), each also in the message, then fits one datagram (the socket buffer holds about
/// 200 KiB), so journald's other path for large entries (a memfd) is never needed.
const MAX_VALUE_BYTES: usize = 4 * 1024;

pub struct Journal {
    socket: UnixDatagram,
}

impl Journal {
    /// Fails if there is no journald to send to.
    pub fn connect() -> io::Result<Journal> {
        let socket = UnixDatagram::unbound()?;
        // An empty datagram is a valid entry of no fields, which journald drops: a probe.
        socket.send_to(&[], SOCKET)?;
        // A journald that does not keep up (its socket queues a bounded number of datagrams:
        // 512 with systemd's sysctl defaults) loses lines rather than stalling the thread that
        // logs, which may be answering a delivery.
        socket.set_nonblocking(true)?;
        Ok(Journal { socket })
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Journal {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        let mut entry = Vec::with_capacity(512);
        put(&mut entry, "PRIORITY", priority(*metadata.level()));
        put(&mut entry, "SYSLOG_IDENTIFIER", "sume-receiver");
        put(&mut entry, "TARGET", metadata.target());
        if let Some(file) = metadata.file() {
            put(&mut entry, "CODE_FILE", file);
        }
        if let Some(line) = metadata.line() {
            put(&mut entry, "CODE_LINE", &line.to_string());
        }
        put(&mut entry, "MESSAGE", &fields.to_string());
        for (name, value) in &fields.values {
            put(&mut entry, &field_name(name), value);
        }
        // Nothing to do if journald is gone or full: a log line cannot be logged.
        let _ = self.socket.send_to(&entry, SOCKET);
    }
}

/// `SUME_` and the field's name in what journald accepts: uppercase letters, digits and `_`.
fn field_name(name: &str) -> String {
    let name = name.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    });
    PREFIX.chars().chain(name).collect()
}

fn priority(level: Level) -> &'static str {
    match level {
        Level::ERROR => "3",
        Level::WARN => "4",
        Level::INFO => "6",
        Level::DEBUG | Level::TRACE => "7",
    }
}

/// One field in the length-prefixed form, which holds any bytes (newlines too).
fn put(entry: &mut Vec<u8>, name: &str, value: &str) {
    let value = cut(value);
    entry.extend_from_slice(name.as_bytes());
    entry.push(b'\n');
    entry.extend_from_slice(&(value.len() as u64).to_le_bytes());
    entry.extend_from_slice(value.as_bytes());
    entry.push(b'\n');
}

/// `value` cut to at most [`MAX_VALUE_BYTES`], on a character boundary.
fn cut(value: &str) -> &str {
    if value.len() <= MAX_VALUE_BYTES {
        return value;
    }
    let mut end = MAX_VALUE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_are_what_journald_accepts() {
        assert_eq!(field_name("job_id"), "SUME_JOB_ID");
        assert_eq!(field_name("log.target"), "SUME_LOG_TARGET");
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_VALUE_BYTES);
        let cut = cut(&long);
        assert!(cut.len() <= MAX_VALUE_BYTES && cut.len() > MAX_VALUE_BYTES - 2);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
