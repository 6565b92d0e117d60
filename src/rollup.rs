//! The last hour, minute by minute: deliveries by outcome and attempts by result, counted in
//! fixed memory as they happen, for the console's charts (never read back from the ledger).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// What is counted per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    Claimed,
    Duplicate,
    /// 401, 400, 413
    Refused,
    /// 503: overloaded or storage unavailable
    Unavailable,
    Done,
    Failed,
    Dead,
}

impl Series {
    pub const ALL: [Series; 7] = [
        Series::Claimed,
        Series::Duplicate,
        Series::Refused,
        Series::Unavailable,
        Series::Done,
        Series::Failed,
        Series::Dead,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Series::Claimed => "claimed",
            Series::Duplicate => "duplicate",
            Series::Refused => "refused",
            Series::Unavailable => "unavailable",
            Series::Done => "done",
            Series::Failed => "failed",
            Series::Dead => "dead",
        }
    }
}

pub const MINUTES: usize = 60;
const SERIES: usize = Series::ALL.len();

struct Bucket {
    /// The minute (Unix seconds / 60) the counts are for.
    minute: AtomicI64,
    counts: [AtomicU64; SERIES],
}

/// A ring of [`MINUTES`] buckets; a bucket found holding an older minute starts again at 0.
pub struct Rollup {
    buckets: [Bucket; MINUTES],
}

/// The last hour, oldest minute first: per series, one count per minute.
#[derive(Debug, Clone, Serialize)]
pub struct LastHour {
    /// The newest minute (Unix seconds / 60).
    pub until_minute: i64,
    pub series: Vec<(&'static str, Vec<u64>)>,
}

fn this_minute() -> i64 {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    i64::try_from(seconds / 60).unwrap_or(i64::MAX)
}

impl Rollup {
    pub const fn new() -> Rollup {
        Rollup {
            buckets: [const {
                Bucket {
                    minute: AtomicI64::new(-1),
                    counts: [const { AtomicU64::new(0) }; SERIES],
                }
            }; MINUTES],
        }
    }

    pub fn record(&self, series: Series) {
        self.record_at(series, this_minute());
    }

    fn record_at(&self, series: Series, minute: i64) {
        let bucket = &self.buckets[minute.rem_euclid(MINUTES as i64) as usize];
        let held = bucket.minute.load(Relaxed);
        // One thread wins the turn of the minute and clears the counts; a count that lands
        // in between is lost, not misplaced by an hour.
        if held != minute
            && bucket
                .minute
                .compare_exchange(held, minute, Relaxed, Relaxed)
                .is_ok()
        {
            for count in &bucket.counts {
                count.store(0, Relaxed);
            }
        }
        bucket.counts[series as usize].fetch_add(1, Relaxed);
    }

    pub fn last_hour(&self) -> LastHour {
        self.last_hour_at(this_minute())
    }

    fn last_hour_at(&self, now: i64) -> LastHour {
        let series = Series::ALL
            .iter()
            .map(|series| {
                let counts = (now - MINUTES as i64 + 1..=now)
                    .map(|minute| {
                        let bucket = &self.buckets[minute.rem_euclid(MINUTES as i64) as usize];
                        if bucket.minute.load(Relaxed) == minute {
                            bucket.counts[*series as usize].load(Relaxed)
                        } else {
                            0
                        }
                    })
                    .collect();
                (series.label(), counts)
            })
            .collect();
        LastHour {
            until_minute: now,
            series,
        }
    }
}

pub static ROLLUP: Rollup = Rollup::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_count_apart_and_an_hour_old_bucket_starts_again() {
        let rollup = Rollup::new();
        rollup.record_at(Series::Claimed, 1_000);
        rollup.record_at(Series::Claimed, 1_000);
        rollup.record_at(Series::Dead, 1_001);
        let hour = rollup.last_hour_at(1_001);
        let claimed = &hour.series[0].1;
        assert_eq!((claimed[MINUTES - 2], claimed[MINUTES - 1]), (2, 0));
        assert_eq!(hour.series[6].1[MINUTES - 1], 1);
        // An hour later minute 1000's bucket holds the new minute only.
        rollup.record_at(Series::Claimed, 1_060);
        let hour = rollup.last_hour_at(1_060);
        assert_eq!(
            hour.series[0].1.iter().sum::<u64>(),
            1,
            "minute 1000's two are gone"
        );
        assert_eq!(
            hour.series[6].1.iter().sum::<u64>(),
            1,
            "minute 1001 is in the hour"
        );
        let later = rollup.last_hour_at(1_061);
        assert_eq!(
            later.series[6].1.iter().sum::<u64>(),
            0,
            "and now it is not"
        );
    }
}
