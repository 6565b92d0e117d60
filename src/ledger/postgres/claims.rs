//! Claims on PostgreSQL: batched into one multi-row `INSERT` per commit, answered after it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::connection::{statement_error, StandbyWarnings};
use super::pooled::{run_on, Pooled, Rerun, RunError};
use super::sql;
use crate::event_type::EventType;
use crate::ledger::error::{Cause, StorageError};
use crate::ledger::model::now_ms;
use crate::ledger::model::{ClaimOutcome, NewClaim};
use crate::throttle::Throttled;

/// A claim for the batcher, or (`None`) the watchdog's probe, answered with the next batch.
pub(super) type ClaimRequest = (
    Option<NewClaim>,
    oneshot::Sender<Result<ClaimOutcome, StorageError>>,
);

/// Claim batches committing at once: while one waits for its commit the next fills up, and a
/// round trip to a remote server overlaps another batch's. More only split the same claims into
/// smaller batches competing for the server's CPU: on the 2-vCPU development VM (server on the
/// same machine) 1 / 2 / 4 / 8 in flight gave 27.1k / 24.4k / 21.0k / 15.9k deliveries/s on
/// the full path and 38.8k / 46.0k / 33.6k / 23.3k claims/s alone (C = 64).
const CLAIM_BATCHES_IN_FLIGHT: usize = 2;
/// After a failed commit, how often the database is probed until it answers again (readiness).
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a probe on request may take before the ledger counts as not ready: a claim that
/// waited longer would find Sume's request timed out.
const PROBE_PATIENCE: Duration = Duration::from_secs(2);

/// Whether the last claim batch (or probe) went through, and the batcher's wake-up when one
/// fails: the batcher then probes every [`PROBE_INTERVAL`] until one goes through, with no
/// claim needed.
#[derive(Default)]
pub(super) struct CommitHealth {
    failed: AtomicBool,
    failure: Notify,
    /// When readiness was last proved on request (ms since the epoch): once a second at most.
    asked_at: AtomicI64,
}

impl CommitHealth {
    /// Proves readiness on request (`/readyz`, a scrape), once a [`PROBE_INTERVAL`] at most,
    /// with the watchdog's probe through the batcher: a stopped or unreachable server is then
    /// not ready with no claim to fail, and an idle receiver nobody asks probes nothing.
    pub(super) async fn prove(&self, claims: &mpsc::Sender<ClaimRequest>) {
        let now = now_ms();
        let asked_at = self.asked_at.load(Ordering::Relaxed);
        let interval = PROBE_INTERVAL.as_millis() as i64;
        if now - asked_at < interval
            || self
                .asked_at
                .compare_exchange(asked_at, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return; // proved a moment ago, or being proved by another request
        }
        // The batch records its own outcome; one that does not end in time is a failure too.
        if tokio::time::timeout(PROBE_PATIENCE, through_batcher(claims, None))
            .await
            .is_err()
        {
            self.record(false);
        }
    }

    pub(super) fn is_ok(&self) -> bool {
        !self.failed.load(Ordering::Relaxed)
    }

    pub(super) fn record(&self, ok: bool) {
        self.failed.store(!ok, Ordering::Relaxed);
        if !ok {
            // A stored permit: the batcher wakes even if it is not waiting yet.
            self.failure.notify_one();
        }
    }
}

/// Queues a claim (or the probe) for the batcher and waits for its batch; refused at once when
/// the queue is full.
pub(super) async fn through_batcher(
    claims: &mpsc::Sender<ClaimRequest>,
    claim: Option<NewClaim>,
) -> Result<ClaimOutcome, StorageError> {
    let (reply, answer) = oneshot::channel();
    claims
        .try_send((claim, reply))
        .map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => StorageError::Overloaded,
            mpsc::error::TrySendError::Closed(_) => StorageError::Closed,
        })?;
    answer.await.map_err(|_| StorageError::Closed)?
}

