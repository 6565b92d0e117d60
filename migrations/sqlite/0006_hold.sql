-- The hold: the workers (of every receiver) start no attempt while the handler's downstream
-- looks down, but one probe at a time (src/hold.rs). No row: no hold. `jobs resume` deletes it.
CREATE TABLE dispatch_hold (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    since             INTEGER NOT NULL,
    reason            TEXT NOT NULL,
    sample_error      TEXT NOT NULL,
    next_probe_at     INTEGER NOT NULL,
    probe_interval_ms INTEGER NOT NULL
) STRICT;
