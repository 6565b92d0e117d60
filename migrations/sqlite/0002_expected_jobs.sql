-- Jobs the application told us to expect (`jobs expect`, or the admin listener). The reconciler
-- polls Sume's status endpoint for those that have no claim `reconcile_after` after they were
-- registered: the backup path for webhooks that never arrived. Times are Unix milliseconds.
CREATE TABLE expected_jobs (
    job_id       TEXT    NOT NULL PRIMARY KEY,
    -- waiting:   no claim seen yet
    -- arrived:   a webhook claimed it; no poll was needed
    -- recovered: a poll found it terminal and claimed it
    -- given_up:  still not terminal or not reachable after give_up_after
    state        TEXT    NOT NULL DEFAULT 'waiting'
                 CHECK (state IN ('waiting', 'arrived', 'recovered', 'given_up')),
    expected_at  INTEGER NOT NULL,
    -- waiting: when to look at it next
    next_poll_at INTEGER NOT NULL,
    polls        INTEGER NOT NULL DEFAULT 0,
    -- the `status` of Sume's last answer
    last_status  TEXT,
    last_error   TEXT,
    resolved_at  INTEGER
) STRICT;

CREATE INDEX expected_jobs_due ON expected_jobs (next_poll_at) WHERE state = 'waiting';
CREATE INDEX expected_jobs_resolved ON expected_jobs (resolved_at) WHERE state <> 'waiting';