/// Groups queued claims into batches and commits them; answers each claim after its batch.
pub(super) async fn run_batcher(
    pool: Pooled,
    warnings: StandbyWarnings,
    mut inbox: mpsc::Receiver<ClaimRequest>,
    max_batch: usize,
    stopping: CancellationToken,
    health: Arc<CommitHealth>,
) {
    let in_flight = Arc::new(Semaphore::new(CLAIM_BATCHES_IN_FLIGHT));
    let mut batches = JoinSet::new();
    let failures = Arc::new(Mutex::new(Throttled::new("claims failed")));
    loop {
        // The guard is read when the select starts: a batch that fails meanwhile (on its own
        // task) wakes the loop through `failure`, so that the next round probes.
        let first = tokio::select! {
            item = inbox.recv() => item,
            () = stopping.cancelled() => None,
            () = health.failure.notified() => continue,
            () = tokio::time::sleep(PROBE_INTERVAL), if !health.is_ok() => {
                probe(&pool, &health).await;
                continue;
            }
        };
        let Some(first) = first else { break };
        // Waiting for a free slot is when the next batch fills up.
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match inbox.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (pool, warnings, ok, failures) = (
            pool.clone(),
            warnings.clone(),
            health.clone(),
            failures.clone(),
        );
        batches.spawn(async move {
            commit_batch(&pool, &warnings, batch, &ok, &failures).await;
            drop(permit);
        });
        while batches.try_join_next().is_some() {}
    }
    // Stopping: everything queued before the stop still gets its answer.
    inbox.close();
    let mut rest = Vec::new();
    while let Ok(item) = inbox.try_recv() {
        rest.push(item);
    }
    while !rest.is_empty() {
        let batch: Vec<ClaimRequest> = rest.drain(..rest.len().min(max_batch.max(1))).collect();
        commit_batch(&pool, &warnings, batch, &health, &failures).await;
    }
    while batches.join_next().await.is_some() {}
    tracing::debug!("claim batcher stopped");
}

/// Once the database answers again, readiness says so (no claim may arrive while not ready).
async fn probe(pool: &Pooled, health: &CommitHealth) {
    if select_one(pool).await.is_ok() {
        tracing::info!("PostgreSQL answers again");
        health.record(true);
    }
}

async fn commit_batch(
    pool: &Pooled,
    warnings: &StandbyWarnings,
    batch: Vec<ClaimRequest>,
    health: &CommitHealth,
    failures: &Mutex<Throttled>,
) {
    let mut ordered: Vec<&NewClaim> = batch
        .iter()
        .filter_map(|(claim, _)| claim.as_ref())
        .collect();
    let size = ordered.len();
    ordered.sort_by(|a, b| a.job_id.as_str().cmp(b.job_id.as_str()));
    ordered.dedup_by(|a, b| a.job_id == b.job_id);
    let mut result = if ordered.is_empty() {
        // Probes only: a statement on a pooled connection, as a batch's.
        select_one(pool).await
    } else {
        insert_claims(pool, warnings, &ordered).await
    };
    // Claims PostgreSQL refused alone, with why.
    let mut refused = HashMap::new();
    if let (Err(ClaimsError::RowRefused(_)), true) = (&result, ordered.len() > 1) {
        // One row PostgreSQL would not take fails the statement: the others are claimed one
        // by one, so that only the bad one is refused.
        let mut claimed = HashSet::new();
        for claim in &ordered {
            match insert_claims(pool, warnings, std::slice::from_ref(claim)).await {
                Ok(new) => claimed.extend(new),
                Err(error) => {
                    refused.insert(claim.job_id.as_str().to_owned(), error.into_storage());
                }
            }
        }
        result = Ok(claimed);
    }
    let result = result.map_err(ClaimsError::into_storage);
    match &result {
        Ok(_) => {
            health.record(true);
            failures.lock().expect("not poisoned").recovered();
        }
        Err(error) => {
            health.record(false);
            failures
                .lock()
                .expect("not poisoned")
                .warn(&format!("{error} (batch of {size})"));
        }
    }
    if size > 0 {
        crate::metrics::METRICS.record_commit(size, result.is_ok());
    }
    // The first request for each new job_id is its claim; every other one a duplicate.
    let mut claimed = match result {
        Ok(claimed) => claimed,
        Err(error) => {
            for (_, reply) in batch {
                let _ = reply.send(Err(error.clone()));
            }
            return;
        }
    };
    for (claim, reply) in batch {
        let Some(claim) = claim else {
            // The probe: the batch went through.
            let _ = reply.send(Ok(ClaimOutcome::Duplicate));
            continue;
        };
        let outcome = if let Some(error) = refused.get(claim.job_id.as_str()) {
            Err(error.clone())
        } else if claimed.remove(claim.job_id.as_str()) {
            Ok(ClaimOutcome::Claimed)
        } else {
            Ok(ClaimOutcome::Duplicate)
        };
        let _ = reply.send(outcome);
    }
}

