//! The PostgreSQL ledger's statements, in its dialect (`$N` parameters, `SKIP LOCKED`).

pub const EXPIRED_LEASES_SQL: &str = "SELECT job_id, attempts FROM jobs
         WHERE state = 'running' AND lease_expires_at <= $1";
pub const DUE_JOBS_SQL: &str = "SELECT job_id FROM jobs
         WHERE state IN ('claimed', 'retrying') AND next_attempt_at <= $1
         ORDER BY next_attempt_at LIMIT $2";
pub const NEXT_DUE_SQL: &str = "SELECT min(next_attempt_at) FROM jobs
         WHERE state IN ('claimed', 'retrying')";
/// Parameters: job_id, attempt number, state, error, retry at, finished at, now.
pub const FINISH_ATTEMPT_SQL: &str =
    "UPDATE jobs SET state = $3, last_error = coalesce($4, last_error),
                     next_attempt_at = $5, finished_at = $6, lease_expires_at = NULL,
                     updated_at = $7
     WHERE job_id = $1 AND attempts = $2 AND state = 'running'";
/// Parameters: job_id, attempt number, now.
pub const RELEASE_ATTEMPT_SQL: &str =
    "UPDATE jobs SET state = CASE WHEN attempts > 1 THEN 'retrying' ELSE 'claimed' END,
                     attempts = attempts - 1, next_attempt_at = $3,
                     lease_expires_at = NULL, updated_at = $3
     WHERE job_id = $1 AND attempts = $2 AND state = 'running'";
/// Parameters: job_id, now, max_attempts, error, cutoff, attempt number. The lease and
/// the attempt are checked again: another receiver may have taken it back, and started a new
/// attempt, since it was read. The casts tell PostgreSQL the type a `CASE` alone leaves open.
pub const TAKE_BACK_LEASE_SQL: &str = "UPDATE jobs SET
             state = CASE WHEN attempts >= $3 THEN 'dead' ELSE 'retrying' END,
             next_attempt_at = CASE WHEN attempts >= $3 THEN NULL ELSE CAST($2 AS BIGINT) END,
             finished_at = CASE WHEN attempts >= $3 THEN CAST($2 AS BIGINT) ELSE NULL END,
             lease_expires_at = NULL, last_error = $4, updated_at = $2
         WHERE job_id = $1 AND state = 'running' AND lease_expires_at <= $5 AND attempts = $6
         RETURNING state";
/// Parameters: job_id, now, error.
pub const GIVE_UP_SQL: &str =
    "UPDATE jobs SET state = 'dead', next_attempt_at = NULL, finished_at = $2,
                     last_error = $3, updated_at = $2
     WHERE job_id = $1 AND state IN ('claimed', 'retrying')";
/// Parameters: state or NULL, limit.
pub const LIST_JOBS_SQL: &str = "SELECT job_id, state, source, event_type, attempts, received_at,
         next_attempt_at, finished_at, last_error
     FROM jobs WHERE CAST($1 AS TEXT) IS NULL OR state = $1
     ORDER BY received_at DESC, job_id LIMIT $2";
pub const SHOW_JOB_SQL: &str = "SELECT job_id, state, source, event_type, attempts, received_at,
         next_attempt_at, finished_at, last_error, lease_expires_at, updated_at, body
     FROM jobs WHERE job_id = $1";
/// the four counts of `jobs stats` (a table scan: a command for people). Parameters:
/// an hour ago, a day ago.
pub const STATS_SQL: &str = "SELECT
         (SELECT min(received_at) FROM jobs WHERE state IN ('claimed', 'running', 'retrying')),
         (SELECT count(*) FROM jobs WHERE received_at >= $1),
         (SELECT count(*) FROM jobs WHERE state = 'dead' AND finished_at >= $2)";
pub const COUNT_BY_STATE_SQL: &str = "SELECT state, count(*) FROM jobs GROUP BY state";
/// Parameters: job_id, now.
pub const RETRY_JOB_SQL: &str =
    "UPDATE jobs SET state = 'claimed', attempts = 0, next_attempt_at = $2, finished_at = NULL,
                     updated_at = $2
     WHERE job_id = $1 AND state IN ('done', 'dead') AND body IS NOT NULL";
/// Parameters: job_id, now.
pub const RUN_NOW_SQL: &str =
    "UPDATE jobs SET next_attempt_at = $2, updated_at = $2 WHERE job_id = $1 AND state = 'retrying'";
