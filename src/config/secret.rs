//! `Secret`: a credential held so that it never reaches a log line.

use std::fmt;
use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;

/// A signing secret. Its Debug form never shows the value, so it cannot leak into a log line.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is this secret, compared in constant time (a bearer token, a
    /// console sign-in).
    pub fn matches(&self, candidate: &str) -> bool {
        use sha2::Digest;
        // Comparing digests keeps the time independent of where the strings first differ.
        let (a, b) = (
            sha2::Sha256::digest(&self.0),
            sha2::Sha256::digest(candidate),
        );
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

/// Reads a file holding one secret (surrounding whitespace dropped); `key` names it in errors.
pub(super) fn read_secret_file(key: &str, path: &Path) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{key}: cannot read {}", path.display()))?;
    let value = text.trim();
    if value.is_empty() {
        bail!("{key}: {} is empty", path.display());
    }
    Ok(Secret::new(value))
}

/// `url` as it may be shown or logged: without a user, a password, a query or a fragment
/// (any may hold a credential), e.g. `https://api.example/v1`.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    // The userinfo first: a password may hold a `?` or `#` (unescaped, as people type them),
    // which must not be taken for the query's start and leave the rest of it in the log. An
    // `@` after one of them may as well be the query's (`host?k=a@b`): neither is shown.
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let rest = match authority.rfind('@') {
        Some(at) if authority[..at].contains(['?', '#']) => return format!("{scheme}[redacted]"),
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    format!("{scheme}{host}{path}")
}

impl AsRef<[u8]> for Secret {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_credentials() {
        for (url, shown) in [
            (
                "https://u:p@api.example:8443/v1?key=k#f",
                "https://api.example:8443/v1",
            ),
            ("https://api.example", "https://api.example"),
            ("http://user@[::1]:80/a/b?x", "http://[::1]:80/a/b"),
            ("api.example/p?key=k", "api.example/p"),
            ("https://api.example/p?k=a@b", "https://api.example/p"),
            // Regression: the password's `?` was taken for the query: `https://u:pa` shown.
            ("https://u:pa?ss@api.example/dir", "https://[redacted]"),
            ("https://api.example?k=s3cret@b", "https://[redacted]"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
    }

    #[test]
    fn a_secret_matches_only_itself() {
        let token = Secret::new("t0ken");
        assert!(token.matches("t0ken"));
        for other in ["t0ke", "t0ken ", ""] {
            assert!(!token.matches(other), "{other:?}");
        }
    }
}
