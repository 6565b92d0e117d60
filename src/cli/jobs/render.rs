//! What the `jobs` commands print: tables, one job's details, and JSON with readable times.

use std::time::{Duration, UNIX_EPOCH};

use sume_receiver::ledger::{
    self, AttemptRecord, DispatchStop, Expectation, JobDetail, JobSummary,
};
use sume_receiver::logging::Escaped;
use sume_receiver::route_name::RouteName;

/// A row as JSON for people and scripts: every `*_at` time (Unix ms) gets a `*_at_utc` twin in
/// RFC 3339, and a stored body that is JSON is shown as JSON, not as a string holding it.
pub(super) fn readable_json(row: &impl serde::Serialize) -> serde_json::Result<serde_json::Value> {
    let mut value = serde_json::to_value(row)?;
    if let Some(object) = value.as_object_mut() {
        let times: Vec<(String, serde_json::Value)> = object
            .iter()
            .filter(|(key, _)| key.ends_with("_at"))
            .map(|(key, ms)| {
                let utc = ms
                    .as_i64()
                    .map_or(serde_json::Value::Null, |ms| format_time(Some(ms)).into());
                (format!("{key}_utc"), utc)
            })
            .collect();
        object.extend(times);
        if let Some(body) = object.get_mut("body") {
            if let Some(parsed) = body
                .as_str()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            {
                *body = parsed;
            }
        }
    }
    Ok(value)
}

pub(super) fn format_time(ms: Option<i64>) -> String {
    match ms.and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => {
            humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
        }
        None => "-".into(),
    }
}

/// A one-line, bounded rendering of an error for the table.
pub(super) fn short(text: Option<&str>, max_chars: usize) -> String {
    let text = text.unwrap_or("-").replace(['\n', '\r'], " ");
    if text.chars().count() > max_chars {
        format!("{}...", text.chars().take(max_chars).collect::<String>())
    } else {
        text
    }
}

pub(super) fn jobs_table(jobs: &[JobSummary]) -> String {
    let header = [
        "JOB_ID",
        "STATE",
        "ATTEMPTS",
        "SOURCE",
        "EVENT",
        "RECEIVED",
        "DUE",
        "LAST_ERROR",
    ];
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| {
            // When a waiting job runs; a running or finished one keeps its last due time.
            let waiting = matches!(job.state.as_str(), "claimed" | "retrying");
            vec![
                job.job_id.clone(),
                job.state.clone(),
                job.attempts.to_string(),
                job.source.clone(),
                job.event_type.clone().unwrap_or_else(|| "-".into()),
                format_time(Some(job.received_at)),
                format_time(job.next_attempt_at.filter(|_| waiting)),
                short(job.last_error.as_deref(), 60),
            ]
        })
        .collect();
    table(&header, &rows, "(no jobs)")
}

/// `jobs expected` as a table.
pub(super) fn expectations_table(rows: &[Expectation]) -> String {
    let header = [
        "JOB_ID",
        "STATE",
        "EXPECTED",
        "NEXT_POLL",
        "POLLS",
        "LAST_STATUS",
        "LAST_ERROR",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.job_id.clone(),
                row.state.clone(),
                format_time(Some(row.expected_at)),
                format_time(Some(row.next_poll_at)),
                row.polls.to_string(),
                row.last_status.clone().unwrap_or_else(|| "-".into()),
                short(row.last_error.as_deref(), 60),
            ]
        })
        .collect();
    table(&header, &cells, "(no expected jobs)")
}

pub(super) fn stats_table(stats: &ledger::JobStats, now: i64) -> String {
    let mut rows: Vec<Vec<String>> = stats
        .by_state
        .iter()
        .map(|(state, count)| vec![state.clone(), count.to_string()])
        .collect();
    let oldest = stats
        .oldest_unfinished_received_at
        .map_or("-".into(), |at| {
            let age = Duration::from_secs(u64::try_from((now - at) / 1000).unwrap_or(0));
            format!(
                "{} ({} ago)",
                format_time(Some(at)),
                humantime::format_duration(age)
            )
        });
    rows.push(vec!["oldest unfinished".into(), oldest]);
    rows.push(vec![
        "received, last hour".into(),
        stats.received_last_hour.to_string(),
    ]);
    rows.push(vec![
        "dead, last 24 h".into(),
        stats.dead_last_day.to_string(),
    ]);
    table(&["STATE", "JOBS"], &rows, "")
}

/// The hold under `jobs stats`: none, or since when, why, and the next probe.
pub(super) fn hold_lines(hold: Option<&ledger::Hold>, now: i64) -> String {
    let Some(hold) = hold else {
        return "handler hold: none\n".into();
    };
    let ago = |at: i64| {
        humantime::format_duration(Duration::from_secs(((now - at) / 1000).unsigned_abs()))
    };
    let next_in = Duration::from_secs(((hold.next_probe_at - now).max(0) / 1000).unsigned_abs());
    let route = if hold.route == RouteName::DEFAULT {
        String::new()
    } else {
        format!(" of route {}", Escaped(&hold.route))
    };
    format!(
        "handler hold{route}: since {} ({} ago): {}\n  sample error: {}\n  next probe: {} (in {}); `jobs resume` ends the hold now\n",
        format_time(Some(hold.since)),
        ago(hold.since),
        Escaped(&hold.reason),
        Escaped(&hold.sample_error),
        format_time(Some(hold.next_probe_at)),
        humantime::format_duration(next_in),
    )
}

