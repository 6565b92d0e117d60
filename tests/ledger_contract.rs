//! The ledger contract's conformance suite: every operation, through `Ledger`, on both backends
//! (PostgreSQL where SUME_TEST_POSTGRES_URL names a server). A backend passes when it behaves
//! as the contract says, whatever its SQL.
//!
//! One test binary; its tests are split by area (as River's `riverdrivertest` is), one file each
//! in `tests/ledger_contract/`, with the helpers they share here.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sume_receiver::job_id::JobId;
use sume_receiver::ledger::{
    self, Attempt, AttemptEnd, ClaimOutcome, Failure, LeasedAttempt, Leases, Ledger, MinuteRollup,
    NewClaim, PollResult, ProbeMove, Release, RetentionStep, RetryError, Source, State,
    StorageError,
};
use sume_receiver::route_name::RouteName;

fn new_claim(job_id: &str) -> NewClaim {
    NewClaim {
        job_id: JobId::parse(job_id).unwrap(),
        event_type: Some(ledger_event_type()),
        body: job_body(job_id).into(),
        source: Source::Webhook,
        trace_context: None,
        routing: ledger::Routing::default_route(),
    }
}

/// The default route: `[handler]`'s, and every job's from before routes.
fn default_route() -> RouteName {
    RouteName::default_route()
}

/// A job id the test knows to be valid.
fn id(text: &str) -> JobId {
    JobId::parse(text).unwrap()
}

fn ledger_event_type() -> sume_receiver::event_type::EventType {
    sume_receiver::event_type::EventType::parse("job.completed").unwrap()
}

/// A fresh service ledger; the directory lives as long as the test holds it.
async fn fresh() -> (tempfile::TempDir, Arc<Ledger>) {
    let dir = tempfile::tempdir().unwrap();
    let (_config, ledger) = open_ledger(dir.path()).await;
    (dir, ledger)
}

async fn claimed(ledger: &Ledger, job_id: &str) {
    assert_eq!(
        ledger.claim(new_claim(job_id)).await.unwrap(),
        ClaimOutcome::Claimed
    );
}

async fn started(ledger: &Ledger, job_id: &str, lease_expires_at: i64) -> Attempt {
    let job_id = JobId::parse(job_id).unwrap();
    ledger
        .start_attempt(
            &job_id,
            &default_route(),
            ledger::now_ms(),
            lease_expires_at,
        )
        .await
        .unwrap()
        .expect("the job was waiting to run")
}

async fn state_of(ledger: &Ledger, job_id: &str) -> Option<State> {
    let job = ledger.show_job(&id(job_id)).await.unwrap()?;
    Some(job.summary.state.parse().unwrap())
}

fn failed(retry_at: Option<i64>) -> AttemptEnd {
    AttemptEnd::Failed {
        failure: ledger::Failure {
            error: "exited with status 1".into(),
            exit_status: Some(1),
            http_status: None,
        },
        retry_at,
    }
}

#[path = "ledger_contract/attempts.rs"]
mod attempts;
#[path = "ledger_contract/claims.rs"]
mod claims;
#[path = "ledger_contract/console.rs"]
mod console;
#[path = "ledger_contract/expectations.rs"]
mod expectations;
#[path = "ledger_contract/hold.rs"]
mod hold;
#[path = "ledger_contract/operator.rs"]
mod operator;
#[path = "ledger_contract/retention.rs"]
mod retention;
#[path = "ledger_contract/routes.rs"]
mod routes;
