//! The console's pages as HTML (maud escapes every value): one function per page, from data
//! the router read; no page reads the ledger itself.

use std::time::{Duration, UNIX_EPOCH};

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::routes::RouteRow;
use super::verdict::{plural, Level, Verdict};
use super::Role;
use super::{assets, charts};
use crate::ledger::{DeadGroup, Dispatch, DispatchStop, Expectation, JobDetail, JobPage, State};
use crate::logging::{Escaped, EscapedLines};
use crate::metrics::Snapshot;
use crate::refusals::Refusal;
use crate::rollup::LastHour;
use crate::route_name::RouteName;

/// How much of a stored body a page shows (the raw download has all of it).
const BODY_SHOWN_BYTES: usize = 64 * 1024;

/// Who is looking, and what they may do.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub role: Role,
    /// The name it signed in as: a named token's (`[[admin.tokens]]`); `None` for the shared
    /// tokens.
    pub name: Option<String>,
    /// Actions are on in the config and this is an operator's session.
    pub may_act: bool,
}

pub fn time(ms: Option<i64>) -> String {
    match ms.and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
        }
        None => "-".into(),
    }
}

fn duration_ms(ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(u64::try_from(ms).unwrap_or(0))).to_string()
}

/// The frame of every page: header, navigation, the page's `<main>`.
pub fn layout(title: &str, viewer: Option<&Viewer>, refresh: bool, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · sume-receiver" }
                link rel="stylesheet" href=(assets::CSS.url());
                script src=(assets::JS.url()) defer {}
            }
            body data-refresh=[refresh.then_some("5")] {
                header {
                    span.brand { "sume-receiver" }
                    @if let Some(viewer) = viewer {
                        nav {
                            a href="/console/" { "Overview" }
                            a href="/console/jobs" { "Jobs" }
                            a href="/console/dead" { "Dead letters" }
                            a href="/console/receipts" { "Receipts" }
                            a href="/console/expected" { "Expected" }
                            a href="/console/config" { "Config" }
                        }
                        span.who {
                            @match &viewer.name {
                                Some(name) => { (name) " (" (viewer.role.label()) @if !viewer.may_act { ", read-only" } ")" }
                                None => { (viewer.role.label()) @if !viewer.may_act { " (read-only)" } }
                            }
                            " "
                            form.inline method="post" action="/console/sign-out" {
                                button type="submit" { "Sign out" }
                            }
                            " "
                            form.inline method="post" action="/console/sign-out-everywhere" {
                                button type="submit" title="End every session of this token, on every browser" { "Sign out everywhere" }
                            }
                        }
                    }
                }
                main { (main) }
            }
        }
    }
}

pub fn sign_in(message: Option<&str>) -> Markup {
    html! {
        h1 { "Sign in" }
        @if let Some(message) = message {
            p.banner.bad { (message) }
        }
        form method="post" action="/console/sign-in" {
            p {
                label { "Token " input type="password" name="token" autocomplete="current-password" autofocus; }
                " "
                button type="submit" { "Sign in" }
            }
        }
        p.muted { "The operator token is " code { "[admin] token_file" } "; a look-only one is " code { "read_token_file" } "." }
    }
}

/// What the overview shows.
pub struct Overview {
    pub verdict: Verdict,
    pub readiness: Result<(), &'static str>,
    pub dispatch: Option<Dispatch>,
    pub snapshot: Option<Snapshot>,
    pub totals: (u64, u64, u64),
    pub maintenance: (u64, u64, u64),
    pub hour: LastHour,
    pub refusals: usize,
    pub free_disk: Option<u64>,
    /// The last hold that ended in the last hour, if any.
    pub last_hold: Option<DispatchStop>,
    pub routes: Vec<RouteRow>,
}

fn bytes(value: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut size = value as f64;
    let mut unit = 0;
    while size >= 1024.0 && unit + 1 < UNITS.len() {
        size /= 1024.0;
        unit += 1;
    }
    format!("{size:.1} {}", UNITS[unit])
}

fn card(label: &str, value: String, class: &str) -> Markup {
    html! { div.card { div.label { (label) } div.value class=(class) { (value) } } }
}

