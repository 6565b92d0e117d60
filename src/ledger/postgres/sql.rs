//! The PostgreSQL ledger's statements, in its dialect (`$N` parameters, `SKIP LOCKED`). The
//! work-side statements change a job's work on one route (`job_routes`); its trigger keeps the
//! job's summary in `jobs`.

pub const EXPIRED_LEASES_SQL: &str = "SELECT job_id, route, attempts FROM job_routes
         WHERE state = 'running' AND lease_expires_at <= $1";
/// Parameters: now, limit, route.
pub const DUE_JOBS_SQL: &str = "SELECT job_id FROM job_routes
         WHERE route = $3 AND state IN ('claimed', 'retrying') AND next_attempt_at <= $1
         ORDER BY next_attempt_at LIMIT $2";
/// Parameters: route.
pub const NEXT_DUE_ON_ROUTE_SQL: &str = "SELECT min(next_attempt_at) FROM job_routes
         WHERE route = $1 AND state IN ('claimed', 'retrying')";
pub const NEXT_DUE_SQL: &str = "SELECT min(next_attempt_at) FROM jobs
         WHERE state IN ('claimed', 'retrying')";
/// Parameters: job_id, attempt number, state, error, retry at, finished at, now, the history's
/// outcome, exit status, HTTP status, route. The attempt's history row is ended in the same
/// statement; one row: 1 if the attempt still owned the job's work on the route, else 0.
pub const FINISH_ATTEMPT_SQL: &str = "WITH finished AS (
        UPDATE job_routes SET state = $3, last_error = coalesce($4, last_error),
                        next_attempt_at = $5, finished_at = $6, lease_expires_at = NULL,
                        updated_at = $7, next_attempt_cause = 'backoff', leased_by = NULL
        WHERE job_id = $1 AND route = $11 AND attempts = $2 AND state = 'running'
        RETURNING job_id),
    recorded AS (
        UPDATE job_attempts SET ended_at = $7, outcome = $8, exit_status = $9,
                                http_status = $10, error = $4
        WHERE job_id = $1 AND route = $11 AND number = $2 AND ended_at IS NULL
          AND EXISTS (SELECT 1 FROM finished))
    SELECT count(*) FROM finished";
/// Parameters: job_id, attempt number, now, the next attempt's cause, the released attempt's
/// error, exit status and HTTP status, route. One row: 1 if the attempt still owned the work.
pub const RELEASE_ATTEMPT_SQL: &str = "WITH released AS (
        UPDATE job_routes SET state = CASE WHEN attempts > 1 THEN 'retrying' ELSE 'claimed' END,
                        attempts = attempts - 1, next_attempt_at = $3,
                        lease_expires_at = NULL, updated_at = $3, next_attempt_cause = $4,
                        leased_by = NULL
        WHERE job_id = $1 AND route = $8 AND attempts = $2 AND state = 'running'
        RETURNING job_id),
    recorded AS (
        UPDATE job_attempts SET ended_at = $3, outcome = 'released', error = $5,
                                exit_status = $6, http_status = $7
        WHERE job_id = $1 AND route = $8 AND number = $2 AND ended_at IS NULL
          AND EXISTS (SELECT 1 FROM released))
    SELECT count(*) FROM released";
/// Parameters: job_id, now, max_attempts, error, cutoff, attempt number, route. The lease and
/// the attempt are checked again: another receiver may have taken it back, and started a new
/// attempt, since it was read. The casts tell PostgreSQL the type a `CASE` alone leaves open.
pub const TAKE_BACK_LEASE_SQL: &str = "WITH taken AS (
        UPDATE job_routes SET
             state = CASE WHEN attempts >= $3 THEN 'dead' ELSE 'retrying' END,
             next_attempt_at = CASE WHEN attempts >= $3 THEN NULL ELSE CAST($2 AS BIGINT) END,
             finished_at = CASE WHEN attempts >= $3 THEN CAST($2 AS BIGINT) ELSE NULL END,
             lease_expires_at = NULL, last_error = $4, updated_at = $2,
             next_attempt_cause = 'take_back', leased_by = NULL
         WHERE job_id = $1 AND route = $7 AND state = 'running' AND lease_expires_at <= $5
           AND attempts = $6
         RETURNING state),
    recorded AS (
        UPDATE job_attempts SET ended_at = $2, outcome = 'taken_back', error = $4
        WHERE job_id = $1 AND route = $7 AND number = $6 AND ended_at IS NULL
          AND EXISTS (SELECT 1 FROM taken))
    SELECT state FROM taken";
