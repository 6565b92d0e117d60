//! `EventType`: a delivery's `type`, checked at every entrance like a job id.
//!
//! It is stored in the ledger, logged and handed to handlers as `SUME_EVENT_TYPE`, so the same
//! rules keep it safe: at most 255 bytes of UTF-8 and no control characters (a NUL cannot be
//! stored in PostgreSQL text nor passed to a process, a newline forges log lines).

use std::fmt;

pub const MAX_EVENT_TYPE_BYTES: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventType(String);

/// Why a text is not an event type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventTypeError {
    #[error("the event type is longer than {MAX_EVENT_TYPE_BYTES} bytes")]
    TooLong,
    #[error("the event type contains a control character (U+{0:04X})")]
    ControlCharacter(u32),
}

impl EventType {
    pub fn parse(text: &str) -> Result<EventType, EventTypeError> {
        if text.len() > MAX_EVENT_TYPE_BYTES {
            return Err(EventTypeError::TooLong);
        }
        if let Some(control) = text.chars().find(|c| c.is_control()) {
            return Err(EventTypeError::ControlCharacter(control.into()));
        }
        Ok(EventType(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_long_types_are_refused() {
        assert_eq!(
            EventType::parse("job.completed").unwrap().as_str(),
            "job.completed"
        );
        assert_eq!(
            EventType::parse("job\u{0}completed"),
            Err(EventTypeError::ControlCharacter(0))
        );
        assert_eq!(
            EventType::parse("job\ncompleted"),
            Err(EventTypeError::ControlCharacter(10))
        );
        assert!(EventType::parse(&"t".repeat(MAX_EVENT_TYPE_BYTES)).is_ok());
        assert_eq!(
            EventType::parse(&"t".repeat(MAX_EVENT_TYPE_BYTES + 1)),
            Err(EventTypeError::TooLong)
        );
    }
}
