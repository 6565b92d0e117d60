-- Routes: one event can feed several downstreams ([[route]] in the config). The claim stays one
-- row per job_id in `jobs` (the idempotency key, the body); the work is one row per job and
-- route in `job_routes`, written in the claim's transaction, each with its own state, attempts,
-- lease, retries and dead letter. The job's own state and times in `jobs` become the summary
-- of its routes, kept by a trigger in the transaction of every change: a job is running while
-- one of its routes runs, waiting while one waits, dead if one died and none waits, else done.
-- So every reader of `jobs` (the sqlite3 shell, the lists, the counts, retention) reads what it
-- read before, and a job with one route (every job before this migration: route `default`)
-- reads exactly as before. Times are Unix milliseconds.
CREATE TABLE job_routes (
    job_id             TEXT    NOT NULL,
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
    PRIMARY KEY (job_id, route)
) STRICT, WITHOUT ROWID;

-- Each route's worker reads its own due work, in order, and nothing of another route's.
CREATE INDEX job_routes_due ON job_routes (route, next_attempt_at)
    WHERE state IN ('claimed', 'retrying');
-- The sweeper reads every route's expired leases.
CREATE INDEX job_routes_leased ON job_routes (lease_expires_at) WHERE state = 'running';

-- Every job so far belongs to the default route, as it is.
INSERT INTO job_routes (job_id, route, state, attempts, next_attempt_at, lease_expires_at,
                        last_error, finished_at, next_attempt_cause, updated_at)
SELECT job_id, 'default', state, attempts, next_attempt_at, lease_expires_at, last_error,
       finished_at, next_attempt_cause, updated_at
FROM jobs;

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
            FROM job_routes WHERE job_id = NEW.job_id),
        last_error = coalesce(NEW.last_error, last_error),
        next_attempt_cause = NEW.next_attempt_cause,
        updated_at = NEW.updated_at
    WHERE job_id = NEW.job_id;
END;

CREATE TRIGGER jobs_forget_routes AFTER DELETE ON jobs BEGIN
    DELETE FROM job_routes WHERE job_id = OLD.job_id;
END;

-- Which route an attempt ran for; an action on one route names it (NULL: the whole job).
ALTER TABLE job_attempts ADD COLUMN route TEXT NOT NULL DEFAULT 'default';
ALTER TABLE job_actions ADD COLUMN route TEXT;

-- A hold per route: one route's downstream down holds that route alone.
CREATE TABLE route_holds (
    route             TEXT    NOT NULL PRIMARY KEY,
    since             INTEGER NOT NULL,
    reason            TEXT    NOT NULL,
    sample_error      TEXT    NOT NULL,
    next_probe_at     INTEGER NOT NULL,
    probe_interval_ms INTEGER NOT NULL
) STRICT;
INSERT INTO route_holds (route, since, reason, sample_error, next_probe_at, probe_interval_ms)
SELECT 'default', since, reason, sample_error, next_probe_at, probe_interval_ms
FROM dispatch_hold;
DROP TABLE dispatch_hold;

-- A hold's stop names its route; a pause (of every route) names none.
ALTER TABLE dispatch_stops ADD COLUMN route TEXT;
UPDATE dispatch_stops SET route = 'default' WHERE kind = 'hold';

-- The view shows the summary as before; `job_routes_readable` shows each route's work.
CREATE VIEW job_routes_readable AS
SELECT job_id, route, state, attempts,
       strftime('%Y-%m-%d %H:%M:%f', next_attempt_at / 1000.0, 'unixepoch')  AS next_attempt_at,
       strftime('%Y-%m-%d %H:%M:%f', lease_expires_at / 1000.0, 'unixepoch') AS lease_expires_at,
       strftime('%Y-%m-%d %H:%M:%f', finished_at / 1000.0, 'unixepoch')      AS finished_at,
       last_error
FROM job_routes;
