-- The hold, shared by every receiver (see migrations/sqlite/0006_hold.sql). No row: no hold.
CREATE TABLE dispatch_hold (
    id                integer PRIMARY KEY CHECK (id = 1),
    since             bigint NOT NULL,
    reason            text NOT NULL,
    sample_error      text NOT NULL,
    next_probe_at     bigint NOT NULL,
    probe_interval_ms bigint NOT NULL
);
