//! The console's actions: a form posted by an operator, and the page saying what happened.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::http::{decode, form_value, page, text, unavailable};
use super::pages::{self, Viewer};
use super::Console;
use crate::ledger::now_ms;
use crate::logging::Escaped;

impl Console {
    /// A form's action; answers with a page saying what happened.
    pub(super) async fn act(
        &self,
        viewer: Viewer,
        path: &str,
        form: &str,
        by: &str,
    ) -> Response<Full<Bytes>> {
        let segments: Vec<&str> = path.trim_start_matches("/console/").split('/').collect();
        let now = now_ms();
        let (message, back) = match segments.as_slice() {
            ["dispatch", change @ ("pause" | "resume")] => {
                let paused = *change == "pause";
                let reason =
                    form_value(form, "reason").filter(|reason| paused && !reason.trim().is_empty());
                match self
                    .ledger
                    .set_dispatch(paused, by, reason.as_deref(), now)
                    .await
                {
                    Ok(_) => {
                        if let Some(queue) = &self.queue {
                            queue.dispatch_changed(paused);
                        }
                        tracing::info!(%by, paused, "dispatch changed in the console");
                        (
                            if paused {
                                "Dispatch paused: deliveries are claimed, no job runs."
                            } else {
                                "Dispatch resumed."
                            }
                            .to_owned(),
                            "/console/".to_owned(),
                        )
                    }
                    Err(error) => return unavailable(&error),
                }
            }
            ["jobs", id, action @ ("retry" | "run-now" | "cancel")] => {
                let job_id = match decode(id) {
                    Ok(job_id) => job_id,
                    Err(response) => return *response,
                };
                let done = match *action {
                    "retry" => match self.ledger.retry_job(job_id.as_str(), by, now).await {
                        Ok(()) => Ok(true),
                        Err(crate::ledger::RetryError::Storage(error)) => Err(error),
                        Err(refused) => return text(StatusCode::CONFLICT, &refused.to_string()),
                    },
                    "run-now" => self.ledger.run_now(job_id.as_str(), by, now).await,
                    _ => {
                        let Some(reason) =
                            form_value(form, "reason").filter(|r| !r.trim().is_empty())
                        else {
                            return text(StatusCode::BAD_REQUEST, "a cancel needs a reason");
                        };
                        self.ledger
                            .cancel_job(job_id.as_str(), by, &reason, now)
                            .await
                    }
                };
                match done {
                    Ok(true) => {
                        if let Some(queue) = &self.queue {
                            queue.look_in_ledger();
                        }
                        tracing::info!(job_id = %job_id, action, %by, "job action in the console");
                        let paused = self.ledger.dispatch().await.is_ok_and(|d| d.paused);
                        (queued(action, paused), pages::job_href(job_id.as_str()))
                    }
                    Ok(false) => {
                        return text(
                            StatusCode::CONFLICT,
                            &format!("{action} does not apply to this job in its state"),
                        )
                    }
                    Err(error) => return unavailable(&error),
                }
            }
            ["dead", "retry"] => {
                let signature = form_value(form, "signature").unwrap_or_default();
                let (retried, refused) =
                    match self.ledger.retry_dead_group(&signature, by, now).await {
                        Ok(counts) => counts,
                        Err(error) => return unavailable(&error),
                    };
                if let Some(queue) = &self.queue {
                    queue.look_in_ledger();
                }
                self.groups.forget().await;
                tracing::info!(retried, refused, %by, signature = %Escaped(&signature), "dead-letter group retried in the console");
                let mut message =
                    format!("{retried} jobs of the group \"{signature}\" are queued to run again.");
                if refused > 0 {
                    message.push_str(&format!(
                        " {refused} could not be: retention purged their body, or they left the group."
                    ));
                }
                (message, "/console/dead".to_owned())
            }
            _ => return text(StatusCode::NOT_FOUND, "no such action"),
        };
        page(
            StatusCode::OK,
            pages::layout("Done", Some(viewer), false, pages::done(&message, &back)),
        )
    }
}

/// What a job action did: queued, not run (a worker runs the job when one is free, and not
/// before dispatch resumes).
fn queued(action: &str, paused: bool) -> String {
    let when = if paused {
        "dispatch is paused: it runs after the resume"
    } else {
        "a worker starts it when one is free"
    };
    match action {
        "retry" => format!("Queued to run again from its stored body; {when}."),
        "run-now" => format!("Queued: the job is due now instead of after its backoff; {when}."),
        _ => "Cancelled: the job is dead and never runs.".to_owned(),
    }
}
