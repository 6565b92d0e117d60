//! `RouteName`: a route's name, checked once, since it becomes a metric label and a ledger key.
//!
//! Prometheus label values and ledger keys outlive the config that named them, so the name is
//! kept to what every one of them takes unquoted and unescaped: 1 to 64 of `[a-z0-9_-]`,
//! starting with a letter or a digit.

use std::fmt;

use serde::Deserialize;

pub const MAX_ROUTE_NAME_CHARS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct RouteName(String);

impl RouteName {
    /// The route `[handler]` becomes, and the one existing jobs belong to.
    pub const DEFAULT: &'static str = "default";

    pub fn parse(text: &str) -> Result<RouteName, String> {
        let first_ok = text
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let rest_ok = text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if text.len() > MAX_ROUTE_NAME_CHARS || !first_ok || !rest_ok {
            // The text is shown cut short: it may be anything a file holds.
            let shown: String = text.chars().take(MAX_ROUTE_NAME_CHARS + 1).collect();
            return Err(format!(
                "route name {shown:?} must be 1 to {MAX_ROUTE_NAME_CHARS} of a-z, 0-9, '_' and \
                 '-', starting with a letter or a digit (it becomes a metric label and a ledger \
                 key)"
            ));
        }
        Ok(RouteName(text.to_owned()))
    }

    /// The route `[handler]` becomes.
    pub fn default_route() -> RouteName {
        RouteName(Self::DEFAULT.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RouteName {
    type Error = String;

    fn try_from(text: String) -> Result<RouteName, String> {
        RouteName::parse(&text)
    }
}

impl fmt::Display for RouteName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl rusqlite::ToSql for RouteName {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

impl PartialEq<str> for RouteName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_label_safe() {
        for good in [
            "default",
            "pager",
            "a",
            "9",
            "eu-archive_2",
            &"a".repeat(64),
        ] {
            assert_eq!(RouteName::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "-pager",
            "_x",
            "Pager",
            "pa ger",
            "pager.eu",
            "pagér",
            "a\"b",
            "a\nb",
            &"a".repeat(65),
        ] {
            let error = RouteName::parse(bad).unwrap_err();
            assert!(error.contains("must be 1 to 64"), "{bad:?}: {error}");
        }
        assert_eq!(RouteName::default_route().as_str(), RouteName::DEFAULT);
    }

    #[test]
    fn a_huge_name_is_refused_and_shown_cut_short() {
        let error = RouteName::parse(&"x".repeat(10_000)).unwrap_err();
        assert!(error.len() < 400, "{error}");
    }
}
