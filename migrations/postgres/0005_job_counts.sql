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

-- Row triggers for inserts and state changes, with WHEN conditions that PostgreSQL checks
-- before it queues anything: a claim (inserted `claimed`) or a start costs no call and no
-- transition table. Deletes (retention's batches of finished jobs) are counted once per
-- statement.
CREATE FUNCTION jobs_count_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state IN ('done', 'dead') THEN
        INSERT INTO job_counts (state, owner, jobs) VALUES (OLD.state, pg_backend_pid(), -1)
        ON CONFLICT (state, owner) DO UPDATE SET jobs = job_counts.jobs - 1;
    END IF;
    IF NEW.state IN ('done', 'dead') THEN
        INSERT INTO job_counts (state, owner, jobs) VALUES (NEW.state, pg_backend_pid(), 1)
        ON CONFLICT (state, owner) DO UPDATE SET jobs = job_counts.jobs + 1;
    END IF;
    RETURN NULL;
END
$$;
CREATE FUNCTION jobs_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_counts (state, owner, jobs)
    SELECT state, pg_backend_pid(), -count(*) FROM old_rows
    WHERE state IN ('done', 'dead') GROUP BY state
    ON CONFLICT (state, owner) DO UPDATE SET jobs = job_counts.jobs + EXCLUDED.jobs;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs FOR EACH ROW
    WHEN (NEW.state IN ('done', 'dead')) EXECUTE FUNCTION jobs_count_row();
CREATE TRIGGER jobs_count_update AFTER UPDATE OF state ON jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND (OLD.state IN ('done', 'dead') OR NEW.state IN ('done', 'dead')))
    EXECUTE FUNCTION jobs_count_row();
CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_deleted();
