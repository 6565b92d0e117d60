//! `JobId`: the only way to hold a job id, so every entrance (webhook, admin, CLI, ledger) checks it.
//!
//! A job id is the ledger key, a handler's `SUME_JOB_ID`, a log field and a path segment of Sume's
//! API. The rules keep each of those safe: 1 to 255 bytes of UTF-8, no control characters (a NUL
//! cannot be passed to a process, a newline forges log lines), and not `.` or `..` (dot segments
//! leave `/v1/jobs/{id}/` once a URL is normalised).

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

pub const MAX_JOB_ID_BYTES: usize = 255;

/// Shared, not copied: a delivery's id goes to the ledger's writer and stays with the request
/// for its answer, and a clone is a reference count.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(Arc<str>);

/// Why a text is not a job id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobIdError {
    #[error("job_id is empty")]
    Empty,
    #[error("job_id is longer than {MAX_JOB_ID_BYTES} bytes")]
    TooLong,
    #[error("job_id contains a control character (U+{0:04X})")]
    ControlCharacter(u32),
    #[error("job_id may not be `.` or `..`")]
    DotSegment,
}

impl JobId {
    pub fn parse(text: &str) -> Result<JobId, JobIdError> {
        if text.is_empty() {
            return Err(JobIdError::Empty);
        }
        if text.len() > MAX_JOB_ID_BYTES {
            return Err(JobIdError::TooLong);
        }
        // char::is_control is exactly C0, DEL and C1.
        if let Some(control) = text.chars().find(|c| c.is_control()) {
            return Err(JobIdError::ControlCharacter(control.into()));
        }
        if text == "." || text == ".." {
            return Err(JobIdError::DotSegment);
        }
        Ok(JobId(Arc::from(text)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as one URL path segment: every byte outside RFC 3986's unreserved set is
    /// percent-encoded, so no id can add a segment or a query to the URL it is put in.
    pub fn url_segment(&self) -> String {
        let mut encoded = String::with_capacity(self.0.len());
        for byte in self.0.bytes() {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                encoded.push(char::from(byte));
            } else {
                encoded.push_str(&format!("%{byte:02X}"));
            }
        }
        encoded
    }
}

/// Lets sets of ids be searched with a `&str` (a JobId hashes and compares as its text).
impl std::borrow::Borrow<str> for JobId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for JobId {
    type Err = JobIdError;
    fn from_str(text: &str) -> Result<JobId, JobIdError> {
        JobId::parse(text)
    }
}

/// Quoted and escaped, like a string's Debug.
impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// The id as it is. Safe for terminals and log lines as it is (it holds no control
/// characters), so log fields use `job_id = %id`: journal fields and JSON logs then carry the
/// plain id (`journalctl JOB_ID=...`). Ids read back from the ledger as plain strings, which
/// older versions did not check, are logged with `?` instead.
impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for JobId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl rusqlite::ToSql for JobId {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.as_str().to_sql()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_ids_up_to_the_limit() {
        for id in [
            "job_123",
            "a",
            "ünïcødé-✓",
            "a/b?c#d",
            "a..b",
            "...",
            " spaced ",
        ] {
            assert_eq!(JobId::parse(id).unwrap().as_str(), id);
        }
        assert!(JobId::parse(&"x".repeat(MAX_JOB_ID_BYTES)).is_ok());
    }

    #[test]
    fn refuses_what_cannot_be_stored_run_logged_or_put_in_a_url() {
        assert_eq!(JobId::parse(""), Err(JobIdError::Empty));
        assert_eq!(
            JobId::parse(&"x".repeat(MAX_JOB_ID_BYTES + 1)),
            Err(JobIdError::TooLong)
        );
        assert_eq!(
            JobId::parse(&"é".repeat(128)),
            Err(JobIdError::TooLong),
            "the limit is in bytes"
        );
        for (id, code) in [
            ("a\0b", 0),
            ("a\nb", 10),
            ("a\rb", 13),
            ("\u{1b}[31m", 0x1b),
            ("a\u{7f}", 0x7f),
            ("a\u{85}b", 0x85),
            ("a\u{9f}", 0x9f),
        ] {
            assert_eq!(
                JobId::parse(id),
                Err(JobIdError::ControlCharacter(code)),
                "{id:?}"
            );
        }
        assert_eq!(JobId::parse("."), Err(JobIdError::DotSegment));
        assert_eq!(JobId::parse(".."), Err(JobIdError::DotSegment));
    }

    #[test]
    fn url_segment_encodes_everything_but_unreserved_bytes() {
        let id = JobId::parse("a/../b?c=%2F#é ~x_y-z.").unwrap();
        assert_eq!(
            id.url_segment(),
            "a%2F..%2Fb%3Fc%3D%252F%23%C3%A9%20~x_y-z."
        );
    }

    #[test]
    fn debug_form_is_quoted_and_escaped() {
        let id = JobId::parse("say \"hi\"\\").unwrap();
        assert_eq!(format!("{id:?}"), r#""say \"hi\"\\""#);
    }
}
