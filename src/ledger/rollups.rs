//! The console's minutes as the ledger keeps them (`minute_rollups`): one row per receiver and
//! minute, and its SQL, written once for both dialects.

use super::portable_sql::Dialect;
use crate::rollup::{COUNT_COLUMNS, TIMING_COLUMNS};

/// One minute of one receiver: absolute values, so that writing a minute again (a partial
/// minute at a stop, then the whole of it after the start) replaces it and never adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MinuteRollup {
    /// Unix seconds / 60.
    pub minute: i64,
    /// In the order of [`COUNT_COLUMNS`].
    pub counts: [i64; COUNT_COLUMNS.len()],
    /// The largest clock skew of a verified delivery, in seconds.
    pub max_skew_secs: i64,
    /// In the order of [`TIMING_COLUMNS`]: how many, their sum and the largest, in µs.
    pub timings: [[i64; 3]; TIMING_COLUMNS.len()],
}

/// Columns after `minute` and `receiver`.
const VALUES: usize = COUNT_COLUMNS.len() + 1 + 3 * TIMING_COLUMNS.len();

impl MinuteRollup {
    /// The values after `minute`, in the table's column order.
    pub fn values(&self) -> [i64; VALUES] {
        let mut values = [0; VALUES];
        let timings = self.timings.iter().flatten();
        let all = self
            .counts
            .iter()
            .chain([&self.max_skew_secs])
            .chain(timings);
        for (value, from) in values.iter_mut().zip(all) {
            *value = *from;
        }
        values
    }

    /// A row read by [`select_sql`]: `minute`, then [`MinuteRollup::values`].
    pub fn from_columns(column: impl Fn(usize) -> i64) -> MinuteRollup {
        let mut rollup = MinuteRollup {
            minute: column(0),
            max_skew_secs: column(1 + COUNT_COLUMNS.len()),
            ..MinuteRollup::default()
        };
        for (index, count) in rollup.counts.iter_mut().enumerate() {
            *count = column(1 + index);
        }
        for (index, value) in rollup.timings.iter_mut().flatten().enumerate() {
            *value = column(2 + COUNT_COLUMNS.len() + index);
        }
        rollup
    }
}

/// The value columns, comma-separated, in [`MinuteRollup::values`]' order.
fn value_columns() -> Vec<String> {
    let timings = TIMING_COLUMNS.iter().flat_map(|t| {
        [
            format!("{t}_count"),
            format!("{t}_total_us"),
            format!("{t}_max_us"),
        ]
    });
    COUNT_COLUMNS
        .iter()
        .map(|column| (*column).to_owned())
        .chain(["max_skew_secs".to_owned()])
        .chain(timings)
        .collect()
}

/// Writes one minute: parameters minute, receiver, then [`MinuteRollup::values`].
pub fn upsert_sql(d: Dialect) -> String {
    let columns = value_columns();
    let placeholders: Vec<String> = (1..=columns.len() + 2).map(|n| d.at(n)).collect();
    let updates: Vec<String> = columns
        .iter()
        .map(|column| format!("{column} = excluded.{column}"))
        .collect();
    format!(
        "INSERT INTO minute_rollups (minute, receiver, {}) VALUES ({})
         ON CONFLICT (minute, receiver) DO UPDATE SET {}",
        columns.join(", "),
        placeholders.join(", "),
        updates.join(", ")
    )
}

/// A receiver's minutes from a minute on, oldest first: parameters receiver, the first
/// minute, how many at most; a range of the primary key.
pub fn select_sql(d: Dialect) -> String {
    format!(
        "SELECT minute, {} FROM minute_rollups
         WHERE minute >= {} AND receiver = {} ORDER BY minute LIMIT {}",
        value_columns().join(", "),
        d.at(2),
        d.at(1),
        d.at(3)
    )
}

/// The retention step: forgets at most the second parameter's rows of minutes before the
/// first (Unix ms), every receiver's.
pub fn delete_old_sql(d: Dialect) -> String {
    let lock = match d {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
    };
    format!(
        "DELETE FROM minute_rollups WHERE (minute, receiver) IN (
             SELECT minute, receiver FROM minute_rollups WHERE minute < CAST({} AS BIGINT) / 60000
             LIMIT {}{lock})",
        d.at(1),
        d.at(2)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_the_same_minute() {
        let rollup = MinuteRollup {
            minute: 29_000_000,
            counts: [1, 2, 3, 4, 5, 6, 7, 8, 9],
            max_skew_secs: 10,
            timings: [[11, 12, 13], [14, 15, 16]],
        };
        let values = rollup.values();
        assert_eq!(values.len(), value_columns().len());
        let read = MinuteRollup::from_columns(|index| match index {
            0 => rollup.minute,
            _ => values[index - 1],
        });
        assert_eq!(read, rollup);
    }
}
