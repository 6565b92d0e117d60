//! The console's pages read: each route's data from the ledger, drawn by `pages`, or as JSON.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use maud::Markup;

use super::http::{decode, form_value, page, refuse, text, unavailable, Refused};
use super::pages::{self, Viewer};
use super::{health, verdict};
use super::{Console, Role, GROUPS_SHOWN, MAX_PAGE_LIMIT, PAGE_LIMIT};
use crate::config::Listener;
use crate::ledger::{duration_ms, now_ms, Cursor, DeadGroup, JobFilter, State, StopKind};
use crate::metrics::FilesystemSpace;
use crate::metrics::METRICS;
use crate::response::{json_response, typed};
use crate::rollup::ROLLUP;
use crate::traces::SpanContext;

/// The stops (pauses, holds) of the last hour the overview reads, oldest first: the last hold
/// is missed only after more stops than this in one hour.
const LAST_STOPS_READ: usize = 100;

impl Console {
    /// A page, or its JSON twin under `/console/api/`.
    pub(super) async fn show(
        &self,
        viewer: Viewer,
        path: &str,
        query: &str,
    ) -> Response<Full<Bytes>> {
        let (json, path) = match path.strip_prefix("/console/api/") {
            Some(rest) => (true, format!("/console/{rest}")),
            None => (false, path.to_owned()),
        };
        let segments: Vec<&str> = path.trim_start_matches("/console/").split('/').collect();
        let shown: Result<(String, Markup, serde_json::Value, bool), Refused> = match segments
            .as_slice()
        {
            [""] => self
                .overview(&viewer)
                .await
                .map(|(m, j)| ("Overview".into(), m, j, true)),
            ["jobs"] if !json && form_value(query, "job_id").is_some_and(|id| !id.is_empty()) => {
                // The search box: straight to the job's page.
                let location = pages::job_href(&form_value(query, "job_id").unwrap_or_default());
                let mut response = text(StatusCode::SEE_OTHER, "");
                let value = HeaderValue::from_str(&location).expect("percent-encoded: ASCII");
                response.headers_mut().insert(header::LOCATION, value);
                return response;
            }
            ["jobs"] => self
                .jobs(query)
                .await
                .map(|(m, j)| ("Jobs".into(), m, j, false)),
            ["jobs", id] => self
                .job(&viewer, id, json)
                .await
                .map(|(m, j)| ("Job".into(), m, j, false)),
            ["jobs", id, "body"] if !json => return self.body(id).await,
            ["dead"] => match self.dead_groups().await {
                Ok(groups) => Ok((
                    "Dead letters".into(),
                    pages::dead(&viewer, &groups),
                    serde_json::json!(groups),
                    false,
                )),
                Err(error) => Err(Box::new(unavailable(&error))),
            },
            ["dead", "retry"] if viewer.may_act => {
                let signature = form_value(query, "signature").unwrap_or_default();
                match self.ledger.dead_group_jobs(&signature).await {
                    Ok(jobs) => Ok((
                        "Retry a group".into(),
                        pages::retry_group(&signature, jobs.len()),
                        serde_json::json!({ "signature": signature, "jobs": jobs.len() }),
                        false,
                    )),
                    Err(error) => Err(Box::new(unavailable(&error))),
                }
            }
            ["receipts"] => {
                let refusals = self.refusals.recent();
                let hour = ROLLUP.last_hour();
                let json = serde_json::json!({ "refusals": refusals, "last_hour": hour });
                Ok((
                    "Receipts".into(),
                    pages::receipts(&refusals, &hour),
                    json,
                    false,
                ))
            }
            ["expected"] => match self.ledger.list_expectations(PAGE_LIMIT * 4).await {
                Ok(rows) => Ok((
                    "Expected".into(),
                    pages::expected(&rows),
                    serde_json::json!(rows),
                    false,
                )),
                Err(error) => Err(Box::new(unavailable(&error))),
            },
            ["config"] => match self.ledger.running_by_receiver().await {
                Ok(receivers) => {
                    // A reader sees no handler argument (a password may be one).
                    let mut rows = match viewer.role {
                        Role::Operator => self.settings.clone(),
                        Role::Reader => self.reader_settings.clone(),
                    };
                    rows.extend(super::settings::certificate_rows(&self.certificates));
                    let rows = &rows;
                    let settings: std::collections::BTreeMap<_, _> = rows.iter().cloned().collect();
                    let json = serde_json::json!({
                        "settings": settings,
                        "running_by_receiver": receivers,
                    });
                    let main = pages::config(rows, &receivers);
                    Ok(("Config".into(), main, json, false))
                }
                Err(error) => Err(Box::new(unavailable(&error))),
            },
            ["csp-canary"] => Ok((
                "CSP canary".into(),
                pages::csp_canary(),
                serde_json::json!({}),
                false,
            )),
            ["csp-reports"] => {
                let reports: Vec<String> = self
                    .csp_reports
                    .lock()
                    .expect("not poisoned")
                    .iter()
                    .map(|(_, report)| report.clone())
                    .collect();
                Ok((
                    "CSP reports".into(),
                    maud::html! { pre { (reports.join("\n")) } },
                    serde_json::json!(reports),
                    false,
                ))
            }
            _ => Err(refuse(StatusCode::NOT_FOUND, "no such page")),
        };
        match shown {
            Ok((_, _, value, _)) if json => json_response(StatusCode::OK, &value),
            Ok((title, main, _, refresh)) => page(
                StatusCode::OK,
                pages::layout(&title, Some(&viewer), refresh, main),
            ),
            Err(response) => *response,
        }
    }

