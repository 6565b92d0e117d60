-- Each job's history, as in migrations/sqlite/0003_history.sql: every attempt and every
-- operator action, appended and never overwritten, at most 100 of each per job; a job's history
-- goes with the job (ON DELETE CASCADE). Times are Unix milliseconds.
ALTER TABLE jobs ADD COLUMN next_attempt_cause text NOT NULL DEFAULT 'first';
UPDATE jobs SET next_attempt_cause = 'backoff' WHERE state = 'retrying';
UPDATE jobs SET next_attempt_cause = 'poll' WHERE state = 'claimed' AND source = 'poll';
ALTER TABLE jobs ADD COLUMN body_purged_at bigint;
CREATE TABLE job_duplicates (
    job_id  text    NOT NULL PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    count   integer NOT NULL,
    last_at bigint  NOT NULL
);

CREATE TABLE job_attempts (
    id          bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      text    NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    number      integer NOT NULL,
    cause       text    NOT NULL,
    receiver    text,
    started_at  bigint  NOT NULL,
    ended_at    bigint,
    outcome     text CHECK (outcome IN ('done', 'failed', 'dead', 'taken_back', 'released')),
    exit_status integer,
    http_status integer,
    error       text
);
CREATE INDEX job_attempts_of_job ON job_attempts (job_id, id);

CREATE TABLE job_actions (
    id     bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id text    NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    at     bigint  NOT NULL,
    action text    NOT NULL CHECK (action IN ('retry', 'run_now', 'cancel', 'give_up', 'replay')),
    actor  text    NOT NULL,
    reason text
);
CREATE INDEX job_actions_of_job ON job_actions (job_id, id);

-- As on SQLite: the counts by state and the oldest unfinished job from the indexes alone.
DROP INDEX jobs_due;
CREATE INDEX jobs_due ON jobs (next_attempt_at, state, received_at)
    WHERE state IN ('claimed', 'retrying');
DROP INDEX jobs_leased;
CREATE INDEX jobs_leased ON jobs (lease_expires_at, received_at) WHERE state = 'running';

CREATE INDEX jobs_received ON jobs (received_at);
CREATE INDEX jobs_dead ON jobs (finished_at) WHERE state = 'dead';

-- Whether the workers of every receiver run jobs (one row), as on SQLite.
CREATE TABLE dispatch (
    id         integer PRIMARY KEY CHECK (id = 1),
    paused     boolean NOT NULL,
    changed_at bigint,
    changed_by text
);
INSERT INTO dispatch (id, paused) VALUES (1, false);
