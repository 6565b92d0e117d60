//! A route's match: event type patterns and body field conditions, each checked in bounded time.
//!
//! Matching runs on the claim path for every delivery, on input a stranger could shape, so
//! every check is a comparison of bounded strings: an exact name, or a glob with at most one
//! `*` checked as a prefix and a suffix (no backtracking, no regular expression).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::event_type::MAX_EVENT_TYPE_BYTES;

/// The longest top-level field name a condition may name: a JSON key is unbounded, a config
/// need not be.
const MAX_FIELD_NAME_BYTES: usize = 255;

/// One entry of a route's `event_types`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum EventTypePattern {
    /// `*`: every event, with any type or none (so `[handler]`, the route `default`, keeps
    /// taking the deliveries without a type it takes today).
    Any,
    /// A name without `*`: that type exactly.
    Exact(String),
    /// One `*` inside a name (`job.*`, `*.failed`, `job.*.v2`): a present type that starts with
    /// `prefix` and ends with `suffix`, the two not overlapping.
    Glob { prefix: String, suffix: String },
}

impl EventTypePattern {
    /// Refuses a pattern no delivery's type could match: empty, with whitespace or a control
    /// character (Sume's types are dotted names such as `job.completed`), longer than any type
    /// the claim path accepts, or with more than one `*`.
    pub fn parse(text: &str) -> Result<EventTypePattern, String> {
        let shown: String = text.chars().take(64).collect();
        if text.is_empty() {
            return Err("an event type pattern is empty: it can never match".to_owned());
        }
        if text.len() > MAX_EVENT_TYPE_BYTES {
            return Err(format!(
                "event type pattern {shown:?}... is longer than {MAX_EVENT_TYPE_BYTES} bytes, \
                 which no delivery's type is: it can never match"
            ));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "event type pattern {shown:?} holds whitespace or a control character, which \
                 Sume's event types never do: it can never match"
            ));
        }
        let mut parts = text.split('*');
        let (prefix, suffix) = match (parts.next(), parts.next(), parts.next()) {
            (Some(_), None, _) => return Ok(EventTypePattern::Exact(text.to_owned())),
            (Some(""), Some(""), None) => return Ok(EventTypePattern::Any),
            (Some(prefix), Some(suffix), None) => (prefix, suffix),
            _ => {
                return Err(format!(
                    "event type pattern {shown:?} has more than one `*`: write one `*` (`job.*`) \
                     or list the names"
                ))
            }
        };
        Ok(EventTypePattern::Glob {
            prefix: prefix.to_owned(),
            suffix: suffix.to_owned(),
        })
    }

    /// Whether an event of this type (`None`: the body has none) matches; O(pattern length).
    pub fn matches(&self, event_type: Option<&str>) -> bool {
        match (self, event_type) {
            (EventTypePattern::Any, _) => true,
            (_, None) => false,
            (EventTypePattern::Exact(name), Some(event_type)) => name == event_type,
            (EventTypePattern::Glob { prefix, suffix }, Some(event_type)) => {
                // The length check keeps `a*a` from matching "a" by one letter used twice.
                event_type.len() >= prefix.len() + suffix.len()
                    && event_type.starts_with(prefix.as_str())
                    && event_type.ends_with(suffix.as_str())
            }
        }
    }
}

/// As written in the file.
impl fmt::Display for EventTypePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventTypePattern::Any => f.write_str("*"),
            EventTypePattern::Exact(name) => f.write_str(name),
            EventTypePattern::Glob { prefix, suffix } => write!(f, "{prefix}*{suffix}"),
        }
    }
}

impl TryFrom<String> for EventTypePattern {
    type Error = String;

    fn try_from(text: String) -> Result<EventTypePattern, String> {
        EventTypePattern::parse(&text)
    }
}

/// The top-level string fields of a delivery's body, as the claim path read them: matching
/// asks them by name and never reads the body again.
pub trait BodyFields {
    /// The field's value if it is a string; `None` when it is absent, or anything else.
    fn text(&self, name: &str) -> Option<&str>;
}

impl BodyFields for serde_json::Map<String, serde_json::Value> {
    fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(serde_json::Value::as_str)
    }
}

/// One entry of a route's `fields`: the top-level string field `name` must be one of `values`
/// (one value: equality; an array: membership).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldCondition {
    pub name: String,
    pub values: Vec<String>,
}

