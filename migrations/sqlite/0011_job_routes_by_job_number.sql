-- A job's work is keyed by the job's number in this ledger, not by its job_id. Job ids come
-- in no order, so a `job_routes` keyed by (job_id, route) took every claim's work row into a
-- random page of its B-tree: one more page read, changed and written to the WAL per claim,
-- which cost a new claim about 15 us of CPU (docs/performance.md, "Routes on the request
-- path"). Numbers come in the order of the claims, so a claim's work row lands on the last
-- page, with the work rows of the claims before it.
--
-- The number is an INTEGER PRIMARY KEY, which no VACUUM (nor a backup's VACUUM INTO) may
-- renumber as it may a plain rowid. The tables are rebuilt with it: this step copies `jobs`
-- once, through the WAL, so the first start after the upgrade takes about as long as copying
-- the ledger twice, and needs free disk of up to three times the ledger's size while it runs
-- (the file keeps twice its size until retention frees pages). The job_id stays the one
-- idempotency key (unique).

DROP VIEW jobs_readable;
DROP VIEW job_routes_readable;

CREATE TABLE jobs_numbered (
    -- the job's number in this ledger, in the order of the claims; `job_routes.job` names it
    id                 INTEGER PRIMARY KEY,
    job_id             TEXT    NOT NULL,
    -- claimed -> running -> done; a failed attempt -> retrying -> running ...; out of attempts
    -- -> dead. With routes, the summary of its routes' work (trigger job_routes_summarize).
    state              TEXT    NOT NULL
                       CHECK (state = 'claimed' OR state = 'running' OR state = 'retrying' OR state = 'done' OR state = 'dead'),
    -- how the job reached us: a signed webhook, or polling Sume's status endpoint
    source             TEXT    NOT NULL DEFAULT 'webhook' CHECK (source IN ('webhook', 'poll')),
    event_type         TEXT,
    -- the delivery body exactly as received; NULL once retention keeps only a tombstone
    body               TEXT,
    received_at        INTEGER NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    -- claimed/retrying: when the next attempt is due
    next_attempt_at    INTEGER,
    -- running: when the attempt is presumed dead (handler timeout plus slack)
    lease_expires_at   INTEGER,
    last_error         TEXT,
    -- done/dead: when the job reached that state
    finished_at        INTEGER,
    updated_at         INTEGER NOT NULL,
    next_attempt_cause TEXT    NOT NULL DEFAULT 'first',
    body_purged_at     INTEGER,
    trace_context      TEXT
) STRICT;
INSERT INTO jobs_numbered (id, job_id, state, source, event_type, body, received_at, attempts,
                           next_attempt_at, lease_expires_at, last_error, finished_at,
                           updated_at, next_attempt_cause, body_purged_at, trace_context)
SELECT rowid, job_id, state, source, event_type, body, received_at, attempts, next_attempt_at,
       lease_expires_at, last_error, finished_at, updated_at, next_attempt_cause,
       body_purged_at, trace_context
FROM jobs ORDER BY rowid;

CREATE TABLE job_routes_numbered (
    -- the job's `jobs.id`
    job                INTEGER NOT NULL,
    -- a [[route]]'s name; `default` for [handler] and for every job from before routes
    route              TEXT    NOT NULL,
    state              TEXT    NOT NULL
                       CHECK (state = 'claimed' OR state = 'running' OR state = 'retrying' OR state = 'done' OR state = 'dead'),
    -- the number of the route's latest attempt: also the fencing token of its lease
    attempts           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at    INTEGER,
    lease_expires_at   INTEGER,
    last_error         TEXT,
    finished_at        INTEGER,
    next_attempt_cause TEXT    NOT NULL DEFAULT 'first',
    updated_at         INTEGER NOT NULL,
    PRIMARY KEY (job, route)
) STRICT, WITHOUT ROWID;
INSERT INTO job_routes_numbered (job, route, state, attempts, next_attempt_at,
                                 lease_expires_at, last_error, finished_at,
                                 next_attempt_cause, updated_at)
SELECT j.id, r.route, r.state, r.attempts, r.next_attempt_at, r.lease_expires_at, r.last_error,
       r.finished_at, r.next_attempt_cause, r.updated_at
FROM job_routes AS r JOIN jobs_numbered AS j ON j.job_id = r.job_id
ORDER BY j.id, r.route;

-- Their indexes and triggers go with them.
DROP TABLE job_routes;
DROP TABLE jobs;
ALTER TABLE jobs_numbered RENAME TO jobs;
ALTER TABLE job_routes_numbered RENAME TO job_routes;

-- The idempotency key: a claim's `ON CONFLICT (job_id) DO NOTHING`. Made after the copy, in
-- one sorted pass.
CREATE UNIQUE INDEX jobs_job_id ON jobs (job_id);
-- Partial indexes: each holds only the rows its task looks for, so the sweeper and the
-- retention task never scan finished history.
CREATE INDEX jobs_due ON jobs (next_attempt_at, state, received_at)
    WHERE state IN ('claimed', 'retrying');
CREATE INDEX jobs_leased ON jobs (lease_expires_at, received_at) WHERE state = 'running';
CREATE INDEX jobs_received ON jobs (received_at);
CREATE INDEX jobs_dead ON jobs (finished_at) WHERE state = 'dead';
CREATE INDEX jobs_finished_with_body ON jobs (finished_at)
    WHERE state IN ('done', 'dead') AND body IS NOT NULL;
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE state IN ('done', 'dead');

-- Each route's worker reads its own due work, in order, and nothing of another route's.
CREATE INDEX job_routes_due ON job_routes (route, next_attempt_at)
    WHERE state IN ('claimed', 'retrying');
-- The sweeper reads every route's expired leases.
CREATE INDEX job_routes_leased ON job_routes (lease_expires_at) WHERE state = 'running';

-- The triggers as they were, the work's keyed by the job's number.
CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs
WHEN NEW.state IN ('done', 'dead') BEGIN
    UPDATE job_counts SET jobs = jobs + 1 WHERE state = NEW.state;
END;
CREATE TRIGGER jobs_count_finish AFTER UPDATE OF state ON jobs
WHEN NEW.state IN ('done', 'dead') AND OLD.state <> NEW.state BEGIN
    UPDATE job_counts SET jobs = jobs + 1 WHERE state = NEW.state;
END;
CREATE TRIGGER jobs_count_unfinish AFTER UPDATE OF state ON jobs
WHEN OLD.state IN ('done', 'dead') AND OLD.state <> NEW.state BEGIN
    UPDATE job_counts SET jobs = jobs - 1 WHERE state = OLD.state;
END;
CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs
WHEN OLD.state IN ('done', 'dead') BEGIN
    UPDATE job_counts SET jobs = jobs - 1 WHERE state = OLD.state;
END;
CREATE TRIGGER jobs_forget_history AFTER DELETE ON jobs BEGIN
    DELETE FROM job_attempts WHERE job_id = OLD.job_id;
    DELETE FROM job_actions WHERE job_id = OLD.job_id;
    DELETE FROM job_duplicates WHERE job_id = OLD.job_id;
END;
CREATE TRIGGER jobs_forget_routes AFTER DELETE ON jobs BEGIN
    DELETE FROM job_routes WHERE job = OLD.id;
END;
-- The job's summary, after every change of one of its routes.
CREATE TRIGGER job_routes_summarize AFTER UPDATE ON job_routes BEGIN
    UPDATE jobs SET (state, attempts, next_attempt_at, lease_expires_at, finished_at) = (
            SELECT CASE WHEN max(state = 'running') THEN 'running'
                        WHEN max(state = 'retrying') THEN 'retrying'
                        WHEN max(state = 'claimed') THEN 'claimed'
                        WHEN max(state = 'dead') THEN 'dead'
                        ELSE 'done' END,
                   sum(attempts), min(next_attempt_at), min(lease_expires_at),
                   CASE WHEN max(state = 'claimed' OR state = 'running' OR state = 'retrying')
                        THEN NULL ELSE max(finished_at) END
            FROM job_routes WHERE job = NEW.job),
        last_error = coalesce(NEW.last_error, last_error),
        next_attempt_cause = NEW.next_attempt_cause,
        updated_at = NEW.updated_at
    WHERE id = NEW.job;
END;

CREATE VIEW jobs_readable AS
SELECT job_id, state, source, event_type, attempts,
       strftime('%Y-%m-%d %H:%M:%f', received_at / 1000.0, 'unixepoch')      AS received_at,
       strftime('%Y-%m-%d %H:%M:%f', next_attempt_at / 1000.0, 'unixepoch')  AS next_attempt_at,
       strftime('%Y-%m-%d %H:%M:%f', lease_expires_at / 1000.0, 'unixepoch') AS lease_expires_at,
       strftime('%Y-%m-%d %H:%M:%f', finished_at / 1000.0, 'unixepoch')      AS finished_at,
       last_error,
       length(body) AS body_bytes
FROM jobs;
CREATE VIEW job_routes_readable AS
SELECT jobs.job_id, r.route, r.state, r.attempts,
       strftime('%Y-%m-%d %H:%M:%f', r.next_attempt_at / 1000.0, 'unixepoch')  AS next_attempt_at,
       strftime('%Y-%m-%d %H:%M:%f', r.lease_expires_at / 1000.0, 'unixepoch') AS lease_expires_at,
       strftime('%Y-%m-%d %H:%M:%f', r.finished_at / 1000.0, 'unixepoch')      AS finished_at,
       r.last_error
FROM job_routes AS r JOIN jobs ON jobs.id = r.job;