/// Why a batch of claims was not taken.
pub(super) enum ClaimsError {
    /// PostgreSQL refused a value of some row (a data exception or a constraint): the statement
    /// failed whole, and the rows may be tried alone.
    RowRefused(StorageError),
    Other(StorageError),
}

impl ClaimsError {
    pub(super) fn into_storage(self) -> StorageError {
        match self {
            ClaimsError::RowRefused(error) | ClaimsError::Other(error) => error,
        }
    }
}

impl From<StorageError> for ClaimsError {
    fn from(error: StorageError) -> Self {
        ClaimsError::Other(error)
    }
}

fn claims_error(error: RunError) -> ClaimsError {
    let error = match error {
        RunError::Statement(error) => error,
        other => return ClaimsError::Other(other.into_storage()),
    };
    let class = error.code().map(|code| &code.code()[..2]);
    let refused = matches!(class, Some("22" | "23"));
    let error = statement_error(error);
    if refused {
        ClaimsError::RowRefused(error)
    } else {
        ClaimsError::Other(error)
    }
}

async fn select_one(pool: &Pooled) -> Result<HashSet<String>, ClaimsError> {
    run_on!(pool, Rerun::Safe, |client| {
        client.simple_query("SELECT 1").await
    })
    .map_err(RunError::into_storage)?;
    Ok(HashSet::new())
}

/// Inserts the claims in one statement; returns the job_ids that were new. A wait for the
/// synchronous standby cancelled meanwhile (see [`StandbyWarnings`]) makes the outcome
/// unknown, although PostgreSQL reported success. Refused by a server that lost its role, the
/// batch is tried once more on a fresh connection; broken off mid-way, its outcome is unknown.
pub(super) async fn insert_claims(
    pool: &Pooled,
    warnings: &StandbyWarnings,
    claims: &[&NewClaim],
) -> Result<HashSet<String>, ClaimsError> {
    let job_ids: Vec<&str> = claims.iter().map(|c| c.job_id.as_str()).collect();
    let sources: Vec<&str> = claims.iter().map(|c| c.source.as_str()).collect();
    let event_types: Vec<Option<&str>> = claims
        .iter()
        .map(|c| c.event_type.as_ref().map(EventType::as_str))
        .collect();
    let bodies: Vec<&str> = claims.iter().map(|c| c.body.as_str()).collect();
    let (states, errors): (Vec<&str>, Vec<Option<&str>>) =
        claims.iter().map(|c| c.routing.claimed_state()).unzip();
    let (work_job_ids, work_routes): (Vec<&str>, Vec<&str>) = claims
        .iter()
        .flat_map(|c| {
            let job_id = c.job_id.as_str();
            c.routing
                .routes()
                .iter()
                .map(move |route| (job_id, route.as_str()))
        })
        .unzip();
    let trace_contexts: Vec<Option<&str>> =
        claims.iter().map(|c| c.trace_context.as_deref()).collect();
    let now = now_ms();
    let (rows, cancelled_wait) = run_on!(pool, Rerun::Unsafe, |client| {
        let statement = client.prepare_cached(sql::INSERT_CLAIMS_SQL).await?;
        let cancelled_waits = warnings.seen();
        let rows = client
            .query(
                &statement,
                &[
                    &job_ids,
                    &sources,
                    &event_types,
                    &bodies,
                    &now,
                    &states,
                    &errors,
                    &work_job_ids,
                    &work_routes,
                    &trace_contexts,
                ],
            )
            .await?;
        Ok((rows, warnings.seen() != cancelled_waits))
    })
    .map_err(claims_error)?;
    if cancelled_wait {
        return Err(StorageError::OutcomeUnknown(Cause::message(
            "PostgreSQL cancelled the wait for the synchronous standby: committed locally, \
             perhaps not replicated",
        ))
        .into());
    }
    Ok(rows.iter().filter_map(|row| row.get(0)).collect())
}