/// Parameters: job_id, now, error, action, actor, route. The route's waiting work, or every
/// route's (NULL). One row: 1 if some was waiting.
pub const GIVE_UP_SQL: &str = "WITH given_up AS (
        UPDATE job_routes SET state = 'dead', next_attempt_at = NULL, finished_at = $2,
                        last_error = $3, updated_at = $2
        WHERE job_id = $1 AND state IN ('claimed', 'retrying')
          AND (CAST($6 AS TEXT) IS NULL OR route = $6)
        RETURNING job_id),
    recorded AS (
        INSERT INTO job_actions (job_id, at, action, actor, reason)
        SELECT DISTINCT job_id, $2, $4, $5, $3 FROM given_up)
    SELECT least(count(*), 1) FROM given_up";
pub const SHOW_JOB_SQL: &str = "SELECT job_id, state, source, event_type, attempts, received_at,
         next_attempt_at, finished_at, last_error, lease_expires_at, updated_at, body,
         body_purged_at, next_attempt_cause,
         coalesce((SELECT count FROM job_duplicates AS d WHERE d.job_id = jobs.job_id), 0),
         (SELECT last_at FROM job_duplicates AS d WHERE d.job_id = jobs.job_id)
     FROM jobs WHERE job_id = $1";
/// Parameters: job_ids (sorted), counts, last times.
pub const RECORD_DUPLICATES_SQL: &str = "INSERT INTO job_duplicates (job_id, count, last_at)
    SELECT seen.job_id, seen.count, seen.last
    FROM unnest($1::text[], $2::integer[], $3::bigint[]) AS seen (job_id, count, last)
    JOIN jobs ON jobs.job_id = seen.job_id
    ORDER BY seen.job_id
    ON CONFLICT (job_id) DO UPDATE SET count = job_duplicates.count + excluded.count,
                                       last_at = greatest(job_duplicates.last_at, excluded.last_at)";
pub const ATTEMPTS_OF_JOB_SQL: &str = "SELECT route, number, cause, receiver, started_at,
        ended_at, outcome, exit_status, http_status, error
    FROM job_attempts WHERE job_id = $1 ORDER BY id";
pub const ACTIONS_OF_JOB_SQL: &str =
    "SELECT at, action, actor, reason FROM job_actions WHERE job_id = $1 ORDER BY id";
/// Parameters: job_ids, kept. Keeps the newest `kept` actions of each job.
pub const TRIM_ACTIONS_SQL: &str = "DELETE FROM job_actions AS a
    WHERE a.job_id = ANY($1) AND a.id < (
        SELECT b.id FROM job_actions AS b WHERE b.job_id = a.job_id
        ORDER BY b.id DESC LIMIT 1 OFFSET CAST($2 AS BIGINT) - 1)";
/// Parameters: state, finished since, finished before, error text or NULL, limit, now, actor,
/// reason. Retries a batch of a bulk retry, recording each as the actor's action; the job_ids.
pub const RETRY_MATCHING_SQL: &str = "WITH picked AS (
        SELECT job_id FROM jobs
        WHERE state = $1 AND state IN ('done', 'dead') AND finished_at >= $2
          AND finished_at < $3 AND (CAST($4 AS TEXT) IS NULL OR strpos(last_error, $4) > 0)
          AND body IS NOT NULL
        ORDER BY finished_at LIMIT $5 FOR UPDATE SKIP LOCKED),
    retried AS (
        UPDATE job_routes SET state = 'claimed', attempts = 0, next_attempt_at = $6,
                        finished_at = NULL, updated_at = $6, next_attempt_cause = 'manual_retry'
        FROM picked WHERE job_routes.job_id = picked.job_id AND job_routes.state = $1
        RETURNING job_routes.job_id),
    recorded AS (
        INSERT INTO job_actions (job_id, at, action, actor, reason)
        SELECT DISTINCT job_id, $6, 'retry', $7, $8 FROM retried)
    SELECT DISTINCT job_id FROM retried";