pub fn overview(viewer: &Viewer, data: &Overview) -> Markup {
    let paused = data.dispatch.as_ref().is_some_and(|d| d.paused);
    let jobs = |state: &str| {
        data.snapshot.as_ref().map_or(0, |s| {
            s.jobs
                .iter()
                .find(|(name, _)| *name == state)
                .map_or(0, |(_, n)| *n)
        })
    };
    let oldest = data
        .snapshot
        .as_ref()
        .map_or(0.0, |s| s.oldest_unfinished_age_seconds);
    html! {
        h1 { "Is anything wrong?" }
        (verdict_banner(&data.verdict))
        @match data.readiness {
            Ok(()) => p.muted { "Ready: a delivery sent now is claimed and acknowledged." },
            Err(reason) => p.muted { "Not ready: " (reason) },
        }
        @if paused {
            @let dispatch = data.dispatch.as_ref().expect("paused");
            p.banner.warn {
                "Dispatch is paused (by " (dispatch.changed_by.as_deref().unwrap_or("?")) ", "
                (time(dispatch.changed_at)) "): deliveries are claimed; no job runs."
            }
        }
        @if let Some(hold) = &data.last_hold {
            @let ended = hold.ended_at.unwrap_or(hold.started_at);
            p.muted {
                "The last hold ended " (time(Some(ended))) ", after " (duration_ms(ended - hold.started_at))
                @if let Some(by) = &hold.ended_by { " (ended by " (by) ")" } @else { " (a probe succeeded)" }
                @if let Some(reason) = &hold.reason { "; it opened for: " (reason) }
                "."
            }
        }
        @if viewer.may_act {
            form.inline method="post" action=(if paused { "/console/dispatch/resume" } else { "/console/dispatch/pause" })
                data-confirm=(if paused { "Resume dispatch: run due jobs again?" } else { "Pause dispatch: claim deliveries but run no job?" }) {
                @if !paused {
                    input type="text" name="reason" placeholder="why (optional)" maxlength="200";
                    " "
                }
                button type="submit" { (if paused { "Resume dispatch" } else { "Pause dispatch" }) }
            }
        }
        div.cards {
            (card("claimed (waiting)", jobs("claimed").to_string(), ""))
            (card("retrying", jobs("retrying").to_string(), if jobs("retrying") > 0 { "warn" } else { "" }))
            (card("running", jobs("running").to_string(), ""))
            (card("done", jobs("done").to_string(), "ok"))
            (card("dead", jobs("dead").to_string(), if jobs("dead") > 0 { "bad" } else { "" }))
            (card("oldest unfinished", if oldest > 0.0 { duration_ms((oldest * 1000.0) as i64) } else { "-".into() }, if oldest > 3600.0 { "warn" } else { "" }))
            (card("refused (recent)", data.refusals.to_string(), if data.refusals > 0 { "warn" } else { "" }))
            @if let Some(snapshot) = &data.snapshot {
                (card("ledger", bytes(snapshot.ledger_bytes), ""))
                @if let Some(wal) = snapshot.wal_bytes { (card("WAL", bytes(wal), "")) }
                (card("writer queue", snapshot.claim_queue_depth.to_string(), ""))
            }
            @if let Some(free) = data.free_disk {
                (card("free disk", bytes(free), if free < 1 << 30 { "bad" } else { "" }))
            }
        }
        (routes_table(&data.routes))
        h2 { "Deliveries" }
        (charts::counts(&data.hour, &["claimed", "duplicate", "refused", "unavailable"], "Deliveries"))
        p.muted { "Since start: " (data.totals.0) " claimed, " (plural(data.totals.1, "duplicate", "duplicates")) ", " (data.totals.2) " refused or unavailable." }
        h2 { "Attempts" }
        (charts::counts(&data.hour, &["done", "failed", "dead"], "Attempts"))
        p.muted {
            "Since start: " (plural(data.maintenance.0, "lease", "leases")) " taken back by the sweeper, "
            (plural(data.maintenance.1, "job", "jobs")) " recovered by polling Sume, "
            (plural(data.maintenance.2, "expectation", "expectations")) " given up."
        }
        h2 { "Acknowledgement latency" }
        p.muted { "From a verified delivery to its answer: the claim's commit on disk (Sume waits at most 10 s)." }
        (charts::timing(&data.hour, "ack", "Acknowledgement latency"))
        h2 { "Run latency" }
        p.muted { "Handler attempts, start to end." }
        (charts::timing(&data.hour, "run", "Run latency"))
    }
}

