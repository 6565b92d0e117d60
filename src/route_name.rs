//! `RouteName`: a route's name, a key of the ledger and a value of metric labels.

use std::fmt;

/// At most this many bytes: a name is a label on every per-route metric.
pub const MAX_ROUTE_NAME_BYTES: usize = 64;

/// 1 to 64 of `a-z`, `0-9`, `_` and `-`, beginning with a letter or a digit: safe as a
/// Prometheus label value, a path segment of the console and a word of a log line, as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteName(String);

/// Why a text is not a route name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteNameError {
    #[error("a route name is empty")]
    Empty,
    #[error("a route name is longer than {MAX_ROUTE_NAME_BYTES} bytes")]
    TooLong,
    #[error("a route name begins with a letter or a digit")]
    BadStart,
    #[error("a route name holds only a-z, 0-9, '_' and '-' (found {0:?})")]
    BadCharacter(char),
}

impl RouteName {
    /// The route of `[handler]`, and of every job claimed before routes.
    pub const DEFAULT: &'static str = "default";

    pub fn parse(text: &str) -> Result<RouteName, RouteNameError> {
        let first = text.chars().next().ok_or(RouteNameError::Empty)?;
        if text.len() > MAX_ROUTE_NAME_BYTES {
            return Err(RouteNameError::TooLong);
        }
        if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
            return Err(RouteNameError::BadStart);
        }
        if let Some(bad) = text
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '-'))
        {
            return Err(RouteNameError::BadCharacter(bad));
        }
        Ok(RouteName(text.to_owned()))
    }

    pub fn default_route() -> RouteName {
        RouteName(Self::DEFAULT.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_label_safe_names_are_route_names() {
        assert_eq!(
            RouteName::parse("pager-2_eu").unwrap().as_str(),
            "pager-2_eu"
        );
        assert_eq!(RouteName::parse(""), Err(RouteNameError::Empty));
        assert_eq!(RouteName::parse("-x"), Err(RouteNameError::BadStart));
        assert_eq!(RouteName::parse("Pager"), Err(RouteNameError::BadStart));
        assert_eq!(
            RouteName::parse("a b"),
            Err(RouteNameError::BadCharacter(' '))
        );
        assert_eq!(
            RouteName::parse("a\"b"),
            Err(RouteNameError::BadCharacter('"'))
        );
        assert_eq!(
            RouteName::parse(&"a".repeat(65)),
            Err(RouteNameError::TooLong)
        );
        assert!(RouteName::parse(&"a".repeat(64)).is_ok());
    }
}
