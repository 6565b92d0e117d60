-- Every stop of dispatch, shared by every receiver (see migrations/sqlite/0007_dispatch_stops.sql).
CREATE TABLE dispatch_stops (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('pause', 'hold')),
    started_at bigint NOT NULL,
    started_by text,
    reason     text,
    ended_at   bigint,
    ended_by   text
);
CREATE INDEX dispatch_stops_started ON dispatch_stops (kind, started_at);
CREATE INDEX dispatch_stops_ended ON dispatch_stops (ended_at);
INSERT INTO dispatch_stops (kind, started_at, started_by)
    SELECT 'pause', coalesce(changed_at, 0), changed_by FROM dispatch WHERE paused;
INSERT INTO dispatch_stops (kind, started_at, reason)
    SELECT 'hold', since, reason FROM dispatch_hold;
