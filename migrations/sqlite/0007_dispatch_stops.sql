-- Every stop of dispatch, a pause by an operator or an outage hold (src/hold.rs), with when it
-- began and ended (NULL while it lasts): a job's timeline names the stops that delayed it, also
-- after they ended. Retention forgets a stop once it ended as long ago as forgotten jobs did.
CREATE TABLE dispatch_stops (
    id         INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind = 'pause' OR kind = 'hold'),
    started_at INTEGER NOT NULL,
    -- A pause: who paused.
    started_by TEXT,
    -- A pause: why, if the operator said; a hold: its cause.
    reason     TEXT,
    ended_at   INTEGER,
    -- Who resumed; NULL for a hold that ended when an attempt succeeded.
    ended_by   TEXT
) STRICT;
-- Pauses never overlap pauses, nor holds holds: a job's stops are those begun while it waited,
-- and the last of each kind begun before (two ranges of this index).
CREATE INDEX dispatch_stops_started ON dispatch_stops (kind, started_at);
-- The open stops (NULL), and retention's range.
CREATE INDEX dispatch_stops_ended ON dispatch_stops (ended_at);
-- A pause or a hold open at the upgrade is a stop, so that its end is recorded.
INSERT INTO dispatch_stops (kind, started_at, started_by)
    SELECT 'pause', coalesce(changed_at, 0), changed_by FROM dispatch WHERE paused = 1;
INSERT INTO dispatch_stops (kind, started_at, reason)
    SELECT 'hold', since, reason FROM dispatch_hold;
