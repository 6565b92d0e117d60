//! The fields a delivery is keyed on, read from its verified body without building its JSON tree.
//!
//! A delivery's body is stored verbatim; the receiver itself only needs `job_id` and the event
//! type. Reading them into a `serde_json::Map` allocated every key and value of the payload
//! (the job's whole result) on the request path. This reader walks the object once, borrows the
//! strings it keeps and skips everything else, while still refusing whatever is not one JSON
//! object.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::config::BodyFields;

/// A top-level field's value, as far as the receiver cares.
#[derive(Debug, PartialEq, Eq)]
pub enum Field<'a> {
    Text(Cow<'a, str>),
    Null,
    /// Any other JSON value (a number, an array...): skipped, not kept.
    Other,
}

impl Field<'_> {
    fn text(&self) -> Option<&str> {
        match self {
            Field::Text(text) => Some(text),
            Field::Null | Field::Other => None,
        }
    }
}

/// The top-level fields of a delivery's object that the receiver reads.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KeyFields<'a> {
    pub job_id: Option<Field<'a>>,
    type_: Option<Field<'a>>,
    event: Option<Field<'a>>,
    /// The fields the routes match on ([`KeyFields::read_routed`]) that the body has, by name.
    routed: Vec<(&'a str, Field<'a>)>,
}

impl<'a> KeyFields<'a> {
    /// Reads `text`, which must be exactly one JSON object. A key the receiver reads may appear
    /// only once: with two `job_id`s, the handler's parser might key on the other one.
    #[cfg(test)]
    pub fn read(text: &'a str) -> Result<KeyFields<'a>, serde_json::Error> {
        Self::read_routed(text, &[])
    }

    /// As [`KeyFields::read`], keeping besides the top-level fields named in `routed` (sorted,
    /// as [`crate::config::Routes::field_names`] gives them) for the routes to match on, in the same one walk.
    /// Such a field given twice is kept as neither value: no route matches on it, rather than
    /// on a value the handler's parser might not see.
    pub fn read_routed(
        text: &'a str,
        routed: &'a [String],
    ) -> Result<KeyFields<'a>, serde_json::Error> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let fields = deserializer.deserialize_map(KeyFieldsVisitor { routed })?;
        deserializer.end()?;
        Ok(fields)
    }

    /// The event type: `type` if it is a string, else `event` if that is one (Sume's older name).
    pub fn event_type(&self) -> Option<&str> {
        [&self.type_, &self.event]
            .into_iter()
            .find_map(|field| field.as_ref().and_then(Field::text))
    }
}

/// The routes match on a body's top-level string fields as the claim path read them.
impl BodyFields for KeyFields<'_> {
    fn text(&self, name: &str) -> Option<&str> {
        let field = match name {
            "job_id" => self.job_id.as_ref(),
            "type" => self.type_.as_ref(),
            "event" => self.event.as_ref(),
            _ => self
                .routed
                .iter()
                .find(|(routed, _)| *routed == name)
                .map(|(_, field)| field),
        };
        field.and_then(Field::text)
    }
}

struct KeyFieldsVisitor<'a> {
    routed: &'a [String],
}

impl<'de> Visitor<'de> for KeyFieldsVisitor<'de> {
    type Value = KeyFields<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = KeyFields::default();
        let seed = KeyVisitor {
            routed: self.routed,
        };
        while let Some(key) = map.next_key_seed(seed)? {
            let (slot, name) = match key {
                Key::JobId => (&mut fields.job_id, "job_id"),
                Key::Type => (&mut fields.type_, "type"),
                Key::Event => (&mut fields.event, "event"),
                Key::Routed(index) => {
                    let name = self.routed[index].as_str();
                    let value = map.next_value::<Field>()?;
                    match fields.routed.iter_mut().find(|(seen, _)| *seen == name) {
                        Some((_, twice)) => *twice = Field::Other,
                        None => fields.routed.push((name, value)),
                    }
                    continue;
                }
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(de::Error::custom(format_args!("duplicate key `{name}`")));
            }
            *slot = Some(map.next_value()?);
        }
        Ok(fields)
    }
}

/// A top-level key, told apart without keeping it (serde's `Cow<str>` would copy every key).
enum Key {
    JobId,
    Type,
    Event,
    /// One of the routes' fields: its index in the names asked for.
    Routed(usize),
    Other,
}

/// Tells keys apart; the routes' field names are sorted, so a key is found by bisection.
#[derive(Clone, Copy)]
struct KeyVisitor<'r> {
    routed: &'r [String],
}

impl<'de> DeserializeSeed<'de> for KeyVisitor<'_> {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyVisitor<'_> {
    type Value = Key;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object key")
    }

    /// Escaped keys arrive here too, unescaped: `"job\u005fid"` is `job_id`.
    fn visit_str<E>(self, key: &str) -> Result<Key, E> {
        Ok(match key {
            "job_id" => Key::JobId,
            "type" => Key::Type,
            "event" => Key::Event,
            _ => match self.routed.binary_search_by(|name| name.as_str().cmp(key)) {
                Ok(index) => Key::Routed(index),
                Err(_) => Key::Other,
            },
        })
    }
}

impl<'de> Deserialize<'de> for Field<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FieldVisitor)
    }
}

struct FieldVisitor;

