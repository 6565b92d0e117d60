//! The operators' actions on a job and on dispatch, written once for the console, the API and the CLI.
//!
//! The console's buttons (`console/act.rs`), the admin API (`admin.rs`) and the command line's
//! `jobs` verbs (the binary's `cli/jobs/`) are three doors to the same actions: each takes its
//! request apart and answers in its own form (a page, JSON, a line), and all call these for the
//! checks, the ledger's change, the wake-up of the local worker and the log line, so they can
//! never disagree on what an action does or refuses.

use std::time::Duration;

use hyper::StatusCode;

use crate::job_id::JobId;
use crate::ledger::{
    duration_ms, now_ms, Actor, GroupRetry, Ledger, RetryError, StorageError, GROUP_RETRY_BATCH,
};
use crate::logging::Escaped;
use crate::route_name::RouteName;
use crate::traces::{Kind, Parent, Span, Tracer};
use crate::worker::Queues;

/// A reason (a cancel's, a pause's) is at most this many characters: it is kept in the ledger
/// and shown on every page of the jobs it concerns.
pub const MAX_REASON_CHARS: usize = 500;

/// An action on one job, as its path segment names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    /// Runs a `done` or `dead` job again from its stored body.
    Retry,
    /// Skips the rest of a retrying job's backoff.
    RunNow,
    /// Makes a waiting job `dead` without running it (needs a reason).
    Cancel,
}

impl JobAction {
    /// `retry`, `run-now` or `cancel`.
    pub fn from_segment(segment: &str) -> Option<JobAction> {
        match segment {
            "retry" => Some(JobAction::Retry),
            "run-now" => Some(JobAction::RunNow),
            "cancel" => Some(JobAction::Cancel),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobAction::Retry => "retry",
            JobAction::RunNow => "run-now",
            JobAction::Cancel => "cancel",
        }
    }
}

