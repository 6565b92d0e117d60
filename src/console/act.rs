//! The console's actions: a form posted by an operator, and the page saying what happened.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::http::{decode, form_value, page, text, unavailable};
use super::pages::{self, Viewer};
use super::verdict::plural;
use super::Console;
use crate::actions::{Actions, JobAction, Refused};
use crate::ledger::{Actor, GROUP_RETRY_BATCH};

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
        let actions = Actions {
            ledger: &self.ledger,
            queue: Some(&self.queue),
            tracer: &self.tracer,
        };
        let reason = form_value(form, "reason");
        let job_action = match segments.as_slice() {
            ["jobs", _, action] => JobAction::from_segment(action),
            _ => None,
        };
        let (message, back) = match (segments.as_slice(), job_action) {
            (["dispatch", change @ ("pause" | "resume")], _) => {
                let paused = *change == "pause";
                match actions
                    .set_dispatch(paused, &Actor::because(by, reason.as_deref()))
                    .await
                {
                    Ok(_) => (
                        if paused {
                            "Dispatch paused: deliveries are claimed, no job runs."
                        } else {
                            "Dispatch resumed."
                        }
                        .to_owned(),
                        "/console/".to_owned(),
                    ),
                    Err(Refused::Storage(error)) => return unavailable(&error),
                    Err(refused) => return text(refused.status(), &refused.to_string()),
                }
            }
            (["jobs", id, _], Some(action)) => {
                let job_id = match decode(id) {
                    Ok(job_id) => job_id,
                    Err(response) => return *response,
                };
                match actions
                    .on_job(
                        action,
                        &job_id,
                        None,
                        &Actor::because(by, reason.as_deref()),
                    )
                    .await
                {
                    Ok(()) => {
                        let paused = self.ledger.dispatch().await.is_ok_and(|d| d.paused);
                        (queued(action, paused), pages::job_href(job_id.as_str()))
                    }
                    Err(Refused::Storage(error)) => return unavailable(&error),
                    Err(refused) => return text(refused.status(), &refused.to_string()),
                }
            }
            (["dead", "retry"], _) => {
                let signature = form_value(form, "signature").unwrap_or_default();
                let batch = match actions.retry_dead_group(&signature, &Actor::new(by)).await {
                    Ok(batch) => batch,
                    Err(error) => return unavailable(&error),
                };
                self.groups.forget().await;
                let mut message = format!(
                    "{} of the group \"{signature}\" {} queued to run again.",
                    plural(batch.retried as u64, "job", "jobs"),
                    if batch.retried == 1 { "is" } else { "are" }
                );
                if batch.refused > 0 {
                    message.push_str(&format!(
                        " {} could not be: retention purged their body, or they left the group.",
                        batch.refused
                    ));
                }
                if batch.left > 0 {
                    message.push_str(&format!(
                        " {} more are left (a retry takes at most {GROUP_RETRY_BATCH} at a \
                         time): retry the group again for the next ones.",
                        batch.left
                    ));
                }
                (message, "/console/dead".to_owned())
            }
            _ => return text(StatusCode::NOT_FOUND, "no such action"),
        };
        page(
            StatusCode::OK,
            pages::layout("Done", Some(&viewer), false, pages::done(&message, &back)),
        )
    }
}

/// What a job action did: queued, not run (a worker runs the job when one is free, and not
/// before dispatch resumes).
fn queued(action: JobAction, paused: bool) -> String {
    let when = if paused {
        "dispatch is paused: it runs after the resume"
    } else {
        "a worker starts it when one is free"
    };
    match action {
        JobAction::Retry => format!("Queued to run again from its stored body; {when}."),
        JobAction::RunNow => {
            format!("Queued: the job is due now instead of after its backoff; {when}.")
        }
        JobAction::Cancel => "Cancelled: the job is dead and never runs.".to_owned(),
    }
}
