-- The console's last hour, kept (see migrations/sqlite/0007_minute_rollups.sql): one row per
-- receiver (its lease name: the host name and the port it listens on) and minute, so that receivers
-- sharing the database each keep their own minutes.
CREATE TABLE minute_rollups (
    minute         bigint NOT NULL,
    receiver       text   NOT NULL,
    claimed        bigint NOT NULL,
    duplicate      bigint NOT NULL,
    refused        bigint NOT NULL,
    unavailable    bigint NOT NULL,
    done           bigint NOT NULL,
    failed         bigint NOT NULL,
    dead           bigint NOT NULL,
    newest_secret  bigint NOT NULL,
    older_secret   bigint NOT NULL,
    max_skew_secs  bigint NOT NULL,
    ack_count      bigint NOT NULL,
    ack_total_us   bigint NOT NULL,
    ack_max_us     bigint NOT NULL,
    run_count      bigint NOT NULL,
    run_total_us   bigint NOT NULL,
    run_max_us     bigint NOT NULL,
    PRIMARY KEY (minute, receiver)
);