/// The routes' table; nothing for the one default route running (the cards say it all).
fn routes_table(rows: &[RouteRow]) -> Markup {
    let only_default = matches!(rows, [row] if row.route == crate::route_name::RouteName::DEFAULT && row.dispatch == "running");
    if rows.is_empty() || only_default {
        return html! {};
    }
    html! {
        h2 { "Routes" }
        table {
            thead { tr { th { "route" } th { "dispatch" } th.num { "waiting" } th.num { "running" } th { "held since" } } }
            tbody {
                @for row in rows {
                    tr {
                        td.mono { (row.route) }
                        td class=(match row.dispatch { "running" => "", "paused" => "warn", _ => "bad" }) { (row.dispatch) }
                        td.num { (row.waiting) }
                        td.num { (row.running) }
                        td { (time(row.held_since)) }
                    }
                }
            }
        }
        @if rows.iter().any(|row| row.dispatch == "not in the config") {
            p.muted { "A route not in the config keeps its work in the ledger, unrun, until a route of its name comes back (a reload puts it back)." }
        }
    }
}

/// The verdict: its level in words and colour, each reason linked to its evidence.
fn verdict_banner(verdict: &Verdict) -> Markup {
    let (class, headline) = match verdict.level {
        Level::Ok => ("ok", "OK: nothing is wrong that the receiver can see."),
        Level::Attention => ("warn", "Attention: something needs a look."),
        Level::Failing => ("bad", "Failing: something is wrong now."),
    };
    html! {
        section class=(format!("verdict banner {class}")) role="status" data-level=(verdict.level.label()) {
            strong { (headline) }
            @if !verdict.reasons.is_empty() {
                ul {
                    @for reason in &verdict.reasons {
                        li class=(if reason.level == Level::Failing { "bad" } else { "warn" }) {
                            a href=(reason.href) { (reason.text) }
                        }
                    }
                }
            }
        }
    }
}

/// A list's filters as its query string has them (echoed into the form and the links).
pub struct ListQuery<'a> {
    pub state: Option<State>,
    pub event_type: Option<&'a str>,
    /// Durations ago, as typed ("1h").
    pub since: Option<&'a str>,
    pub before: Option<&'a str>,
    pub limit: usize,
}

impl ListQuery<'_> {
    /// The query string of this list's page after `after`.
    pub fn to_query(&self, after: Option<&str>) -> String {
        let mut query = format!("limit={}", self.limit);
        for (name, value) in [
            ("state", self.state.map(State::as_str)),
            ("event_type", self.event_type),
            ("since", self.since),
            ("before", self.before),
            ("after", after),
        ] {
            if let Some(value) = value {
                query.push_str(&format!("&{name}={}", encode(value)));
            }
        }
        query
    }
}

/// `/console/jobs?state=...`: one page of the list.
pub fn jobs(list: &ListQuery, page: &JobPage) -> Markup {
    let states = ["claimed", "retrying", "running", "done", "dead"];
    let chosen = list.state.map(State::as_str);
    let filtered = list.event_type.is_some();
    html! {
        h1 { "Jobs" @if let Some(state) = chosen { " · " (state) } }
        form.filters method="get" action="/console/jobs" {
            label { "state"
                select name="state" {
                    option value="" selected[chosen.is_none()] { "any (by received)" }
                    @for name in states { option value=(name) selected[chosen == Some(name)] { (name) } }
                }
            }
            label { "event type" input type="search" name="event_type" placeholder="job.completed" maxlength="200" value=[list.event_type]; }
            label { "within (its list's time)" input type="text" name="since" placeholder="1h" size="6" maxlength="40" value=[list.since]; }
            label { "older than" input type="text" name="before" placeholder="10m" size="6" maxlength="40" value=[list.before]; }
            label { "per page" input type="number" name="limit" min="1" max="500" value=(list.limit); }
            button type="submit" { "Show" }
            a href=(format!("/console/api/jobs?{}", list.to_query(None))) { "JSON" }
        }
        form.filters method="get" action="/console/jobs" {
            label { "job_id" input type="search" name="job_id" placeholder="exact id" maxlength="1024"; }
            button type="submit" { "Open" }
        }
        @if page.jobs.is_empty() {
            p.muted { "No jobs." }
        } @else {
            table {
                thead { tr { th { "job_id" } th { "state" } th.num { "attempts" } th { "event" } th { "received" } th { "next attempt" } th { "finished" } th { "last error" } } }
                tbody {
                    @for job in &page.jobs {
                        tr {
                            td.mono { a href=(job_href(&job.job_id)) { (Escaped(&job.job_id)) } }
                            td { (job.state) }
                            td.num { (job.attempts) }
                            td { (job.event_type.as_deref().unwrap_or("-")) }
                            td { (time(Some(job.received_at))) }
                            td { (time(job.next_attempt_at)) }
                            td { (time(job.finished_at)) }
                            td { (short(job.last_error.as_deref().unwrap_or("-"), 120)) }
                        }
                    }
                }
            }
        }
        @if let Some(next) = &page.next {
            @if filtered && page.jobs.len() < list.limit {
                p.muted { "The event type is not indexed: this page read its " (crate::ledger::ROWS_READ_PER_FILTERED_PAGE) " jobs and stopped." }
            }
            p { a href=(format!("/console/jobs?{}", list.to_query(Some(&next.to_string())))) { "Next page →" } }
        }
    }
}