/// job_ids matching a LIKE pattern (the load generator's check of its run).
pub const JOB_IDS_LIKE_SQL: &str = "SELECT job_id FROM jobs WHERE job_id LIKE $1";
/// why [`RETRY_JOB_SQL`] changed nothing.
pub const RETRY_REFUSAL_SQL: &str = "SELECT state, body IS NULL FROM jobs WHERE job_id = $1";
/// Parameters: job_id, now, first poll at.
pub const EXPECT_JOB_SQL: &str =
    "INSERT INTO expected_jobs (job_id, expected_at, next_poll_at) VALUES ($1, $2, $3)
     ON CONFLICT (job_id) DO NOTHING";
pub const RESOLVE_ARRIVED_SQL: &str = "UPDATE expected_jobs SET state = 'arrived', resolved_at = $1
     WHERE state = 'waiting' AND next_poll_at <= $1
       AND EXISTS (SELECT 1 FROM jobs WHERE jobs.job_id = expected_jobs.job_id)";
/// Parameters: job_id, state, status, error, next poll at, resolved at.
pub const RECORD_POLL_SQL: &str = "UPDATE expected_jobs SET state = $2, polls = polls + 1,
         last_status = coalesce($3, last_status), last_error = $4,
         next_poll_at = coalesce($5, next_poll_at), resolved_at = $6
     WHERE job_id = $1 AND state = 'waiting'";
pub const COUNT_EXPECTATIONS_SQL: &str = "SELECT state, count(*) FROM expected_jobs GROUP BY state";
pub const LIST_EXPECTATIONS_SQL: &str =
    "SELECT job_id, state, expected_at, next_poll_at, polls, last_status, last_error
     FROM expected_jobs ORDER BY expected_at DESC, job_id LIMIT $1";
/// Running attempts leased under this receiver's name: at start, the ones it was running when
/// it stopped.
pub const OWN_LEASES_SQL: &str =
    "SELECT job_id, attempts FROM jobs WHERE state = 'running' AND leased_by = $1";
/// Starts an attempt on a row no other receiver is starting (`SKIP LOCKED`: it is theirs),
/// leased under this receiver's name.
pub const START_ATTEMPT_SQL: &str = "UPDATE jobs SET state = 'running', attempts = attempts + 1,
        lease_expires_at = $2, next_attempt_at = NULL, updated_at = $3, leased_by = $4
    WHERE job_id = (SELECT job_id FROM jobs
                    WHERE job_id = $1 AND state IN ('claimed', 'retrying') AND body IS NOT NULL
                    FOR UPDATE SKIP LOCKED)
    RETURNING attempts, event_type, source, body";
/// One batch of claims: inserted in job_id order (no deadlock between concurrent batches),
/// returning those that were new; each new row notifies the channel (PostgreSQL sends one
/// notification per transaction, at commit). A batch that inserts nothing (duplicates only)
/// still writes a WAL record, so that its commit too waits for the synchronous standby: the
/// rows it found may be committed locally by a claim whose wait was cancelled or terminated,
/// and not be on the standby yet. That batch returns one NULL row.
pub const INSERT_CLAIMS_SQL: &str = "WITH inserted AS (
        INSERT INTO jobs (job_id, state, source, event_type, body, received_at,
                          next_attempt_at, updated_at)
        SELECT job_id, 'claimed', source, event_type, body, $5, $5, $5
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
             AS claim (job_id, source, event_type, body)
        ORDER BY job_id
        ON CONFLICT (job_id) DO NOTHING
        RETURNING job_id)
    SELECT job_id FROM inserted, LATERAL (SELECT pg_notify('sume_jobs', '')) AS woken
    UNION ALL
    SELECT NULL FROM (SELECT pg_logical_emit_message(true, 'sume-receiver', '')) AS waited
    WHERE NOT EXISTS (SELECT 1 FROM inserted)";
pub const PURGE_BODIES_SQL: &str = "UPDATE jobs SET body = NULL WHERE job_id IN (
        SELECT job_id FROM jobs
        WHERE state IN ('done', 'dead') AND body IS NOT NULL AND finished_at < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub const DELETE_FINISHED_SQL: &str = "DELETE FROM jobs WHERE job_id IN (
        SELECT job_id FROM jobs WHERE state IN ('done', 'dead') AND finished_at < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub const DELETE_RESOLVED_SQL: &str = "DELETE FROM expected_jobs WHERE job_id IN (
        SELECT job_id FROM expected_jobs WHERE state <> 'waiting' AND resolved_at < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub const TAKE_DUE_EXPECTATIONS_SQL: &str = "UPDATE expected_jobs SET next_poll_at = $3
    WHERE job_id IN (SELECT job_id FROM expected_jobs
                     WHERE state = 'waiting' AND next_poll_at <= $1
                     ORDER BY next_poll_at LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING job_id, expected_at, polls";
