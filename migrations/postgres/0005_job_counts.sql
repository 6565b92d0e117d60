-- How many jobs are done and dead, kept by triggers in the transaction of every change (as in
-- migrations/sqlite/0004_job_counts.sql; the unfinished states are counted from their partial
-- indexes). Several receivers change jobs at once, and one row per state would make their
-- commits wait on each other for that row's lock: each server process (`owner`, its pid) adds
-- to rows of its own instead, so no two running transactions ever touch the same row. The
-- counts are the sums; retention folds the rows of processes that have ended into owner 0.
CREATE TABLE job_counts (
    state text    NOT NULL CHECK (state IN ('done', 'dead')),
    owner integer NOT NULL,
    jobs  bigint  NOT NULL,
    PRIMARY KEY (state, owner)
);
INSERT INTO job_counts (state, owner, jobs)
SELECT states.state, 0, (SELECT count(*) FROM jobs WHERE jobs.state = states.state)
FROM (VALUES ('done'), ('dead')) AS states (state);

-- Statement triggers: at most one upsert per statement and state, however many rows it
-- changed.
CREATE FUNCTION jobs_count_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO job_counts (state, owner, jobs)
        SELECT state, pg_backend_pid(), count(*) FROM new_rows
        WHERE state IN ('done', 'dead') GROUP BY state
        ON CONFLICT (state, owner) DO UPDATE SET jobs = job_counts.jobs + EXCLUDED.jobs;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO job_counts (state, owner, jobs)
        SELECT state, pg_backend_pid(), -count(*) FROM old_rows
        WHERE state IN ('done', 'dead') GROUP BY state
        ON CONFLICT (state, owner) DO UPDATE SET jobs = job_counts.jobs + EXCLUDED.jobs;
    ELSE
        INSERT INTO job_counts (state, owner, jobs)
        SELECT state, pg_backend_pid(), sum(change) FROM (
            SELECT state, -1 AS change FROM old_rows WHERE state IN ('done', 'dead')
            UNION ALL SELECT state, 1 FROM new_rows WHERE state IN ('done', 'dead')) AS changes
        GROUP BY state HAVING sum(change) <> 0
        ON CONFLICT (state, owner) DO UPDATE SET jobs = job_counts.jobs + EXCLUDED.jobs;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_changes();
CREATE TRIGGER jobs_count_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_changes();
CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_changes();