/// Percent-encodes all but unreserved characters: safe in a path segment and a query value.
pub fn encode(text: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, RESERVED).to_string()
}

pub fn job_href(job_id: &str) -> String {
    format!("/console/jobs/{}", encode(job_id))
}

fn short(text: &str, max_chars: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.chars().count() > max_chars {
        format!("{}…", line.chars().take(max_chars).collect::<String>())
    } else {
        line
    }
}

/// One job as a timeline, its payload, and what may be done with it.
/// A job's trace on its page: the id of its delivery's trace, and the team's link to it.
pub struct JobTrace {
    pub trace_id: String,
    pub link: Option<String>,
}

pub fn job(
    viewer: &Viewer,
    job: &JobDetail,
    stops: &[DispatchStop],
    trace: Option<&JobTrace>,
) -> Markup {
    let summary = &job.summary;
    let href = job_href(&summary.job_id);
    let mut events: Vec<(i64, Markup)> = vec![(
        summary.received_at,
        html! { "received (" (summary.source) ")" },
    )];
    for attempt in &job.history {
        events.push((
            attempt.started_at,
            html! {
                "attempt " (attempt.number) " (" (attempt.cause) ")"
                @if attempt.route != RouteName::DEFAULT { " for route " (attempt.route) }
                @if let Some(receiver) = &attempt.receiver { " on " (receiver) }
                ": "
                @match (&attempt.outcome, attempt.ended_at) {
                    (Some(outcome), Some(ended)) => {
                        // Given back uncounted is no failure of the job: not in red.
                        @let class = match outcome.as_str() { "done" => "ok", "released" => "muted", _ => "bad" };
                        strong class=(class) { (outcome) }
                        " after " (duration_ms(ended - attempt.started_at))
                    }
                    _ => strong { "running" },
                }
                @if let Some(status) = attempt.exit_status { ", exit status " (status) }
                @if let Some(status) = attempt.http_status { ", HTTP " (status) }
                @if let Some(error) = &attempt.error { pre { (EscapedLines(error)) } }
            },
        ));
    }
    for action in &job.actions {
        events.push((
            action.at,
            html! {
                strong { (action.action) } " by " (action.actor)
                @if let Some(reason) = &action.reason {
                    // A cancel's reason is kept as the job's error too ("cancelled by X: why").
                    @let prefix = format!("cancelled by {}: ", action.actor);
                    ": " (reason.strip_prefix(prefix.as_str()).unwrap_or(reason))
                }
            },
        ));
    }
    if let Some(at) = job.last_duplicate_at {
        events.push((
            at,
            html! { "the last of " (job.duplicates) " duplicate deliveries (answered, not run)" },
        ));
    }
    if let Some(at) = job.body_purged_at {
        events.push((at, html! { "body purged by retention (a tombstone remains: redeliveries stay duplicates)" }));
    }
    let waiting = matches!(summary.state.as_str(), "claimed" | "retrying");
    // The stops of dispatch that delayed it, ended or not: after the receipt they delayed.
    for stop in stops {
        events.push((
            stop.started_at.max(summary.received_at),
            html! {
                strong.warn { (stop.describe(|ms| time(Some(ms)))) }
                @if waiting && stop.ended_at.is_none() { ": this job waits for its end" }
            },
        ));
    }
    events.sort_by_key(|(at, _)| *at);
    html! {
        h1 { "Job " code { (Escaped(&summary.job_id)) } }
        table {
            tr { th { "state" } td { strong { (summary.state) } @if waiting { " · next attempt " (time(summary.next_attempt_at)) " (" (job.next_attempt_cause) ")" } } }
            tr { th { "event" } td { (summary.event_type.as_deref().unwrap_or("-")) } }
            tr { th { "attempts (this set)" } td { (summary.attempts) } }
            @if summary.state == "done" {
                // An earlier attempt's error is history (the timeline), not the job's state.
                tr { th { "last error" } td { "none: the job is done" } }
            } @else {
                tr { th { "last error" } td { (summary.last_error.as_deref().unwrap_or("-")) } }
            }
            tr { th { "duplicates" } td { (job.duplicates) } }
            @if let Some(trace) = trace {
                tr { th { "trace" } td {
                    @match &trace.link {
                        Some(link) => a href=(link) rel="noreferrer" { code { (trace.trace_id) } },
                        None => code { (trace.trace_id) },
                    }
                } }
            }
        }
        @if viewer.may_act {
            p {
                @if summary.state == "done" || summary.state == "dead" {
                    form.inline method="post" action=(format!("{href}/retry")) data-confirm="Run this job again from its stored body?" {
                        button type="submit" { "Retry" }
                    }
                }
                @if summary.state == "retrying" {
                    form.inline method="post" action=(format!("{href}/run-now")) {
                        button type="submit" { "Run now" }
                    }
                }
                @if waiting {
                    " "
                    form.inline method="post" action=(format!("{href}/cancel")) data-confirm="Cancel this job? It becomes dead and never runs." {
                        input type="text" name="reason" required placeholder="why" maxlength="200";
                        " " button.danger type="submit" { "Cancel" }
                    }
                }
            }
        }
        h2 { "Timeline" }
        ol.timeline {
            @for (at, event) in &events {
                li { time { (time(Some(*at))) } (event) }
            }
        }
        h2 { "Payload" }
        @match &job.body {
            Some(body) => {
                @let pretty = serde_json::from_str::<serde_json::Value>(body)
                    .ok()
                    .and_then(|value| serde_json::to_string_pretty(&value).ok())
                    .unwrap_or_else(|| body.clone());
                @let cut = pretty.len() > BODY_SHOWN_BYTES;
                @let shown = (0..=BODY_SHOWN_BYTES.min(pretty.len())).rev().find(|&at| pretty.is_char_boundary(at)).unwrap_or(0);
                pre.payload { (EscapedLines(&pretty[..shown])) }
                p { @if cut { "Cut at 64 KiB. " } a href=(format!("{href}/body")) { "Download the body as received" } }
            }
            None => p.muted { "Purged by retention " (time(job.body_purged_at)) "." },
        }
    }
}