impl FieldCondition {
    pub fn matches(&self, body: &impl BodyFields) -> bool {
        body.text(&self.name)
            .is_some_and(|value| self.values.iter().any(|wanted| wanted == value))
    }

    /// A condition no body can meet, or a field name no config needs.
    pub(super) fn problem(&self) -> Option<String> {
        let shown: String = self.name.chars().take(64).collect();
        if self.name.is_empty()
            || self.name.len() > MAX_FIELD_NAME_BYTES
            || self.name.chars().any(char::is_control)
        {
            return Some(format!(
                "field name {shown:?} must be 1 to {MAX_FIELD_NAME_BYTES} bytes without control \
                 characters"
            ));
        }
        if self.values.is_empty() {
            return Some(format!(
                "fields.{shown} is an empty list: no value can match it"
            ));
        }
        None
    }
}

impl FieldCondition {
    /// `fields`' entries as the file has them (`name = "value" | ["value", ...]`).
    pub(super) fn from_table(table: &BTreeMap<String, FieldValues>) -> Vec<FieldCondition> {
        table
            .iter()
            .map(|(name, FieldValues(values))| FieldCondition {
                name: name.clone(),
                values: values.clone(),
            })
            .collect()
    }
}

/// A field's wanted values: a string, or an array of strings.
#[derive(Debug, Clone, Default)]
pub(super) struct FieldValues(Vec<String>);

impl<'de> Deserialize<'de> for FieldValues {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FieldValuesVisitor)
    }
}

struct FieldValuesVisitor;

impl<'de> Visitor<'de> for FieldValuesVisitor {
    type Value = FieldValues;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a string (equality) or an array of strings (membership)")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<FieldValues, E> {
        Ok(FieldValues(vec![value.to_owned()]))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FieldValues, A::Error> {
        let mut values = Vec::new();
        while let Some(value) = seq.next_element::<String>()? {
            values.push(value);
        }
        Ok(FieldValues(values))
    }
}

/// What a route takes: an event whose type matches one of `event_types` and whose body meets
/// every one of `fields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    /// Never empty: a route without `event_types` has `[Any]` (it matches on fields alone).
    pub event_types: Vec<EventTypePattern>,
    pub fields: Vec<FieldCondition>,
}

impl RouteMatch {
    /// Everything: `[handler]`'s route.
    pub fn everything() -> RouteMatch {
        RouteMatch {
            event_types: vec![EventTypePattern::Any],
            fields: Vec::new(),
        }
    }

    /// Bounded by the config: each pattern is O(its length), each condition O(its values'
    /// lengths); the body is not read again.
    pub fn matches(&self, event_type: Option<&str>, body: &impl BodyFields) -> bool {
        self.event_types
            .iter()
            .any(|pattern| pattern.matches(event_type))
            && self.fields.iter().all(|condition| condition.matches(body))
    }