    /// The dead-letter groups, as computed at most [`GROUPS_FRESH`] ago.
    async fn dead_groups(&self) -> Result<Vec<DeadGroup>, crate::ledger::StorageError> {
        self.groups
            .get_or_read(|| self.ledger.dead_groups(GROUPS_SHOWN))
            .await
    }

    async fn overview(&self, viewer: &Viewer) -> Result<(Markup, serde_json::Value), Refused> {
        let ledger = self
            .ledger_facts
            .get_or_read(|| health::read_ledger(&self.ledger))
            .await
            .ok();
        let dispatch = self.ledger.dispatch().await.ok();
        // The last hold that ended in the hour: once it ends the verdict is ok again, and
        // without this the overview kept no trace of it. One read of the stops' log by its
        // start, at most LAST_STOPS_READ rows.
        let now = now_ms();
        let last_hold = self
            .ledger
            .dispatch_stops(
                now - duration_ms(Duration::from_secs(3600)),
                now,
                LAST_STOPS_READ,
            )
            .await
            .ok()
            .and_then(|stops| {
                stops
                    .into_iter()
                    .rfind(|stop| stop.kind == StopKind::Hold && stop.ended_at.is_some())
            });
        let hour = ROLLUP.last_hour();
        let disk = self
            .ledger_dir
            .as_deref()
            .and_then(FilesystemSpace::of)
            .map(|space| (space.free, space.size));
        let webhook_tls = self
            .certificates
            .iter()
            .find(|tls| tls.listener() == Listener::Webhook);
        let readiness = crate::server::readiness(&self.ledger, webhook_tls.map(|tls| &**tls));
        let facts = health::facts(&health::Sources {
            ledger: ledger.as_ref(),
            health: self.health.as_ref(),
            readiness,
            dispatch: dispatch.as_ref(),
            hour: &hour,
            tolerance: self.tolerance,
            disk,
            due_limit: self.due_limit,
        });
        let routes = super::routes::rows(
            &self.queue,
            ledger.as_ref().map_or(&[], |facts| &facts.snapshot.work),
        );
        let data = pages::Overview {
            verdict: verdict::verdict(&facts),
            readiness,
            free_disk: disk.map(|(free, _)| free),
            dispatch,
            snapshot: ledger.map(|facts| facts.snapshot),
            totals: METRICS.delivery_totals(),
            maintenance: METRICS.maintenance_totals(),
            hour,
            refusals: self.refusals.recent().len(),
            last_hold,
            routes,
        };
        let json = serde_json::json!({
            "verdict": data.verdict.to_json(),
            "ready": data.readiness.is_ok(),
            "not_ready_because": data.readiness.err(),
            "dispatch": data.dispatch,
            "jobs": data.snapshot.as_ref().map(|s| s.jobs.clone()),
            "oldest_unfinished_age_seconds": data.snapshot.as_ref().map(|s| s.oldest_unfinished_age_seconds),
            "last_hour": data.hour,
            "last_hold_ended": data.last_hold,
            "routes": data.routes,
        });
        Ok((pages::overview(viewer, &data), json))
    }