pub fn dead(viewer: &Viewer, groups: &[DeadGroup]) -> Markup {
    html! {
        h1 { "Dead letters" }
        p.muted { "Dead jobs grouped by what failed: the error with the first line of the handler's stderr or HTTP answer, ids and numbers as " code { "#" } "; every cancel is one group. The largest groups first (recomputed at most every 10 s). The CLI retries a group with " code { "jobs retry --state dead --group SIGNATURE" } "." }
        @if groups.is_empty() {
            p.ok { "No dead jobs." }
        } @else {
            table {
                thead { tr { th.num { "jobs" } th { "error" } th { "last died" } th { "example" } @if viewer.may_act { th {} } } }
                tbody {
                    @for group in groups {
                        tr {
                            td.num { (group.jobs) }
                            td.mono { (group.signature) }
                            td { (time(group.last_finished_at)) }
                            td.mono { a href=(job_href(&group.example_job_id)) { (Escaped(&group.example_job_id)) } }
                            @if viewer.may_act {
                                td {
                                    form.inline method="get" action="/console/dead/retry" {
                                        input type="hidden" name="signature" value=(group.signature);
                                        button type="submit" { "Retry this group…" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The confirmation of a group's retry, with the exact count.
pub fn retry_group(signature: &str, count: usize) -> Markup {
    html! {
        h1 { "Retry a group of dead jobs" }
        p { "The group " code { (signature) } " holds " strong { (plural(count as u64, "dead job", "dead jobs")) } "; each runs again unless retention purged its body." }
        form method="post" action="/console/dead/retry" data-confirm="Retry them all?" {
            input type="hidden" name="signature" value=(signature);
            button type="submit" { "Retry " (plural(count as u64, "job", "jobs")) }
            " " a href="/console/dead" { "Back" }
        }
    }
}

/// A job the ledger does not have, in the console's frame.
pub fn unknown_job(job_id: &str) -> Markup {
    html! {
        h1 { "No such job" }
        p { "The ledger has no job " code { (Escaped(job_id)) } ": it never arrived, or retention forgot it (after " code { "retention.dedupe_ttl" } ")." }
        form.filters method="get" action="/console/jobs" {
            label { "job_id" input type="search" name="job_id" placeholder="exact id" maxlength="1024" value=(job_id); }
            button type="submit" { "Open" }
        }
        p { a href="/console/jobs" { "All jobs" } " · " a href="/console/expected" { "Expected jobs" } }
    }
}

pub fn done(message: &str, back: &str) -> Markup {
    html! {
        p #done .banner.ok { (message) }
        p { a href=(back) { "Back" } }
    }
}

pub fn receipts(refusals: &[Refusal], hour: &LastHour) -> Markup {
    let total = |label: &str| {
        hour.series
            .iter()
            .find(|(name, _)| *name == label)
            .map_or(0, |(_, counts)| counts.iter().sum::<u64>())
    };
    let (newest, older) = (total("newest_secret"), total("older_secret"));
    let worst_skew = hour.max_skew_secs.iter().copied().max().unwrap_or(0);
    let recent_skew = hour.max_skew_secs.last().copied().unwrap_or(0);
    html! {
        h1 { "Receipts" }
        h2 { "Which secret verified the deliveries (last hour)" }
        p {
            (newest) " by the newest secret, "
            strong class=(if older > 0 { "warn" } else { "" }) { (older) } " by an older one"
            @if older > 0 { ": Sume still signs with a secret being rotated out; keep it configured until this is 0 for a while." }
            @else { "." }
        }
        h2 { "Clock skew of verified deliveries" }
        p { "The largest difference between Sume's timestamp and this receiver's clock: "
            strong { (worst_skew) " s" } " in the last hour, " (recent_skew) " s this minute."
            " Past the tolerance a delivery is refused (below: timestamp is outside the tolerance)." }
        h2 { "Refused deliveries" }
        p.muted { "The most recent " (crate::refusals::RING_CAPACITY) " at most, newest first (also in the log as `delivery refused`)." }
        @if refusals.is_empty() {
            p.ok { "None refused since start." }
        } @else {
            table {
                thead { tr { th { "when" } th { "peer" } th.num { "status" } th { "outcome" } th { "why" } } }
                tbody {
                    @for refusal in refusals {
                        tr {
                            td { (time(Some(refusal.at))) }
                            td.mono { (refusal.peer) }
                            td.num { (refusal.status) }
                            td { (refusal.outcome) }
                            td.mono { (refusal.reason) }
                        }
                    }
                }
            }
        }
    }
}

pub fn expected(rows: &[Expectation]) -> Markup {
    html! {
        h1 { "Expected jobs" }
        p.muted { "Registered with " code { "jobs expect" } " or " code { "PUT /v1/expected/{job_id}" } ": polled at Sume when no webhook comes." }
        @if rows.is_empty() {
            p.muted { "None registered." }
        } @else {
            table {
                thead { tr { th { "job_id" } th { "state" } th { "expected" } th { "next poll" } th.num { "polls" } th { "Sume said" } th { "last error" } } }
                tbody {
                    @for row in rows {
                        tr {
                            td.mono { a href=(job_href(&row.job_id)) { (Escaped(&row.job_id)) } }
                            td { (row.state) }
                            td { (time(Some(row.expected_at))) }
                            td { (if row.state == "waiting" { time(Some(row.next_poll_at)) } else { "-".into() }) }
                            td.num { (row.polls) }
                            td { (row.last_status.as_deref().unwrap_or("-")) }
                            td { (short(row.last_error.as_deref().unwrap_or("-"), 120)) }
                        }
                    }
                }
            }
        }
    }
}

pub fn config(settings: &[(String, String)], receivers: &[(String, u64)]) -> Markup {
    html! {
        h1 { "Config and health" }
        p.muted { "The settings in effect (credentials are never shown)." }
        table {
            @for (key, value) in settings {
                tr { th.mono { (key) } td.mono { (value) } }
            }
        }
        @if !receivers.is_empty() {
            h2 { "Receivers holding running jobs" }
            table {
                thead { tr { th { "receiver" } th.num { "running jobs" } } }
                tbody {
                    @for (receiver, running) in receivers {
                        tr { td.mono { (receiver) } td.num { (running) } }
                    }
                }
            }
        }
    }
}

/// A page that breaks the Content-Security-Policy on purpose: a browser test proves with it
/// that violations are reported (and that the policy blocks them).
pub fn csp_canary() -> Markup {
    html! {
        h1 { "CSP canary" }
        p { "This page holds an inline script and an inline style; the policy blocks both and reports them." }
        (PreEscaped("<script>document.title = 'canary ran';</script>"))
        p style="color: red" { "Styled inline." }
    }
}
