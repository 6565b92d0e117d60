//! The PostgreSQL ledger: any number of receivers on one database, with the SQLite ledger's
//! guarantees.
//!
//! - Claims from concurrent deliveries are grouped: one multi-row `INSERT ... ON CONFLICT
//!   (job_id) DO NOTHING` per batch, in autocommit (one round trip, one commit), up to
//!   `CLAIM_BATCHES_IN_FLIGHT` batches at once on pooled connections. A delivery is answered
//!   only after its batch committed; an error, including a connection lost after the commit
//!   was sent (outcome unknown), is a 503 and never a 2xx. Rows are inserted in job_id order so
//!   that concurrent batches (from this receiver or another) cannot deadlock.
//! - A job starts on one receiver only: the start is a conditional `UPDATE` on a row taken with
//!   `FOR UPDATE SKIP LOCKED` (a receiver never waits for another's start), and the attempt
//!   number fences a receiver that lost its lease.
//! - Every claim batch sends `NOTIFY sume_jobs` with its commit; each receiver LISTENs on a
//!   connection of its own and wakes its worker, so work claimed anywhere starts promptly.
//! - No connection outlives its server's turn as the primary (`role.rs`): after a failover
//!   every path reconnects by itself, the LISTEN connection included.
//! - Lease take-back, retention and reconciliation polls are conditional updates or take their
//!   rows with `SKIP LOCKED`: each row is handled once however many receivers run them.
//! - Migrations run in one transaction under an advisory lock; a schema newer than this binary
//!   knows is refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio_postgres::types::ToSql;
use tokio_util::sync::CancellationToken;

mod claims;
mod connection;
mod expected;
mod hold;
mod open;
mod pooled;
mod role;
mod rollups;
mod sql;
mod start;
mod statements;

use super::contract::Backend;
use super::error::{Cause, StorageError};
use super::model::now_ms;
use super::model::{
    expectation_counts, state_counts, Attempt, AttemptEnd, ClaimOutcome, Cursor, Dispatch,
    DispatchStop, DueExpectation, DueJobs, Expectation, Hold, JobDetail, JobPage, JobStats,
    LeasedAttempt, Leases, NewClaim, PollResult, Release, RetentionStep, RetryCount, RetryError,
    RetryFilter, Source, State, HISTORY_PER_JOB, RECEIVER_ACTOR,
};
use super::params::{ActionTaken, Actor, ProbeMove};
use super::portable_sql::{self, Dialect};
use super::rollups::{delete_old_sql, MinuteRollup};
use super::work_side::WorkSide;
use crate::job_id::JobId;
use crate::metrics::Snapshot;
use crate::route_name::RouteName;
use claims::{insert_claims, through_batcher, ClaimRequest, ClaimsError, CommitHealth};
use connection::{StandbyWarnings, CHANNEL};
use pooled::Pooled;
use statements::{
    action_from_row, attempt_number, attempt_record_from_row, count_rows, summary_from_row,
};

/// Claims waiting for their batch; past it a delivery is refused at once (503).
const CLAIM_QUEUE_CAPACITY: usize = 1024;

/// The open PostgreSQL ledger of a running receiver.
pub struct PostgresLedger {
    /// The connections that claim and change jobs, checked writable.
    pool: Pooled,
    /// Read-only connections with a statement timeout, for the service's reads (the command
    /// line's reads share its one connection).
    readers: Pooled,
    /// The pool's count of warnings that make a claim's outcome unknown.
    warnings: StandbyWarnings,
    /// The claim batcher's queue; `None` on the command line, which claims in place.
    claims: Option<mpsc::Sender<ClaimRequest>>,
    /// The claim batcher and the LISTEN task; awaited at close.
    tasks: Mutex<Option<JoinSet<()>>>,
    stopping: CancellationToken,
    /// Whether the last claim batch or probe went through.
    health: Arc<CommitHealth>,
    /// Cancelled if the claim batcher died of a panic: nothing can be claimed any more.
    failed: CancellationToken,
    work_added: Arc<Notify>,
    /// Whether the changes other than claims go through; `None` on the command line.
    work_side: Option<WorkSide>,
    location: String,
    /// This receiver's name on its leases ([`PostgresConfig::receiver`](crate::config::PostgresConfig::receiver)).
    receiver: String,
}