    /// Takes every event: an `*` and no field condition. A route after it, with nothing
    /// passed on, is never reached.
    pub fn is_catch_all(&self) -> bool {
        self.fields.is_empty() && self.event_types.contains(&EventTypePattern::Any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> EventTypePattern {
        EventTypePattern::parse(text).unwrap()
    }

    #[test]
    fn patterns_are_exact_names_globs_or_any() {
        assert_eq!(pattern("*"), EventTypePattern::Any);
        assert_eq!(
            pattern("job.failed"),
            EventTypePattern::Exact("job.failed".into())
        );
        assert_eq!(
            pattern("job.*"),
            EventTypePattern::Glob {
                prefix: "job.".into(),
                suffix: "".into()
            }
        );
        let glob = pattern("job.*.v2");
        assert!(glob.matches(Some("job.failed.v2")));
        assert!(glob.matches(Some("job..v2")));
        assert!(!glob.matches(Some("job.v2")), "prefix and suffix overlap");
        assert!(!glob.matches(Some("job.failed")));
        assert!(pattern("*.failed").matches(Some("job.failed")));
        assert!(pattern("job.*").matches(Some("job.")));
        assert!(!pattern("job.*").matches(Some("job")));
        assert!(!pattern("a*a").matches(Some("a")));
        assert!(pattern("a*a").matches(Some("aa")));
    }

    /// The prefix-and-suffix check against a plain backtracking wildcard match, on random
    /// patterns and types over a small alphabet (where overlaps are frequent).
    #[test]
    fn globs_match_as_a_backtracking_matcher_would() {
        fn reference(pattern: &[u8], text: &[u8]) -> bool {
            match pattern.split_first() {
                None => text.is_empty(),
                Some((b'*', rest)) => (0..=text.len()).any(|skip| reference(rest, &text[skip..])),
                Some((byte, rest)) => text.first() == Some(byte) && reference(rest, &text[1..]),
            }
        }
        let mut rng = fastrand::Rng::with_seed(51);
        let letter = |rng: &mut fastrand::Rng| [b'a', b'b', b'.'][rng.usize(..3)];
        for _ in 0..50_000 {
            let text: Vec<u8> = (0..rng.usize(0..7)).map(|_| letter(&mut rng)).collect();
            let mut pattern: Vec<u8> = (0..rng.usize(1..5)).map(|_| letter(&mut rng)).collect();
            if rng.bool() {
                pattern.insert(rng.usize(..=pattern.len()), b'*');
            }
            let pattern_text = String::from_utf8(pattern.clone()).unwrap();
            let parsed = EventTypePattern::parse(&pattern_text).unwrap();
            assert_eq!(parsed.to_string(), pattern_text);
            let text_str = String::from_utf8(text.clone()).unwrap();
            assert_eq!(
                parsed.matches(Some(&text_str)),
                reference(&pattern, &text),
                "{pattern_text:?} on {text_str:?}"
            );
        }
    }

    #[test]
    fn an_absent_type_is_matched_by_any_alone() {
        assert!(pattern("*").matches(None));
        assert!(!pattern("job.*").matches(None));
        assert!(!pattern("*.failed").matches(None));
        assert!(!pattern("job.failed").matches(None));
    }

    #[test]
    fn patterns_that_can_never_match_are_refused() {
        for (bad, why) in [
            ("", "empty"),
            ("job .failed", "whitespace"),
            ("job.\tfailed", "whitespace"),
            ("job.\u{0}", "control"),
            ("job.*.*", "more than one `*`"),
            ("**", "more than one `*`"),
        ] {
            let error = EventTypePattern::parse(bad).unwrap_err();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
        let long = EventTypePattern::parse(&"t".repeat(MAX_EVENT_TYPE_BYTES + 1)).unwrap_err();
        assert!(long.contains("longer than 255 bytes"), "{long}");
        assert!(long.len() < 300, "shown cut short: {long}");
    }

    #[test]
    fn fields_match_by_equality_or_membership_on_strings_only() {
        let body: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"queue":"critical","region":"eu","n":7,"o":{"queue":"x"},"nil":null}"#,
        )
        .unwrap();
        let condition = |name: &str, values: &[&str]| FieldCondition {
            name: name.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        };
        assert!(condition("queue", &["critical"]).matches(&body));
        assert!(condition("region", &["us", "eu"]).matches(&body));
        assert!(!condition("region", &["us"]).matches(&body));
        assert!(
            !condition("n", &["7"]).matches(&body),
            "a number is not a string"
        );
        assert!(!condition("nil", &["null"]).matches(&body));
        assert!(!condition("o", &["x"]).matches(&body));
        assert!(!condition("absent", &[""]).matches(&body));
        assert!(condition("q", &[])
            .problem()
            .unwrap()
            .contains("empty list"));
        assert!(condition("", &["x"]).problem().is_some());
        assert!(condition("a\nb", &["x"]).problem().is_some());
    }

    #[test]
    fn a_match_needs_a_type_and_every_field() {
        let body: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"queue":"critical"}"#).unwrap();
        let route = RouteMatch {
            event_types: vec![pattern("job.failed"), pattern("job.timed_out")],
            fields: vec![FieldCondition {
                name: "queue".into(),
                values: vec!["critical".into()],
            }],
        };
        assert!(route.matches(Some("job.timed_out"), &body));
        assert!(!route.matches(Some("job.completed"), &body));
        assert!(!route.matches(Some("job.failed"), &serde_json::Map::new()));
        assert!(!route.is_catch_all());
        assert!(RouteMatch::everything().is_catch_all());
        assert!(RouteMatch::everything().matches(None, &serde_json::Map::new()));
    }
}