    async fn jobs(&self, query: &str) -> Result<(Markup, serde_json::Value), Refused> {
        let state = match form_value(query, "state").filter(|s| !s.is_empty()) {
            Some(state) => Some(
                state
                    .parse::<State>()
                    .map_err(|error| refuse(StatusCode::BAD_REQUEST, &error))?,
            ),
            None => None,
        };
        let after = match form_value(query, "after").filter(|s| !s.is_empty()) {
            Some(after) => Some(
                after
                    .parse::<Cursor>()
                    .map_err(|error| refuse(StatusCode::BAD_REQUEST, &error))?,
            ),
            None => None,
        };
        let limit = form_value(query, "limit")
            .and_then(|limit| limit.parse::<usize>().ok())
            .unwrap_or(PAGE_LIMIT)
            .clamp(1, MAX_PAGE_LIMIT);
        let given = |name| form_value(query, name).filter(|value| !value.is_empty());
        let (event_type, since, before) = (given("event_type"), given("since"), given("before"));
        let ago = |text: &Option<String>, name: &str| -> Result<Option<i64>, Refused> {
            text.as_deref()
                .map(|text| {
                    humantime::parse_duration(text)
                        .map(|ago| now_ms() - duration_ms(ago))
                        .map_err(|error| {
                            refuse(
                                StatusCode::BAD_REQUEST,
                                &format!(
                                    "{name}: {text:?} is not a duration (\"1h\", \"2d\"): {error}"
                                ),
                            )
                        })
                })
                .transpose()
        };
        let filter = JobFilter {
            state,
            event_type: event_type.clone(),
            route: None,
            since: ago(&since, "since")?,
            before: ago(&before, "before")?,
        };
        let page = self
            .ledger
            .find_jobs(&filter, after.as_ref(), limit)
            .await
            .map_err(|e| Box::new(unavailable(&e)))?;
        let list = pages::ListQuery {
            state,
            event_type: event_type.as_deref(),
            since: since.as_deref(),
            before: before.as_deref(),
            limit,
        };
        Ok((pages::jobs(&list, &page), serde_json::json!(page)))
    }

    async fn job(
        &self,
        viewer: &Viewer,
        id: &str,
        json: bool,
    ) -> Result<(Markup, serde_json::Value), Refused> {
        let job_id = decode(id)?;
        match self.ledger.show_job(&job_id).await {
            Ok(Some(job)) => {
                // The pauses and holds that delayed it, also those that ended.
                let stops = self
                    .ledger
                    .stops_delaying(&job, now_ms())
                    .await
                    .map_err(|error| Box::new(unavailable(&error)))?;
                let trace = self.trace_of(&job_id).await;
                let main = pages::job(viewer, &job, &stops, trace.as_ref());
                let mut json = serde_json::json!(job);
                json["delayed_by"] = serde_json::json!(stops);
                json["trace_id"] = serde_json::json!(trace.map(|trace| trace.trace_id));
                Ok((main, json))
            }
            Ok(None) if json => Err(refuse(StatusCode::NOT_FOUND, "no such job in the ledger")),
            Ok(None) => Err(Box::new(page(
                StatusCode::NOT_FOUND,
                pages::layout(
                    "No such job",
                    Some(viewer),
                    false,
                    pages::unknown_job(job_id.as_str()),
                ),
            ))),
            Err(error) => Err(Box::new(unavailable(&error))),
        }
    }

    /// The job's trace, with tracing on: its id, and its link with a `trace_url`. A ledger
    /// that cannot say leaves it out of the page rather than failing it.
    async fn trace_of(&self, job_id: &crate::job_id::JobId) -> Option<pages::JobTrace> {
        let tracing = self.tracing.as_ref()?;
        let kept = self.ledger.trace_context(job_id).await.ok()??;
        let trace_id = SpanContext::from_stored(&kept)?.trace_id_hex();
        Some(pages::JobTrace {
            link: tracing.trace_link(&trace_id),
            trace_id,
        })
    }

    /// The stored body exactly as received, as a download: never rendered by the browser.
    async fn body(&self, id: &str) -> Response<Full<Bytes>> {
        let job_id = match decode(id) {
            Ok(job_id) => job_id,
            Err(response) => return *response,
        };
        match self.ledger.show_job(&job_id).await {
            Ok(Some(job)) => match job.body {
                Some(body) => {
                    let mut response = typed(StatusCode::OK, body, "application/octet-stream");
                    response.headers_mut().insert(
                        header::CONTENT_DISPOSITION,
                        HeaderValue::from_static("attachment; filename=\"body.json\""),
                    );
                    response
                }
                None => text(StatusCode::GONE, "retention purged this job's body"),
            },
            Ok(None) => text(StatusCode::NOT_FOUND, "no such job in the ledger"),
            Err(error) => unavailable(&error),
        }
    }
}