pub const COUNT_RETRY_MATCHING_SQL: &str = "SELECT
         count(*) FILTER (WHERE body IS NOT NULL), count(*) FILTER (WHERE body IS NULL)
     FROM jobs
     WHERE state = $1 AND state IN ('done', 'dead') AND finished_at >= $2 AND finished_at < $3
       AND (CAST($4 AS TEXT) IS NULL OR strpos(last_error, $4) > 0)";
/// Parameters: job_id, now, actor, reason, route. A finished job's routes in its state (a dead
/// job's dead ones, a done job's all), or the route's finished work. One row: 1 if some was
/// finished and the job has its body.
pub const RETRY_JOB_SQL: &str = "WITH retried AS (
        UPDATE job_routes SET state = 'claimed', attempts = 0, next_attempt_at = $2,
                        finished_at = NULL, updated_at = $2, next_attempt_cause = 'manual_retry'
        WHERE job_id = $1 AND state IN ('done', 'dead')
          AND EXISTS (SELECT 1 FROM jobs WHERE job_id = $1 AND body IS NOT NULL)
          AND CASE WHEN CAST($5 AS TEXT) IS NULL
                   THEN state = (SELECT state FROM jobs WHERE job_id = $1)
                   ELSE route = $5 END
        RETURNING job_id),
    recorded AS (
        INSERT INTO job_actions (job_id, at, action, actor, reason)
        SELECT DISTINCT job_id, $2, 'retry', $3, CAST($4 AS TEXT) FROM retried)
    SELECT least(count(*), 1) FROM retried";
/// Parameters: job_id, now, actor, reason, route (NULL: every route). One row: 1 if some of
/// the job's work waited for a retry.
pub const RUN_NOW_SQL: &str = "WITH hurried AS (
        UPDATE job_routes SET next_attempt_at = $2, updated_at = $2,
                              next_attempt_cause = 'run_now'
        WHERE job_id = $1 AND state = 'retrying' AND (CAST($5 AS TEXT) IS NULL OR route = $5)
        RETURNING job_id),
    recorded AS (
        INSERT INTO job_actions (job_id, at, action, actor, reason)
        SELECT DISTINCT job_id, $2, 'run_now', $3, CAST($4 AS TEXT) FROM hurried)
    SELECT least(count(*), 1) FROM hurried";
/// Parameters: job_id, now, action, actor, reason. One row: 1 if the job is in the ledger.
pub const RECORD_ACTION_SQL: &str = "WITH recorded AS (
        INSERT INTO job_actions (job_id, at, action, actor, reason)
        SELECT job_id, $2, $3, $4, $5 FROM jobs WHERE job_id = $1
        RETURNING job_id)
    SELECT count(*) FROM recorded";
/// Reads the index of running jobs only.
pub const RUNNING_BY_RECEIVER_SQL: &str = "SELECT coalesce(leased_by, '(unnamed)'), count(*)
    FROM job_routes WHERE state = 'running' GROUP BY 1 ORDER BY 2 DESC, 1";
pub const DISPATCH_SQL: &str = "SELECT paused, changed_at, changed_by FROM dispatch WHERE id = 1";
/// Parameters: paused, now, actor, reason. A resume also ends a hold, and is then a change. A
/// pause begins a stop in the log, a resume ends every open one (a pause, a hold).
pub const SET_DISPATCH_SQL: &str = "WITH holds_ended AS (
        DELETE FROM route_holds WHERE NOT $1 RETURNING route),
    pauses_ended AS (
        DELETE FROM route_pauses WHERE NOT $1 RETURNING route),
    changed AS (
        UPDATE dispatch SET paused = $1, changed_at = $2, changed_by = $3
        WHERE id = 1 AND (paused <> $1 OR EXISTS (SELECT 1 FROM holds_ended)
                          OR EXISTS (SELECT 1 FROM pauses_ended))
        RETURNING paused),
    began AS (
        INSERT INTO dispatch_stops (kind, started_at, started_by, reason)
        SELECT 'pause', $2, $3, $4 FROM changed WHERE paused),
    closed AS (
        UPDATE dispatch_stops SET ended_at = $2, ended_by = $3
        WHERE ended_at IS NULL AND EXISTS (SELECT 1 FROM changed WHERE NOT paused))
    SELECT count(*) FROM changed";