impl Backend for PostgresLedger {
    async fn claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError> {
        let Some(claims) = &self.claims else {
            // The command line's ledger: a batch of one, in place; boxed, so that this rare
            // path's future does not size (and every delivery copy) the claim's.
            let job_id = claim.job_id.as_str().to_owned();
            let claimed = Box::pin(insert_claims(&self.pool, &self.warnings, &[&claim]))
                .await
                .map_err(ClaimsError::into_storage)?;
            return Ok(if claimed.contains(&job_id) {
                ClaimOutcome::Claimed
            } else {
                ClaimOutcome::Duplicate
            });
        };
        through_batcher(claims, Some(claim)).await
    }

    async fn start_attempt(
        &self,
        job_id: &JobId,
        route: &RouteName,
        now: i64,
        lease_expires_at: i64,
    ) -> Result<Option<Attempt>, StorageError> {
        let rows = self
            .query(
                sql::START_ATTEMPT_SQL,
                &[
                    &job_id.as_str(),
                    &lease_expires_at,
                    &now,
                    &self.receiver,
                    &(HISTORY_PER_JOB - 2),
                    &route.as_str(),
                ],
            )
            .await?;
        Ok(rows.first().map(|row| Attempt {
            job_id: job_id.clone(),
            route: route.clone(),
            number: row.get::<_, i32>(0).unsigned_abs(),
            event_type: row.get(1),
            source: Source::parse(row.get(2)),
            body: row.get(3),
            rows: None,
        }))
    }

    async fn finish_attempt(
        &self,
        attempt: &Attempt,
        end: &AttemptEnd,
        now: i64,
    ) -> Result<Option<State>, StorageError> {
        let (state, failure, retry_at) = end.outcome();
        let finished_at = state.is_finished().then_some(now);
        let changed = self
            .count(
                sql::FINISH_ATTEMPT_SQL,
                &[
                    &attempt.job_id.as_str(),
                    &attempt_number(attempt),
                    &state.as_str(),
                    &failure.map(|f| f.error.as_str()),
                    &retry_at,
                    &finished_at,
                    &now,
                    &end.history_outcome(),
                    &failure.and_then(|f| f.exit_status),
                    &failure.and_then(|f| f.http_status).map(i32::from),
                    &attempt.route.as_str(),
                ],
            )
            .await?;
        Ok((changed == 1).then_some(state))
    }