/// Why an action changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("no such job in the ledger")]
    Unknown,
    #[error("the job is {state}; {action} applies to {applies_to}")]
    NotApplicable {
        state: String,
        action: &'static str,
        applies_to: &'static str,
    },
    /// A retry's own refusal: the job is not finished, or its body was purged.
    #[error(transparent)]
    Retry(RetryError),
    #[error("a cancel needs a reason")]
    NoReason,
    #[error("a reason is at most {MAX_REASON_CHARS} characters")]
    ReasonTooLong,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl Refused {
    /// The HTTP status either door answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Refused::Unknown => StatusCode::NOT_FOUND,
            Refused::NotApplicable { .. } | Refused::Retry(_) => StatusCode::CONFLICT,
            Refused::NoReason | Refused::ReasonTooLong => StatusCode::BAD_REQUEST,
            Refused::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The ledger the actions change, and the local worker to wake (none without a handler, and
/// none from the command line: the service's worker finds the change on its next look).
pub struct Actions<'a> {
    pub ledger: &'a Ledger,
    pub queue: Option<&'a Queues>,
    /// A span of each action the service takes, with its actor.
    pub tracer: &'a Tracer,
}

impl Actions<'_> {
    /// `action` on `job_id`'s work on `route`, or on all its routes (`None`), recorded as
    /// `actor`'s (a cancel with the actor's reason).
    pub async fn on_job(
        &self,
        action: JobAction,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
    ) -> Result<(), Refused> {
        let mut span = self.span(action.as_str(), &actor.by);
        span.set("sume.job_id", job_id.as_str());
        if let Some(route) = route {
            span.set("sume.route", route.as_str());
        }
        let done = match action {
            JobAction::Retry => self.retry(job_id, route, actor).await,
            JobAction::RunNow => self.run_now(job_id, route, actor).await,
            JobAction::Cancel => self.cancel(job_id, route, actor).await,
        };
        if let Err(refused) = &done {
            span.fail("refused", || refused.to_string());
        }
        done
    }

    /// The span of an operator's `action` (a trace of its own), with who took it.
    fn span(&self, action: &'static str, by: &str) -> Span {
        let mut span = self.tracer.start(action, Kind::Internal, Parent::Root);
        span.set("sume.action", action);
        span.set("sume.actor", by);
        span
    }

    /// Makes a `done` or `dead` job (or its work on `route`) due again with a fresh set of
    /// attempts.
    pub async fn retry(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
    ) -> Result<(), Refused> {
        match self.ledger.retry_job(job_id, route, actor, now_ms()).await {
            Ok(()) => {
                self.done(JobAction::Retry, job_id, actor);
                Ok(())
            }
            Err(RetryError::Storage(error)) => Err(Refused::Storage(error)),
            Err(RetryError::Unknown(_)) => Err(Refused::Unknown),
            Err(refused) => Err(Refused::Retry(refused)),
        }
    }

    /// Makes a job waiting in backoff due now.
    pub async fn run_now(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
    ) -> Result<(), Refused> {
        let changed = self.ledger.run_now(job_id, route, actor, now_ms()).await?;
        self.changed(changed, JobAction::RunNow, job_id, actor, "a retrying job")
            .await
    }

    /// Makes a waiting job `dead` without running it; the actor's reason must say something.
    pub async fn cancel(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
    ) -> Result<(), Refused> {
        let reason = said(actor.reason())?.ok_or(Refused::NoReason)?;
        let actor = Actor::because(&actor.by, Some(reason));
        let changed = self
            .ledger
            .cancel_job(job_id, route, &actor, now_ms())
            .await?;
        self.changed(
            changed,
            JobAction::Cancel,
            job_id,
            &actor,
            "a claimed or retrying job",
        )
        .await
    }

    /// Pauses (with the actor's reason, if any) or resumes dispatch on every receiver; `false`
    /// if it already was.
    pub async fn set_dispatch(&self, paused: bool, actor: &Actor) -> Result<bool, Refused> {
        let mut span = self.span(if paused { "pause" } else { "resume" }, &actor.by);
        let reason = said(actor.reason())?.filter(|_| paused);
        let actor = Actor::because(&actor.by, reason);
        let changed = self.ledger.set_dispatch(paused, &actor, now_ms()).await?;
        if let Some(queue) = self.queue {
            queue.dispatch_changed(paused);
        }
        span.set("sume.changed", changed);
        let by = &actor.by;
        tracing::info!(%by, paused, changed, "dispatch changed by an operator");
        Ok(changed)
    }

    /// Pauses or resumes one route's work on every receiver (a resume also ends its hold);
    /// `false` if it already was.
    pub async fn set_route_dispatch(
        &self,
        route: &RouteName,
        paused: bool,
        actor: &Actor,
    ) -> Result<bool, Refused> {
        let mut span = self.span(if paused { "pause" } else { "resume" }, &actor.by);
        span.set("sume.route", route.as_str());
        let reason = said(actor.reason())?.filter(|_| paused);
        let actor = Actor::because(&actor.by, reason);
        let changed = self
            .ledger
            .set_route_dispatch(route, paused, &actor, now_ms())
            .await?;
        span.set("sume.changed", changed);
        if let Some(queue) = self.queue {
            queue.route_dispatch_changed(route.as_str(), paused);
        }
        let by = &actor.by;
        tracing::info!(%by, %route, paused, changed, "a route's dispatch changed by an operator");
        Ok(changed)
    }

    /// Registers `job_id` as expected, first polled `reconcile_after` from now; `true` if new
    /// (twice is harmless).
    pub async fn expect(
        &self,
        job_id: &JobId,
        reconcile_after: Duration,
    ) -> Result<bool, StorageError> {
        let now = now_ms();
        let first_poll = now + duration_ms(reconcile_after);
        let registered = self.ledger.expect_job(job_id, now, first_poll).await?;
        tracing::info!(job_id = %job_id, registered, "expected job registered");
        Ok(registered)
    }

    /// Retries the next [`GROUP_RETRY_BATCH`] dead jobs of the dead-letter group `signature`,
    /// as `actor`'s action; the batch says how many are left for the next call.
    pub async fn retry_dead_group(
        &self,
        signature: &str,
        actor: &Actor,
    ) -> Result<GroupRetry, StorageError> {
        let mut span = self.span("retry-group", &actor.by);
        let batch = self
            .ledger
            .retry_dead_group(signature, actor, now_ms(), GROUP_RETRY_BATCH)
            .await?;
        span.set("sume.retried", batch.retried as i64);
        let by = &actor.by;
        if let Some(queue) = self.queue {
            queue.look_in_ledger();
        }
        tracing::info!(retried = batch.retried, refused = batch.refused, left = batch.left, %by, signature = %Escaped(signature), "dead-letter group retried by an operator");
        Ok(batch)
    }

    /// `Ok` if the ledger changed; else why not, from the job's row.
    async fn changed(
        &self,
        changed: bool,
        action: JobAction,
        job_id: &JobId,
        actor: &Actor,
        applies_to: &'static str,
    ) -> Result<(), Refused> {
        if changed {
            self.done(action, job_id, actor);
            return Ok(());
        }
        match self.ledger.show_job(job_id).await? {
            None => Err(Refused::Unknown),
            Some(job) => Err(Refused::NotApplicable {
                state: job.summary.state,
                action: action.as_str(),
                applies_to,
            }),
        }
    }

    /// The job may be due now: the local worker looks, without waiting for its next look.
    fn done(&self, action: JobAction, job_id: &JobId, actor: &Actor) {
        if let Some(queue) = self.queue {
            queue.look_in_ledger();
        }
        let by = &actor.by;
        tracing::info!(job_id = %job_id, action = action.as_str(), %by, "job action by an operator");
    }
}

/// A reason that says something; `None` for none or a blank one; refused past
/// [`MAX_REASON_CHARS`].
fn said(reason: Option<&str>) -> Result<Option<&str>, Refused> {
    match reason.filter(|reason| !reason.trim().is_empty()) {
        Some(reason) if reason.chars().count() > MAX_REASON_CHARS => Err(Refused::ReasonTooLong),
        said => Ok(said),
    }
}