/// Parameters: route. The route's own pause, if it has one.
pub const ROUTE_PAUSE_SQL: &str =
    "SELECT changed_at, changed_by FROM route_pauses WHERE route = $1";
/// Parameters: route, now, actor, reason. Pauses the route unless it is; one row: 1 if it
/// began, with its stop.
pub const PAUSE_ROUTE_SQL: &str = "WITH began AS (
        INSERT INTO route_pauses (route, changed_at, changed_by) VALUES ($1, $2, $3)
        ON CONFLICT (route) DO NOTHING
        RETURNING route),
    logged AS (
        INSERT INTO dispatch_stops (kind, route, started_at, started_by, reason)
        SELECT 'pause', route, $2, $3, $4 FROM began)
    SELECT count(*) FROM began";
/// Parameters: route, now, actor. Ends the route's pause and hold, and their stops; one row: 1
/// if either was in force.
pub const RESUME_ROUTE_SQL: &str = "WITH resumed AS (
        DELETE FROM route_pauses WHERE route = $1 RETURNING route),
    released AS (
        DELETE FROM route_holds WHERE route = $1 RETURNING route),
    closed AS (
        UPDATE dispatch_stops SET ended_at = $2, ended_by = $3
        WHERE ended_at IS NULL AND route = $1
          AND (EXISTS (SELECT 1 FROM resumed) OR EXISTS (SELECT 1 FROM released)))
    SELECT least((SELECT count(*) FROM resumed) + (SELECT count(*) FROM released), 1)";
/// job_ids matching a LIKE pattern (the load generator's check of its run).
#[cfg(feature = "bench")]
pub const JOB_IDS_LIKE_SQL: &str = "SELECT job_id FROM jobs WHERE job_id LIKE $1";
/// why [`RETRY_JOB_SQL`] changed nothing: the job's state, or its route's (the second
/// parameter, when given).
pub const RETRY_REFUSAL_SQL: &str = "SELECT coalesce(
             (SELECT state FROM job_routes WHERE job_id = $1 AND route = $2), state),
         body IS NULL
     FROM jobs WHERE job_id = $1 AND (CAST($2 AS TEXT) IS NULL OR EXISTS (
         SELECT 1 FROM job_routes WHERE job_id = $1 AND route = $2))";
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
    "SELECT job_id, route, attempts FROM job_routes WHERE state = 'running' AND leased_by = $1";
/// Starts an attempt on a row no other receiver is starting (`SKIP LOCKED`: it is theirs),
/// leased under this receiver's name, and appends it to the job's history; the history keeps
/// the newest `$5` rows before this one (its snapshot does not see the new row).
pub const START_ATTEMPT_SQL: &str = "WITH started AS (
        UPDATE job_routes SET state = 'running', attempts = attempts + 1,
            lease_expires_at = $2, next_attempt_at = NULL, updated_at = $3, leased_by = $4
        WHERE (job_id, route) = (SELECT job_id, route FROM job_routes
                        WHERE job_id = $1 AND route = $6 AND state IN ('claimed', 'retrying')
                          AND EXISTS (SELECT 1 FROM jobs WHERE jobs.job_id = $1
                                      AND body IS NOT NULL)
                        FOR UPDATE SKIP LOCKED)
        RETURNING job_id, attempts, next_attempt_cause),
    recorded AS (
        INSERT INTO job_attempts (job_id, route, number, cause, receiver, started_at)
        SELECT job_id, $6, attempts, next_attempt_cause, $4, $3 FROM started),
    trimmed AS (
        DELETE FROM job_attempts
        WHERE job_id = $1 AND EXISTS (SELECT 1 FROM started) AND id < (
            SELECT id FROM job_attempts WHERE job_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $5))
    SELECT started.attempts, jobs.event_type, jobs.source, jobs.body
    FROM started JOIN jobs ON jobs.job_id = started.job_id";
