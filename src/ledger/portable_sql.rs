//! The SQL that reads the same in SQLite's dialect and PostgreSQL's: the counts behind the
//! metrics. Written once; each backend runs it.

/// Reads only the partial indexes of unfinished rows, so a scrape costs the same
/// however much history the ledger holds.
pub const COUNT_UNFINISHED_SQL: &str =
    "SELECT state, count(*) FROM jobs WHERE state IN ('claimed', 'retrying') GROUP BY state
     UNION ALL
     SELECT 'running', count(*) FROM jobs WHERE state = 'running'";
pub const OLDEST_UNFINISHED_SQL: &str = "SELECT min(received_at) FROM (
         SELECT received_at FROM jobs WHERE state IN ('claimed', 'retrying')
         UNION ALL SELECT received_at FROM jobs WHERE state = 'running') AS unfinished";
/// Walks the index of finished jobs: for the start and the retention runs, not for
/// every scrape.
pub const COUNT_FINISHED_SQL: &str =
    "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'dead')
     FROM jobs WHERE state IN ('done', 'dead')";
