-- The ledger of Sume jobs on PostgreSQL: the same rows as the SQLite ledger
-- (migrations/sqlite/0001_jobs.sql), one per job_id, ever. Times are Unix milliseconds (UTC);
-- the view `jobs_readable` shows them as timestamps for psql.
CREATE TABLE jobs (
    job_id           text    NOT NULL PRIMARY KEY,
    -- claimed -> running -> done; a failed attempt -> retrying -> running ...; out of attempts -> dead
    state            text    NOT NULL
                     CHECK (state IN ('claimed', 'running', 'retrying', 'done', 'dead')),
    -- how the job reached us: a signed webhook, or polling Sume's status endpoint
    source           text    NOT NULL DEFAULT 'webhook' CHECK (source IN ('webhook', 'poll')),
    event_type       text,
    -- the delivery body exactly as received; NULL once retention keeps only a tombstone
    body             text,
    received_at      bigint  NOT NULL,
    -- the number of the latest attempt: also the fencing token of its lease
    attempts         integer NOT NULL DEFAULT 0,
    -- claimed/retrying: when the next attempt is due
    next_attempt_at  bigint,
    -- running: when the attempt is presumed dead (handler timeout plus slack)
    lease_expires_at bigint,
    last_error       text,
    -- done/dead: when the job reached that state
    finished_at      bigint,
    updated_at       bigint  NOT NULL
);

-- Partial indexes: each holds only the rows its task looks for, so the workers, sweepers and
-- retention never scan finished history.
CREATE INDEX jobs_due ON jobs (next_attempt_at) WHERE state IN ('claimed', 'retrying');
CREATE INDEX jobs_leased ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_finished_with_body ON jobs (finished_at)
    WHERE state IN ('done', 'dead') AND body IS NOT NULL;
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE state IN ('done', 'dead');

CREATE VIEW jobs_readable AS
SELECT job_id, state, source, event_type, attempts,
       to_timestamp(received_at / 1000.0)      AS received_at,
       to_timestamp(next_attempt_at / 1000.0)  AS next_attempt_at,
       to_timestamp(lease_expires_at / 1000.0) AS lease_expires_at,
       to_timestamp(finished_at / 1000.0)      AS finished_at,
       last_error,
       octet_length(body) AS body_bytes
FROM jobs;