/// Left-aligned columns, two spaces apart, sized to their widest cell. Cells are escaped: what
/// the ledger holds (ids written by older versions, handler errors) must not drive the terminal.
pub(super) fn table(header: &[&str], rows: &[Vec<String>], when_empty: &str) -> String {
    let header: Vec<String> = header.iter().map(|cell| (*cell).to_owned()).collect();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| Escaped(cell).to_string()).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str(when_empty);
        out.push('\n');
    }
    out
}

pub(super) fn job_details(job: &JobDetail, stops: &[DispatchStop]) -> String {
    let s = &job.summary;
    let fields = [
        ("job_id", s.job_id.clone()),
        ("state", s.state.clone()),
        ("source", s.source.clone()),
        (
            "event_type",
            s.event_type.clone().unwrap_or_else(|| "-".into()),
        ),
        ("attempts", s.attempts.to_string()),
        ("received_at", format_time(Some(s.received_at))),
        ("next_attempt_at", format_time(s.next_attempt_at)),
        ("lease_expires_at", format_time(job.lease_expires_at)),
        ("finished_at", format_time(s.finished_at)),
        ("updated_at", format_time(Some(job.updated_at))),
        (
            "last_error",
            s.last_error.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "body",
            job.body
                .clone()
                .unwrap_or_else(|| "(purged by retention)".into()),
        ),
    ];
    let mut out: String = fields
        .iter()
        .map(|(name, value)| format!("{name:<17}{}\n", Escaped(value)))
        .collect();
    out.push_str("history\n");
    for (at, event) in timeline(job, stops) {
        out.push_str(&format!(
            "  {}  {}\n",
            format_time(Some(at)),
            Escaped(&event)
        ));
    }
    out
}

/// The job's life in order: received, every attempt kept, every action, the stops of dispatch
/// that delayed it, the purge.
fn timeline(job: &JobDetail, stops: &[DispatchStop]) -> Vec<(i64, String)> {
    let mut events = vec![(
        job.summary.received_at,
        format!("received ({})", job.summary.source),
    )];
    for attempt in &job.history {
        events.push((attempt.started_at, attempt_line(attempt)));
    }
    for action in &job.actions {
        let mut line = format!("{} by {}", action.action, action.actor);
        if let Some(reason) = &action.reason {
            line.push_str(&format!(": {}", short(Some(reason), 200)));
        }
        events.push((action.at, line));
    }
    if let Some(at) = job.last_duplicate_at {
        let n = job.duplicates;
        events.push((
            at,
            format!("the last of {n} duplicate deliveries (answered, not run)"),
        ));
    }
    if let Some(at) = job.body_purged_at {
        events.push((at, "body purged by retention".into()));
    }
    for stop in stops {
        let line = stop.describe(|ms| format_time(Some(ms)));
        events.push((stop.started_at.max(job.summary.received_at), line));
    }
    if !job
        .summary
        .state
        .parse::<ledger::State>()
        .is_ok_and(|state| state.is_finished())
        && job.summary.state != "running"
    {
        let due = job
            .summary
            .next_attempt_at
            .unwrap_or(job.summary.received_at);
        events.push((
            due,
            format!("next attempt due ({})", job.next_attempt_cause),
        ));
    }
    // Stable: an action and the attempt it caused keep their order within one millisecond.
    events.sort_by_key(|(at, _)| *at);
    events
}

/// One attempt in a job's timeline: its number, cause, route, receiver, outcome and error.
fn attempt_line(attempt: &AttemptRecord) -> String {
    let mut line = format!("attempt {} ({})", attempt.number, attempt.cause);
    // A job of the default route alone reads as before routes.
    if attempt.route != RouteName::DEFAULT {
        line.push_str(&format!(" for route {}", attempt.route));
    }
    if let Some(receiver) = &attempt.receiver {
        line.push_str(&format!(" on {receiver}"));
    }
    match (&attempt.outcome, attempt.ended_at) {
        (Some(outcome), Some(ended_at)) => {
            let took = u64::try_from(ended_at - attempt.started_at).unwrap_or(0);
            line.push_str(&format!(
                ": {outcome} after {}",
                humantime::format_duration(Duration::from_millis(took))
            ));
        }
        _ => line.push_str(": running"),
    }
    if let Some(status) = attempt.exit_status {
        line.push_str(&format!(", exit status {status}"));
    }
    if let Some(status) = attempt.http_status {
        line.push_str(&format!(", HTTP {status}"));
    }
    if let Some(error) = &attempt.error {
        line.push_str(&format!(": {}", short(Some(error), 200)));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_says_when_empty() {
        assert!(jobs_table(&[]).ends_with("(no jobs)\n"));
        let job = JobSummary {
            job_id: "job-1".into(),
            state: "dead".into(),
            source: "webhook".into(),
            event_type: None,
            attempts: 5,
            received_at: 0,
            next_attempt_at: None,
            finished_at: None,
            last_error: Some("exit\nstatus 1".into()),
        };
        let retrying = JobSummary {
            job_id: "job-2".into(),
            state: "retrying".into(),
            next_attempt_at: Some(1_000),
            ..job.clone()
        };
        let done = JobSummary {
            job_id: "job-3".into(),
            state: "done".into(),
            next_attempt_at: Some(1_000),
            ..job.clone()
        };
        let table = jobs_table(&[job, retrying, done]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0].find("STATE"), lines[1].find("dead"));
        assert!(lines[1].contains("1970-01-01T00:00:00.000Z"));
        assert!(lines[1].contains("exit status 1"));
        // The due time of a retrying job, under DUE; none for a finished one.
        let due = lines[0].find("DUE").unwrap();
        assert!(
            lines[2][due..].starts_with("1970-01-01T00:00:01.000Z "),
            "{table}"
        );
        assert!(lines[3][due..].starts_with("- "), "{table}");
    }
}