impl<'de> Visitor<'de> for FieldVisitor {
    type Value = Field<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Field::Text(Cow::Borrowed(text)))
    }

    /// A string with escapes, which the parser had to unescape into a buffer of its own.
    fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Field::Text(Cow::Owned(text.to_owned())))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Field::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_key_fields_and_skips_the_rest() {
        let fields = KeyFields::read(
            r#"{"x":{"job_id":"inner"},"job_id":"j1","n":[1,{"a":null}],"type":"t"}"#,
        )
        .unwrap();
        assert_eq!(fields.job_id, Some(Field::Text("j1".into())));
        assert_eq!(fields.event_type(), Some("t"));
    }

    /// The routes' fields are kept in the same walk; others, and non-strings, are not strings.
    #[test]
    fn the_routes_fields_are_read_in_the_same_walk() {
        let text =
            r#"{"queue":"critical","region":7,"o":{"zone":"x"},"zone\u0031":"eu","type":"t"}"#;
        let routed = ["queue", "region", "type", "zone1"].map(String::from);
        let fields = KeyFields::read_routed(text, &routed).unwrap();
        assert_eq!(fields.text("queue"), Some("critical"));
        assert_eq!(fields.text("region"), None, "a number is not a string");
        assert_eq!(
            fields.text("zone1"),
            Some("eu"),
            "an escaped key is the same key"
        );
        assert_eq!(fields.text("zone"), None, "only top-level fields");
        assert_eq!(fields.text("type"), Some("t"));
        assert_eq!(fields.event_type(), Some("t"));
        // Not asked for: not kept.
        assert_eq!(KeyFields::read(text).unwrap().text("queue"), None);
        // Twice: neither value, and the delivery is still read.
        let queue = ["queue".to_owned()];
        let twice = KeyFields::read_routed(r#"{"queue":"a","queue":"b"}"#, &queue).unwrap();
        assert_eq!(twice.text("queue"), None);
    }

    /// The claim path's one read is all the routes need: its fields, then the walk.
    #[test]
    fn routes_select_on_what_one_read_kept() {
        let config = crate::config::Config::parse(
            "[signature]\nsecrets = [\"whsec_a\"]\n\
             [[route]]\nname = \"pager\"\nfields = { queue = \"critical\" }\n\
             [route.handler]\ncommand = [\"true\"]\n\
             [routing]\nunmatched = \"done\"\n",
            std::path::Path::new("/"),
        )
        .unwrap();
        let routes = &config.routes;
        assert_eq!(routes.field_names(), ["queue"]);
        let select = |body: &str| {
            let fields = KeyFields::read_routed(body, routes.field_names()).unwrap();
            format!("{:?}", routes.select(fields.event_type(), &fields))
        };
        assert!(
            select(r#"{"job_id":"j","type":"job.failed","queue":"critical"}"#)
                .starts_with("Matched"),
        );
        assert_eq!(select(r#"{"job_id":"j","queue":"bulk"}"#), "Done");
        assert_eq!(select(r#"{"job_id":"j","queue":["critical"]}"#), "Done");
    }

    #[test]
    fn escaped_strings_are_unescaped() {
        let fields = KeyFields::read(r#"{"job_id":"a\u0041\"b"}"#).unwrap();
        assert_eq!(fields.job_id, Some(Field::Text("aA\"b".into())));
    }

    #[test]
    fn an_escaped_key_is_the_same_key() {
        let twice = KeyFields::read(r#"{"job_id":"a","job\u005fid":"b"}"#).unwrap_err();
        assert!(
            twice.to_string().contains("duplicate key `job_id`"),
            "{twice}"
        );
    }

    #[test]
    fn values_are_told_apart() {
        fn job_id(text: &str) -> Option<Field<'_>> {
            KeyFields::read(text).unwrap().job_id
        }
        assert_eq!(job_id(r#"{"job_id":null}"#), Some(Field::Null));
        for other in ["7", "1.5", "true", "[\"j1\"]", "{\"id\":\"j1\"}"] {
            let text = format!(r#"{{"job_id":{other}}}"#);
            assert_eq!(job_id(&text), Some(Field::Other));
        }
        assert_eq!(job_id("{}"), None);
    }

    #[test]
    fn the_event_type_is_type_then_event() {
        let event_type = |text| {
            KeyFields::read(text)
                .unwrap()
                .event_type()
                .map(str::to_owned)
        };
        assert_eq!(
            event_type(r#"{"event":"e","type":"t"}"#).as_deref(),
            Some("t")
        );
        assert_eq!(
            event_type(r#"{"type":7,"event":"e"}"#).as_deref(),
            Some("e")
        );
        assert_eq!(event_type(r#"{"type":null}"#), None);
    }

    /// A stranger's body is verified before it is read, but a bug on Sume's side must not
    /// crash us either: skipped values are walked without recursion, however deep (within
    /// `max_body_bytes`), so no nesting can overflow the stack.
    #[test]
    fn deep_nesting_is_skipped_without_recursing() {
        let depth = 1_000_000;
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let deep = format!(r#"{{"x":{nested},"job_id":"a","y":{{"z":{nested}}}}}"#);
        assert_eq!(
            KeyFields::read(&deep).unwrap().job_id,
            Some(Field::Text("a".into()))
        );
        let in_job_id = format!(r#"{{"job_id":{nested}}}"#);
        assert_eq!(
            KeyFields::read(&in_job_id).unwrap().job_id,
            Some(Field::Other)
        );
    }

    #[test]
    fn anything_but_one_object_is_refused() {
        for text in [
            "[\"job_id\"]",
            "\"job_id\"",
            "7",
            "null",
            "{} {}",
            "{\"job_id\":\"a\"",
            "",
        ] {
            assert!(KeyFields::read(text).is_err(), "{text}");
        }
        assert!(KeyFields::read(" {\"job_id\":\"a\"}\n").is_ok());
    }
}
