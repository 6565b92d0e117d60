-- The ledger of Sume jobs: one row per job_id, ever. Times are Unix milliseconds (UTC); the view
-- `jobs_readable` shows them as text for the sqlite3 shell.
CREATE TABLE jobs (
    job_id           TEXT    NOT NULL PRIMARY KEY,
    -- claimed -> running -> done; a failed attempt -> retrying -> running ...; out of attempts -> dead
    state            TEXT    NOT NULL
                     CHECK (state IN ('claimed', 'running', 'retrying', 'done', 'dead')),
    -- how the job reached us: a signed webhook, or polling Sume's status endpoint
    source           TEXT    NOT NULL DEFAULT 'webhook' CHECK (source IN ('webhook', 'poll')),
    event_type       TEXT,
    -- the delivery body exactly as received; NULL once retention keeps only a tombstone
    body             TEXT,
    received_at      INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    -- claimed/retrying: when the next attempt is due
    next_attempt_at  INTEGER,
    -- running: when the attempt is presumed dead (handler timeout plus slack)
    lease_expires_at INTEGER,
    last_error       TEXT,
    -- done/dead: when the job reached that state
    finished_at      INTEGER,
    updated_at       INTEGER NOT NULL
) STRICT;

-- Partial indexes: each holds only the rows its task looks for, so the sweeper and the retention
-- task never scan finished history.
CREATE INDEX jobs_due ON jobs (next_attempt_at) WHERE state IN ('claimed', 'retrying');
CREATE INDEX jobs_leased ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_finished_with_body ON jobs (finished_at)
    WHERE state IN ('done', 'dead') AND body IS NOT NULL;
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE state IN ('done', 'dead');

CREATE VIEW jobs_readable AS
SELECT job_id, state, source, event_type, attempts,
       strftime('%Y-%m-%d %H:%M:%f', received_at / 1000.0, 'unixepoch')      AS received_at,
       strftime('%Y-%m-%d %H:%M:%f', next_attempt_at / 1000.0, 'unixepoch')  AS next_attempt_at,
       strftime('%Y-%m-%d %H:%M:%f', lease_expires_at / 1000.0, 'unixepoch') AS lease_expires_at,
       strftime('%Y-%m-%d %H:%M:%f', finished_at / 1000.0, 'unixepoch')      AS finished_at,
       last_error,
       length(body) AS body_bytes
FROM jobs;
