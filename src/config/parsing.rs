//! Reading the file: human durations ("30s", "5m", "30d") and TOML errors that never show a
//! secret.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

pub(super) const DAY_SECS: u64 = 86_400;
/// The longest duration any key takes: past it, time arithmetic on it could overflow, and no
/// setting has a use for it.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * DAY_SECS);

/// Human durations: "300s", "5m", "30d", "1h 30m"; at most 100 years.
pub(super) fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    let parsed = humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {text:?} ({e}); write it like \"300s\", \"5m\" or \"30d\""
        ))
    })?;
    if parsed > MAX_DURATION {
        return Err(serde::de::Error::custom(format!(
            "duration {text:?} is longer than 100 years"
        )));
    }
    Ok(parsed)
}

/// A TOML error without the source excerpt `toml` would print: the excerpt may be a secret
/// (the journal keeps what we print). Says the line, the key and what is wrong; in the
/// `[signature]` table, quoted values in the message are hidden too.
pub(super) fn describe_toml_error(text: &str, error: &toml::de::Error) -> String {
    let Some(span) = error.span() else {
        return error.message().to_owned();
    };
    let start = span.start.min(text.len());
    let line_number = line_number(text, start);
    let line = text.lines().nth(line_number - 1).unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(key, _)| key.trim())
        .filter(|key| !key.is_empty() && !key.contains(['"', '\'']))
        .map(|key| format!(" (key `{key}`)"))
        .unwrap_or_default();
    let table = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| line.starts_with('['))
        .unwrap_or("");
    let mut message = error.message().trim().to_owned();
    if table.trim_matches(['[', ']', ' ']) == "signature" {
        message = hide_quoted(&message);
    }
    format!("TOML error on line {line_number}{key}: {message}")
}

/// The line (from 1) of the byte at `offset` in `text`.
pub(super) fn line_number(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&byte| byte == b'\n')
        .count()
        + 1
}

/// Replaces every `"..."` in `text` by `"(hidden)"`.
fn hide_quoted(text: &str) -> String {
    let mut parts = text.split('"');
    let mut out = parts.next().unwrap_or("").to_owned();
    for (index, part) in parts.enumerate() {
        out.push('"');
        out.push_str(if index % 2 == 0 { "(hidden)" } else { part });
    }
    out
}
