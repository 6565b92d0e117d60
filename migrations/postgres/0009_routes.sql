-- Routes: one event can feed several downstreams ([[route]] in the config). The claim stays one
-- row per job_id in `jobs`; the work is one row per job and route in `job_routes`, written in
-- the claim's transaction. The job's state and times in `jobs` become the summary of its
-- routes, kept by a trigger in the transaction of every change (see the SQLite migration of
-- the same number). Every receiver on this database must run a release with routes: see
-- docs/installing-and-upgrading.md.
CREATE TABLE job_routes (
    job_id             text    NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    route              text    NOT NULL,
    state              text    NOT NULL
                       CHECK (state IN ('claimed', 'running', 'retrying', 'done', 'dead')),
    attempts           integer NOT NULL DEFAULT 0,
    next_attempt_at    bigint,
    lease_expires_at   bigint,
    last_error         text,
    finished_at        bigint,
    next_attempt_cause text    NOT NULL DEFAULT 'first',
    leased_by          text,
    updated_at         bigint  NOT NULL,
    PRIMARY KEY (job_id, route)
);
CREATE INDEX job_routes_due ON job_routes (route, next_attempt_at)
    WHERE state IN ('claimed', 'retrying');
CREATE INDEX job_routes_leased ON job_routes (lease_expires_at) WHERE state = 'running';

INSERT INTO job_routes (job_id, route, state, attempts, next_attempt_at, lease_expires_at,
                        last_error, finished_at, next_attempt_cause, leased_by, updated_at)
SELECT job_id, 'default', state, attempts, next_attempt_at, lease_expires_at, last_error,
       finished_at, next_attempt_cause, leased_by, updated_at
FROM jobs;

-- The job's summary after a change of one of its routes. The job's row is locked first, and
-- the summary read by a statement of its own after the lock: under READ COMMITTED that
-- statement sees what a receiver that changed another route of the job just committed (two
-- routes finishing at once on two receivers must not both read the other as running).
CREATE FUNCTION job_routes_summarize() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM jobs WHERE job_id = NEW.job_id FOR UPDATE;
    UPDATE jobs SET (state, attempts, next_attempt_at, lease_expires_at, finished_at, leased_by) = (
            SELECT CASE WHEN bool_or(r.state = 'running') THEN 'running'
                        WHEN bool_or(r.state = 'retrying') THEN 'retrying'
                        WHEN bool_or(r.state = 'claimed') THEN 'claimed'
                        WHEN bool_or(r.state = 'dead') THEN 'dead'
                        ELSE 'done' END,
                   sum(r.attempts), min(r.next_attempt_at), min(r.lease_expires_at),
                   CASE WHEN bool_or(r.state IN ('claimed', 'running', 'retrying'))
                        THEN NULL ELSE max(r.finished_at) END,
                   max(r.leased_by)
            FROM job_routes AS r WHERE r.job_id = NEW.job_id),
        last_error = coalesce(NEW.last_error, jobs.last_error),
        next_attempt_cause = NEW.next_attempt_cause,
        updated_at = NEW.updated_at
    WHERE job_id = NEW.job_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER job_routes_summarize AFTER UPDATE ON job_routes FOR EACH ROW
    EXECUTE FUNCTION job_routes_summarize();

ALTER TABLE job_attempts ADD COLUMN route text NOT NULL DEFAULT 'default';
ALTER TABLE job_actions ADD COLUMN route text;

CREATE TABLE route_holds (
    route             text   NOT NULL PRIMARY KEY,
    since             bigint NOT NULL,
    reason            text   NOT NULL,
    sample_error      text   NOT NULL,
    next_probe_at     bigint NOT NULL,
    probe_interval_ms bigint NOT NULL
);
INSERT INTO route_holds (route, since, reason, sample_error, next_probe_at, probe_interval_ms)
SELECT 'default', since, reason, sample_error, next_probe_at, probe_interval_ms
FROM dispatch_hold;
DROP TABLE dispatch_hold;

ALTER TABLE dispatch_stops ADD COLUMN route text;
UPDATE dispatch_stops SET route = 'default' WHERE kind = 'hold';

-- A rolling upgrade: receivers of an older release may still run on this database, knowing
-- nothing of job_routes. Their claims are refused (`routed` has no default: the delivery gets
-- 503, Sume retries it, and a receiver of this release claims it with its work), and so is any
-- change of a job's state but the routes' summary (their starts and ends): an older receiver
-- can neither claim work that no worker would run nor start a job that a newer one runs too.
ALTER TABLE jobs ADD COLUMN routed boolean NOT NULL DEFAULT true;
ALTER TABLE jobs ALTER COLUMN routed DROP DEFAULT;
CREATE FUNCTION jobs_state_from_routes_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'a job''s state changes through its routes only (job_routes): this receiver predates routes; upgrade it'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER jobs_state_from_routes_only BEFORE UPDATE OF state ON jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION jobs_state_from_routes_only();
