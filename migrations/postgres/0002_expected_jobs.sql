-- Jobs the application told us to expect (`jobs expect`, or the admin listener), as in
-- migrations/sqlite/0002_expected_jobs.sql. Times are Unix milliseconds.
CREATE TABLE expected_jobs (
    job_id       text    NOT NULL PRIMARY KEY,
    -- waiting:   no claim seen yet
    -- arrived:   a webhook claimed it; no poll was needed
    -- recovered: a poll found it terminal and claimed it
    -- given_up:  still not terminal or not reachable after give_up_after
    state        text    NOT NULL DEFAULT 'waiting'
                 CHECK (state IN ('waiting', 'arrived', 'recovered', 'given_up')),
    expected_at  bigint  NOT NULL,
    -- waiting: when to look at it next (pushed ahead while one receiver polls it)
    next_poll_at bigint  NOT NULL,
    polls        integer NOT NULL DEFAULT 0,
    -- the `status` of Sume's last answer
    last_status  text,
    last_error   text,
    resolved_at  bigint
);

CREATE INDEX expected_jobs_due ON expected_jobs (next_poll_at) WHERE state = 'waiting';
CREATE INDEX expected_jobs_resolved ON expected_jobs (resolved_at) WHERE state <> 'waiting';
