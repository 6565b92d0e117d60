//! The last hour, minute by minute: deliveries by outcome, attempts by result, which secret
//! verified each delivery and how far the sender's clock was off, counted in fixed memory as
//! they happen, for the console (never read back from the ledger).

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
    /// Verified by the newest secret (the first configured)
    NewestSecret,
    /// Verified by an older one: a rotation still in progress at Sume
    OlderSecret,
}

impl Series {
    pub const ALL: [Series; 9] = [
        Series::Claimed,
        Series::Duplicate,
        Series::Refused,
        Series::Unavailable,
        Series::Done,
        Series::Failed,
        Series::Dead,
        Series::NewestSecret,
        Series::OlderSecret,
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
            Series::NewestSecret => "newest_secret",
            Series::OlderSecret => "older_secret",
        }
    }
}

pub const MINUTES: usize = 60;
const SERIES: usize = Series::ALL.len();

struct Bucket {
    /// The minute (Unix seconds / 60) the counts are for.
    minute: AtomicI64,
    counts: [AtomicU64; SERIES],
    /// The largest clock skew of a verified delivery, in seconds (either way).
    max_skew: AtomicU64,
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
    /// Per minute, the largest clock skew of a verified delivery (seconds, either way).
    pub max_skew_secs: Vec<u64>,
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
                    max_skew: AtomicU64::new(0),
                }
            }; MINUTES],
        }
    }

    pub fn record(&self, series: Series) {
        self.record_at(series, this_minute());
    }

    /// A verified delivery: which secret (its index, 0 the newest) and the clock skew.
    pub fn record_verified(&self, secret: usize, skew_secs: i64) {
        let minute = this_minute();
        let series = if secret == 0 {
            Series::NewestSecret
        } else {
            Series::OlderSecret
        };
        self.record_at(series, minute)
            .max_skew
            .fetch_max(skew_secs.unsigned_abs(), Relaxed);
    }

    fn record_at(&self, series: Series, minute: i64) -> &Bucket {
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
            bucket.max_skew.store(0, Relaxed);
        }
        bucket.counts[series as usize].fetch_add(1, Relaxed);
        bucket
    }

    /// The bucket of `minute` if it still holds that minute.
    fn bucket(&self, minute: i64) -> Option<&Bucket> {
        let bucket = &self.buckets[minute.rem_euclid(MINUTES as i64) as usize];
        (bucket.minute.load(Relaxed) == minute).then_some(bucket)
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
                        self.bucket(minute)
                            .map_or(0, |bucket| bucket.counts[*series as usize].load(Relaxed))
                    })
                    .collect();
                (series.label(), counts)
            })
            .collect();
        let max_skew_secs = (now - MINUTES as i64 + 1..=now)
            .map(|minute| {
                self.bucket(minute)
                    .map_or(0, |bucket| bucket.max_skew.load(Relaxed))
            })
            .collect();
        LastHour {
            until_minute: now,
            series,
            max_skew_secs,
        }
    }
}

pub static ROLLUP: Rollup = Rollup::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verified_deliveries_count_by_secret_and_keep_the_largest_skew() {
        let rollup = Rollup::new();
        let minute = this_minute();
        rollup.record_verified(0, 3);
        rollup.record_verified(1, -40);
        rollup.record_verified(0, 12);
        let hour = rollup.last_hour_at(minute);
        let count = |label| hour.series.iter().find(|(l, _)| *l == label).unwrap().1[MINUTES - 1];
        assert_eq!((count("newest_secret"), count("older_secret")), (2, 1));
        assert_eq!(hour.max_skew_secs[MINUTES - 1], 40);
    }

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