/// One batch of claims: inserted in job_id order (no deadlock between concurrent batches),
/// returning those that were new; each new row notifies the channel (PostgreSQL sends one
/// notification per transaction, at commit). A batch that inserts nothing (duplicates only)
/// still writes a WAL record, so that its commit too waits for the synchronous standby: the
/// rows it found may be committed locally by a claim whose wait was cancelled or terminated,
/// and not be on the standby yet. That batch returns one NULL row.
///
/// Parameters: job_ids, sources, event types, bodies, now, the states the claims write
/// (`claimed`, or `done`/`dead` for an event no route takes), their errors; then the work, as
/// two arrays of the same length (job_id, route): written for the claims that were new.
pub const INSERT_CLAIMS_SQL: &str = "WITH inserted AS (
        INSERT INTO jobs (job_id, state, source, event_type, body, received_at,
                          next_attempt_at, updated_at, last_error, finished_at, routed,
                          trace_context)
        SELECT job_id, state, source, event_type, body, CAST($5 AS BIGINT),
               CASE WHEN state = 'claimed' THEN CAST($5 AS BIGINT) END, CAST($5 AS BIGINT),
               error, CASE WHEN state = 'claimed' THEN NULL ELSE CAST($5 AS BIGINT) END, true,
               trace_context
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $6::text[], $7::text[],
                    $10::text[])
             AS claim (job_id, source, event_type, body, state, error, trace_context)
        ORDER BY job_id
        ON CONFLICT (job_id) DO NOTHING
        RETURNING job_id),
    work_rows AS (
        INSERT INTO job_routes (job_id, route, state, next_attempt_at, updated_at)
        SELECT work.job_id, work.route, 'claimed', CAST($5 AS BIGINT), CAST($5 AS BIGINT)
        FROM unnest($8::text[], $9::text[]) AS work (job_id, route)
        JOIN inserted ON inserted.job_id = work.job_id
        ORDER BY work.job_id, work.route
        ON CONFLICT (job_id, route) DO NOTHING)
    SELECT job_id FROM inserted, LATERAL (SELECT pg_notify('sume_jobs', '')) AS woken
    UNION ALL
    SELECT NULL FROM (SELECT pg_logical_emit_message(true, 'sume-receiver', '')) AS waited
    WHERE NOT EXISTS (SELECT 1 FROM inserted)";
pub const PURGE_BODIES_SQL: &str = "UPDATE jobs
    SET body = NULL, body_purged_at = CAST(extract(epoch FROM clock_timestamp()) * 1000 AS BIGINT)
    WHERE job_id IN (
        SELECT job_id FROM jobs
        WHERE state IN ('done', 'dead') AND body IS NOT NULL AND finished_at < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub const DELETE_FINISHED_SQL: &str = "DELETE FROM jobs WHERE job_id IN (
        SELECT job_id FROM jobs WHERE state IN ('done', 'dead') AND finished_at < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub const DELETE_RESOLVED_SQL: &str = "DELETE FROM expected_jobs WHERE job_id IN (
        SELECT job_id FROM expected_jobs WHERE state <> 'waiting' AND resolved_at < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub const DELETE_ENDED_STOPS_SQL: &str = "DELETE FROM dispatch_stops WHERE id IN (
        SELECT id FROM dispatch_stops WHERE ended_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)";
pub const TAKE_DUE_EXPECTATIONS_SQL: &str = "UPDATE expected_jobs SET next_poll_at = $3
    WHERE job_id IN (SELECT job_id FROM expected_jobs
                     WHERE state = 'waiting' AND next_poll_at <= $1
                     ORDER BY next_poll_at LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING job_id, expected_at, polls";
/// Moves the kept finished counts of server processes that have ended into owner 0's rows (see
/// migrations/postgres/0005_job_counts.sql); a live process's rows are its own, untouched.
pub const FOLD_COUNTS_SQL: &str = "WITH ended AS (
        DELETE FROM job_counts
        WHERE owner <> 0 AND owner NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING state, jobs)
    INSERT INTO job_counts (state, owner, jobs)
    SELECT state, 0, sum(jobs) FROM ended GROUP BY state
    ON CONFLICT (state, owner) DO UPDATE SET jobs = job_counts.jobs + EXCLUDED.jobs";
/// A job's kept trace context (migrations/postgres/0010_trace_context.sql).
pub const TRACE_CONTEXT_SQL: &str = "SELECT trace_context FROM jobs WHERE job_id = $1";
