-- The console's last hour, kept: one row per receiver and minute with that minute's counts, the
-- largest clock skew and the sums and maxima of its timings (src/rollup/), written soon after
-- the minute ends (a minute with nothing counted writes no row) and read back at the start, so
-- that a restart does not wipe the charts. On SQLite one receiver: `receiver` is ''. The key
-- leads with the minute: the start's read of the last hour and retention's delete of old rows
-- are both ranges of it. Retention keeps a day.
CREATE TABLE minute_rollups (
    minute         INTEGER NOT NULL,
    receiver       TEXT    NOT NULL,
    claimed        INTEGER NOT NULL,
    duplicate      INTEGER NOT NULL,
    refused        INTEGER NOT NULL,
    unavailable    INTEGER NOT NULL,
    done           INTEGER NOT NULL,
    failed         INTEGER NOT NULL,
    dead           INTEGER NOT NULL,
    newest_secret  INTEGER NOT NULL,
    older_secret   INTEGER NOT NULL,
    max_skew_secs  INTEGER NOT NULL,
    ack_count      INTEGER NOT NULL,
    ack_total_us   INTEGER NOT NULL,
    ack_max_us     INTEGER NOT NULL,
    run_count      INTEGER NOT NULL,
    run_total_us   INTEGER NOT NULL,
    run_max_us     INTEGER NOT NULL,
    PRIMARY KEY (minute, receiver)
) STRICT, WITHOUT ROWID;