    async fn release_attempt(
        &self,
        attempt: &Attempt,
        release: &Release,
        now: i64,
    ) -> Result<bool, StorageError> {
        let why = release.recorded();
        let changed = self
            .count(
                sql::RELEASE_ATTEMPT_SQL,
                &[
                    &attempt.job_id.as_str(),
                    &attempt_number(attempt),
                    &now,
                    &release.next_cause(),
                    &why.error,
                    &why.exit_status,
                    &why.http_status.map(i32::from),
                    &attempt.route.as_str(),
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    /// At start, the leases held under this receiver's name; other receivers' leases wait
    /// for their expiry.
    async fn leases_to_take_back(
        &self,
        leases: Leases,
    ) -> Result<Vec<LeasedAttempt>, StorageError> {
        let rows = match leases {
            Leases::ExpiredBefore(cutoff) => {
                self.query(sql::EXPIRED_LEASES_SQL, &[&cutoff]).await?
            }
            Leases::HeldBeforeThisStart => {
                self.query(sql::OWN_LEASES_SQL, &[&self.receiver]).await?
            }
        };
        Ok(rows
            .iter()
            .map(|row| LeasedAttempt {
                job_id: row.get(0),
                route: row.get(1),
                number: row.get::<_, i32>(2).into(),
            })
            .collect())
    }

    async fn take_back_lease(
        &self,
        lease: &LeasedAttempt,
        cutoff: i64,
        now: i64,
        max_attempts: u32,
        error: &str,
    ) -> Result<Option<State>, StorageError> {
        let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
        let number = i32::try_from(lease.number).unwrap_or(i32::MAX);
        let rows = self
            .query(
                sql::TAKE_BACK_LEASE_SQL,
                &[
                    &lease.job_id,
                    &now,
                    &max_attempts,
                    &error,
                    &cutoff,
                    &number,
                    &lease.route,
                ],
            )
            .await?;
        Ok(rows
            .first()
            .map(|row| row.get::<_, &str>(0).parse().unwrap_or(State::Retrying)))
    }

    async fn due_jobs(
        &self,
        route: &RouteName,
        now: i64,
        limit: usize,
    ) -> Result<DueJobs, StorageError> {
        let route = route.as_str();
        let rows = self
            .query(sql::DUE_JOBS_SQL, &[&now, &(limit as i64), &route])
            .await?;
        let next_at = self.query(sql::NEXT_DUE_ON_ROUTE_SQL, &[&route]).await?;
        Ok(DueJobs::sort(
            rows.iter().map(|row| row.get(0)).collect(),
            next_at.first().and_then(|row| row.get(0)),
        ))
    }

    async fn give_up(&self, job_id: &str, error: &str, now: i64) -> Result<bool, StorageError> {
        let changed = self
            .count(
                sql::GIVE_UP_SQL,
                &[
                    &job_id,
                    &now,
                    &error,
                    &"give_up",
                    &RECEIVER_ACTOR,
                    &None::<&str>,
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn cancel_job(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        let job_id = job_id.as_str();
        let error = actor.cancelled();
        let route = route.map(RouteName::as_str);
        let changed = self
            .count(
                sql::GIVE_UP_SQL,
                &[&job_id, &now, &error, &"cancel", &actor.by, &route],
            )
            .await?;
        if changed == 1 {
            self.trim_actions(&[job_id]).await?;
        }
        Ok(changed == 1)
    }

    /// Resolves when a claim batch or `jobs retry` notified the channel (any receiver's).
    async fn work_added_elsewhere(&self) {
        self.work_added.notified().await
    }

    async fn retention_step(
        &self,
        step: RetentionStep,
        before: i64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        let statement: std::borrow::Cow<str> = match step {
            RetentionStep::PurgeBodies => sql::PURGE_BODIES_SQL.into(),
            RetentionStep::DeleteFinished => sql::DELETE_FINISHED_SQL.into(),
            RetentionStep::DeleteEndedStops => sql::DELETE_ENDED_STOPS_SQL.into(),
            RetentionStep::DeleteResolvedExpectations => sql::DELETE_RESOLVED_SQL.into(),
            RetentionStep::DeleteOldRollups => delete_old_sql(Dialect::Postgres).into(),
        };
        self.execute(&statement, &[&before, &(limit as i64)]).await
    }

    async fn store_rollup(&self, rollup: &MinuteRollup) -> Result<(), StorageError> {
        self.upsert_rollup(rollup).await
    }

    async fn rollups_since(
        &self,
        minute: i64,
        limit: usize,
    ) -> Result<Vec<MinuteRollup>, StorageError> {
        self.read_rollups(minute, limit).await
    }

    async fn expect_job(
        &self,
        job_id: &JobId,
        now: i64,
        first_poll_at: i64,
    ) -> Result<bool, StorageError> {
        let inserted = self
            .execute(
                sql::EXPECT_JOB_SQL,
                &[&job_id.as_str(), &now, &first_poll_at],
            )
            .await?;
        Ok(inserted == 1)
    }

    /// Takes due expectations and moves their next poll `lease` ahead, so that no other
    /// receiver polls them meanwhile (and one does, if this receiver dies before recording).
    async fn due_expectations(
        &self,
        now: i64,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DueExpectation>, StorageError> {
        expected::due_expectations(self, now, limit, lease).await
    }

    async fn record_poll(
        &self,
        job_id: &str,
        result: &PollResult,
        now: i64,
    ) -> Result<(), StorageError> {
        expected::record_poll(self, job_id, result, now).await
    }

    async fn list_expectations(&self, limit: usize) -> Result<Vec<Expectation>, StorageError> {
        expected::list_expectations(self, limit).await
    }

    async fn resolve_arrived(&self, now: i64) -> Result<usize, StorageError> {
        self.execute(sql::RESOLVE_ARRIVED_SQL, &[&now]).await
    }

    async fn metrics_snapshot(&self) -> Result<Snapshot, StorageError> {
        let counts = self.read(portable_sql::JOB_COUNTS_SQL, &[]).await?;
        let oldest = self.read(portable_sql::OLDEST_UNFINISHED_SQL, &[]).await?;
        let work = self.read(portable_sql::WORK_BY_ROUTE_SQL, &[]).await?;
        let expected = self.read(sql::COUNT_EXPECTATIONS_SQL, &[]).await?;
        let size = self
            .read("SELECT pg_database_size(current_database())", &[])
            .await?;
        let oldest: Option<i64> = oldest.first().and_then(|row| row.get(0));
        Ok(Snapshot {
            jobs: state_counts(count_rows(&counts))
                .into_iter()
                .map(|(state, count)| (state.as_str(), count))
                .collect(),
            oldest_unfinished_age_seconds: oldest
                .map_or(0.0, |at| (now_ms() - at).max(0) as f64 / 1000.0),
            expected: expectation_counts(count_rows(&expected)),
            ledger_bytes: size
                .first()
                .map_or(0, |row| row.get::<_, i64>(0).unsigned_abs()),
            wal_bytes: None,
            claim_queue_depth: self.claim_queue_depth() as u64,
            work: work
                .iter()
                .map(|row| {
                    let count = |i| row.get::<_, i64>(i).unsigned_abs();
                    (row.get(0), count(1), count(2))
                })
                .collect(),
        })
    }

    async fn fold_counts(&self) -> Result<(), StorageError> {
        self.execute(sql::FOLD_COUNTS_SQL, &[]).await.map(drop)
    }

    async fn prove_readiness(&self) {
        if let Some(claims) = &self.claims {
            self.health.prove(claims).await;
        }
    }

    /// On the readers' pool: a server that turned read-only still answers it.
    async fn next_due_at(&self) -> Result<Option<i64>, StorageError> {
        let rows = self.read(sql::NEXT_DUE_SQL, &[]).await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    /// Through the claim batcher, so that a wedged batcher fails the probe too.
    async fn probe(&self) -> Result<(), StorageError> {
        match &self.claims {
            Some(claims) => through_batcher(claims, None).await.map(drop),
            None => self.query("SELECT 1", &[]).await.map(drop),
        }
    }

    async fn failed(&self) {
        self.failed.cancelled().await
    }

    /// Commits every claim queued before this call, then stops the batcher and the listener.
    async fn close(&self) {
        self.stopping.cancel();
        let tasks = self.tasks.lock().expect("not poisoned").take();
        if let Some(mut tasks) = tasks {
            while tasks.join_next().await.is_some() {}
        }
        self.pool.close();
        self.readers.close();
    }

    async fn list_jobs(
        &self,
        state: Option<State>,
        after: Option<&Cursor>,
        since: Option<i64>,
        limit: usize,
    ) -> Result<JobPage, StorageError> {
        let sql = portable_sql::list_jobs_sql(
            state,
            after.is_some(),
            since.is_some(),
            portable_sql::Dialect::Postgres,
        );
        let limit_param = limit as i64;
        let mut values: Vec<&(dyn ToSql + Sync)> = vec![&limit_param];
        if let Some(cursor) = after {
            values.push(&cursor.at);
            values.push(&cursor.job_id);
        }
        if let Some(since) = &since {
            values.push(since);
        }
        let rows = self.read(&sql, &values).await?;
        let rows = rows
            .iter()
            .map(|row| {
                // After the summary's nine columns; a row edited by hand may lack it.
                let at: Option<i64> = row.get(9);
                (at.unwrap_or(i64::MIN), summary_from_row(row))
            })
            .collect();
        Ok(JobPage::from_rows(rows, limit))
    }

    async fn jobs_on_route(
        &self,
        route: &RouteName,
        job_ids: &[String],
    ) -> Result<Vec<String>, StorageError> {
        let rows = self
            .read(
                "SELECT job_id FROM job_routes WHERE route = $1 AND job_id = ANY($2)",
                &[&route.as_str(), &job_ids],
            )
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    async fn show_job(&self, job_id: &JobId) -> Result<Option<JobDetail>, StorageError> {
        let job_id = job_id.as_str();
        let rows = self.read(sql::SHOW_JOB_SQL, &[&job_id]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let history = self.read(sql::ATTEMPTS_OF_JOB_SQL, &[&job_id]).await?;
        let actions = self.read(sql::ACTIONS_OF_JOB_SQL, &[&job_id]).await?;
        Ok(Some(JobDetail {
            summary: summary_from_row(row),
            lease_expires_at: row.get(9),
            updated_at: row.get(10),
            body: row.get(11),
            body_purged_at: row.get(12),
            next_attempt_cause: row.get(13),
            duplicates: row.get::<_, i32>(14).unsigned_abs(),
            last_duplicate_at: row.get(15),
            history: history.iter().map(attempt_record_from_row).collect(),
            actions: actions.iter().map(action_from_row).collect(),
        }))
    }

    async fn trace_context(&self, job_id: &JobId) -> Result<Option<String>, StorageError> {
        let job_id = job_id.as_str();
        let rows = self.read(sql::TRACE_CONTEXT_SQL, &[&job_id]).await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    async fn retry_job(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
        now: i64,
    ) -> Result<(), RetryError> {
        let job_id = job_id.as_str();
        let route = route.map(RouteName::as_str);
        let params: [&(dyn ToSql + Sync); 5] = [&job_id, &now, &actor.by, &actor.reason, &route];
        if self.count(sql::RETRY_JOB_SQL, &params).await? == 1 {
            self.trim_actions(&[job_id]).await?;
            self.execute(&format!("NOTIFY {CHANNEL}"), &[]).await?;
            return Ok(());
        }
        let found = self
            .query(sql::RETRY_REFUSAL_SQL, &[&job_id, &route])
            .await?;
        Err(RetryError::refusal(
            job_id,
            found.first().map(|row| (row.get(0), row.get(1))),
        ))
    }

    async fn retry_matching(
        &self,
        filter: &RetryFilter,
        actor: &Actor,
        now: i64,
        limit: usize,
    ) -> Result<usize, StorageError> {
        let rows = self
            .query(
                sql::RETRY_MATCHING_SQL,
                &[
                    &filter.state.as_str(),
                    &filter.finished_since.unwrap_or(i64::MIN),
                    &filter.finished_before,
                    &filter.error_contains,
                    &(limit as i64),
                    &now,
                    &actor.by,
                    &actor.reason,
                ],
            )
            .await?;
        let job_ids: Vec<&str> = rows.iter().map(|row| row.get(0)).collect();
        if !job_ids.is_empty() {
            self.trim_actions(&job_ids).await?;
            self.execute(&format!("NOTIFY {CHANNEL}"), &[]).await?;
        }
        Ok(job_ids.len())
    }

    async fn count_retry_matching(&self, filter: &RetryFilter) -> Result<RetryCount, StorageError> {
        let rows = self
            .read(
                sql::COUNT_RETRY_MATCHING_SQL,
                &[
                    &filter.state.as_str(),
                    &filter.finished_since.unwrap_or(i64::MIN),
                    &filter.finished_before,
                    &filter.error_contains,
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StorageError::Unavailable(Cause::message("count returned no row")))?;
        Ok(RetryCount {
            retryable: row.get::<_, i64>(0).unsigned_abs(),
            body_purged: row.get::<_, i64>(1).unsigned_abs(),
        })
    }

    async fn run_now(
        &self,
        job_id: &JobId,
        route: Option<&RouteName>,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        let job_id = job_id.as_str();
        let route = route.map(RouteName::as_str);
        let params: [&(dyn ToSql + Sync); 5] = [&job_id, &now, &actor.by, &actor.reason, &route];
        if self.count(sql::RUN_NOW_SQL, &params).await? == 1 {
            self.trim_actions(&[job_id]).await?;
            self.execute(&format!("NOTIFY {CHANNEL}"), &[]).await?;
            return Ok(true);
        }
        Ok(false)
    }

    async fn record_duplicates(&self, seen: &[(JobId, u32, i64)]) -> Result<(), StorageError> {
        let job_ids: Vec<&str> = seen.iter().map(|(job_id, _, _)| job_id.as_str()).collect();
        let counts: Vec<i32> = seen
            .iter()
            .map(|(_, count, _)| i32::try_from(*count).unwrap_or(i32::MAX))
            .collect();
        let lasts: Vec<i64> = seen.iter().map(|(_, _, last)| *last).collect();
        self.execute(sql::RECORD_DUPLICATES_SQL, &[&job_ids, &counts, &lasts])
            .await
            .map(drop)
    }

    async fn record_action(
        &self,
        job_id: &JobId,
        taken: ActionTaken<'_>,
        now: i64,
    ) -> Result<bool, StorageError> {
        let job_id = job_id.as_str();
        let ActionTaken { action, actor } = taken;
        let recorded = self
            .count(
                sql::RECORD_ACTION_SQL,
                &[&job_id, &now, &action, &actor.by, &actor.reason],
            )
            .await?
            == 1;
        if recorded {
            self.trim_actions(&[job_id]).await?;
        }
        Ok(recorded)
    }

    async fn running_by_receiver(&self) -> Result<Vec<(String, u64)>, StorageError> {
        let rows = self.read(sql::RUNNING_BY_RECEIVER_SQL, &[]).await?;
        Ok(rows
            .iter()
            .map(|row| (row.get(0), row.get::<_, i64>(1).unsigned_abs()))
            .collect())
    }

    async fn dispatch(&self) -> Result<Dispatch, StorageError> {
        hold::dispatch(self).await
    }

    async fn set_dispatch(
        &self,
        paused: bool,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        hold::set_dispatch(self, paused, actor, now).await
    }

    async fn route_dispatch(&self, route: &RouteName) -> Result<Dispatch, StorageError> {
        hold::route_dispatch(self, route).await
    }

    async fn set_route_dispatch(
        &self,
        route: &RouteName,
        paused: bool,
        actor: &Actor,
        now: i64,
    ) -> Result<bool, StorageError> {
        hold::set_route_dispatch(self, route, paused, actor, now).await
    }

    async fn hold(&self, route: &RouteName) -> Result<Option<Hold>, StorageError> {
        hold::hold(self, route).await
    }

    async fn holds(&self) -> Result<Vec<Hold>, StorageError> {
        hold::holds(self).await
    }

    async fn open_hold(&self, opened: &Hold) -> Result<bool, StorageError> {
        hold::open_hold(self, opened).await
    }

    async fn move_probe(&self, moved: &ProbeMove) -> Result<bool, StorageError> {
        hold::move_probe(self, moved).await
    }

    async fn end_hold(
        &self,
        route: &RouteName,
        since: i64,
        now: i64,
    ) -> Result<Option<Hold>, StorageError> {
        hold::end_hold(self, route, since, now).await
    }

    async fn dispatch_stops(
        &self,
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Vec<DispatchStop>, StorageError> {
        hold::dispatch_stops(self, from, to, limit).await
    }

    async fn job_stats(&self, now: i64) -> Result<JobStats, StorageError> {
        let by_state = self.read(portable_sql::JOB_COUNTS_SQL, &[]).await?;
        let (hour_ago, day_ago) = JobStats::since(now);
        let stats_sql = portable_sql::stats_sql(portable_sql::Dialect::Postgres);
        let counts = self.read(&stats_sql, &[&hour_ago, &day_ago]).await?;
        let row = counts
            .first()
            .ok_or_else(|| StorageError::Unavailable(Cause::message("stats returned no row")))?;
        Ok(JobStats::from_counts(
            count_rows(&by_state),
            (row.get(0), row.get(1), row.get(2)),
        ))
    }

    #[cfg(feature = "bench")]
    async fn job_ids_like(&self, pattern: &str) -> Result<Vec<String>, StorageError> {
        let rows = self.read(sql::JOB_IDS_LIKE_SQL, &[&pattern]).await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn work_side(&self) -> Option<WorkSide> {
        self.work_side.clone()
    }

    fn claim_queue_depth(&self) -> usize {
        self.claims
            .as_ref()
            .map_or(0, |claims| CLAIM_QUEUE_CAPACITY - claims.capacity())
    }

    fn readiness(&self) -> Result<(), &'static str> {
        if self.failed.is_cancelled() {
            return Err("the ledger's claim batcher has stopped");
        }
        if !self.health.is_ok() {
            return Err("PostgreSQL did not take the last claims (probed every second)");
        }
        if self.claim_queue_depth() * 10 >= CLAIM_QUEUE_CAPACITY * 9 {
            return Err("the ledger's claim queue is nearly full");
        }
        Ok(())
    }
}
