//! The last hour, minute by minute: deliveries by outcome, attempts by result, which secret
//! verified each delivery, how far the sender's clock was off, how long acknowledgements and
//! handler runs took, counted in fixed memory as they happen, for the console. Each finished
//! minute with counts is kept in the ledger too, and read back at the start ([`flush`]), so a
//! restart keeps the hour.

pub mod flush;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::Notify;

/// The series' names, in the order of [`Series::ALL`]; also their columns in the ledger
/// (`minute_rollups`), which stores what is counted here.
pub const COUNT_COLUMNS: [&str; 9] = [
    "claimed",
    "duplicate",
    "refused",
    "unavailable",
    "done",
    "failed",
    "dead",
    "newest_secret",
    "older_secret",
];
/// The timings' names, in the order of [`Timing::ALL`]; in the ledger each has three columns
/// (`_count`, `_total_us`, `_max_us`).
pub const TIMING_COLUMNS: [&str; 2] = ["ack", "run"];

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

    /// Also its column in the ledger.
    pub fn label(self) -> &'static str {
        COUNT_COLUMNS[self as usize]
    }
}

/// What is timed per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// A delivery's wait for its claim (a commit on disk, or the duplicate's read): most of
    /// the time Sume waits for our 2xx.
    Ack,
    /// A handler attempt, start to end.
    Run,
}

impl Timing {
    pub const ALL: [Timing; 2] = [Timing::Ack, Timing::Run];

    /// Also its columns' prefix in the ledger.
    pub fn label(self) -> &'static str {
        TIMING_COLUMNS[self as usize]
    }
}

pub const MINUTES: usize = 60;
const SERIES: usize = Series::ALL.len();

/// The durations of one kind in one minute: enough for the mean and the largest.
struct Durations {
    count: AtomicU64,
    total_us: AtomicU64,
    max_us: AtomicU64,
}

impl Durations {
    const fn new() -> Durations {
        Durations {
            count: AtomicU64::new(0),
            total_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }

    fn clear(&self) {
        for value in [&self.count, &self.total_us, &self.max_us] {
            value.store(0, Relaxed);
        }
    }
}

struct Bucket {
    /// The minute (Unix seconds / 60) the counts are for.
    minute: AtomicI64,
    counts: [AtomicU64; SERIES],
    /// The largest clock skew of a verified delivery, in seconds (either way).
    max_skew: AtomicU64,
    timings: [Durations; Timing::ALL.len()],
}

/// A ring of [`MINUTES`] buckets; a bucket found holding an older minute starts again at 0.
pub struct Rollup {
    buckets: [Bucket; MINUTES],
    /// Told when a bucket starts a new minute: a minute with counts will end (the flush).
    started: Notify,
}

/// The last hour, oldest minute first: per series, one count per minute.
#[derive(Debug, Clone, Serialize)]
pub struct LastHour {
    /// The newest minute (Unix seconds / 60).
    pub until_minute: i64,
    pub series: Vec<(&'static str, Vec<u64>)>,
    /// Per minute, the largest clock skew of a verified delivery (seconds, either way).
    pub max_skew_secs: Vec<u64>,
    /// Per timing (`ack`, `run`), one entry per minute.
    pub timings: Vec<(&'static str, Vec<MinuteTiming>)>,
}

/// One minute of a timing, in milliseconds (0 and 0 when nothing was timed).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MinuteTiming {
    pub count: u64,
    pub mean_ms: f64,
    pub max_ms: f64,
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
                    timings: [const { Durations::new() }; Timing::ALL.len()],
                }
            }; MINUTES],
            started: Notify::const_new(),
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

    pub fn record_timing(&self, timing: Timing, took: Duration) {
        self.record_timing_at(timing, took, this_minute());
    }

    fn record_timing_at(&self, timing: Timing, took: Duration, minute: i64) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let durations = &self.bucket_of(minute).timings[timing as usize];
        durations.count.fetch_add(1, Relaxed);
        durations.total_us.fetch_add(micros, Relaxed);
        durations.max_us.fetch_max(micros, Relaxed);
    }

    fn record_at(&self, series: Series, minute: i64) -> &Bucket {
        let bucket = self.bucket_of(minute);
        bucket.counts[series as usize].fetch_add(1, Relaxed);
        bucket
    }

    /// The bucket of `minute`, cleared first if it held an older minute.
    fn bucket_of(&self, minute: i64) -> &Bucket {
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
            for durations in &bucket.timings {
                durations.clear();
            }
            self.started.notify_one();
        }
        bucket
    }

    /// The bucket of `minute` if it still holds that minute.
    fn bucket(&self, minute: i64) -> Option<&Bucket> {
        let bucket = &self.buckets[minute.rem_euclid(MINUTES as i64) as usize];
        (bucket.minute.load(Relaxed) == minute).then_some(bucket)
    }

    /// Resolves when a bucket started a new minute since the last call (once per call; the
    /// one flush task of a process waits on it).
    async fn minute_started(&self) {
        self.started.notified().await;
    }

    pub fn last_hour(&self) -> LastHour {
        self.last_hour_at(this_minute())
    }

    /// `read` of each minute of the hour up to `now`, oldest first (`None`: nothing recorded).
    fn each_minute<T>(&self, now: i64, read: impl Fn(Option<&Bucket>) -> T) -> Vec<T> {
        (now - MINUTES as i64 + 1..=now)
            .map(|minute| read(self.bucket(minute)))
            .collect()
    }

    fn last_hour_at(&self, now: i64) -> LastHour {
        let series = Series::ALL
            .iter()
            .map(|series| {
                let counts = self.each_minute(now, |bucket| {
                    bucket.map_or(0, |bucket| bucket.counts[*series as usize].load(Relaxed))
                });
                (series.label(), counts)
            })
            .collect();
        let max_skew_secs = self.each_minute(now, |bucket| {
            bucket.map_or(0, |bucket| bucket.max_skew.load(Relaxed))
        });
        let timings = Timing::ALL
            .iter()
            .map(|timing| {
                let minutes = self.each_minute(now, |bucket| {
                    bucket.map_or_else(MinuteTiming::default, |bucket| {
                        let durations = &bucket.timings[*timing as usize];
                        let count = durations.count.load(Relaxed);
                        let ms = |micros: u64| micros as f64 / 1000.0;
                        MinuteTiming {
                            count,
                            mean_ms: ms(durations.total_us.load(Relaxed)) / count.max(1) as f64,
                            max_ms: ms(durations.max_us.load(Relaxed)),
                        }
                    })
                });
                (timing.label(), minutes)
            })
            .collect();
        LastHour {
            until_minute: now,
            series,
            max_skew_secs,
            timings,
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
    fn timings_keep_the_mean_and_the_largest_per_minute_and_start_again_with_it() {
        let rollup = Rollup::new();
        rollup.record_timing_at(Timing::Ack, Duration::from_millis(2), 1_000);
        rollup.record_timing_at(Timing::Ack, Duration::from_millis(6), 1_000);
        rollup.record_timing_at(Timing::Run, Duration::from_secs(3), 1_001);
        let hour = rollup.last_hour_at(1_001);
        let (ack, run) = (&hour.timings[0], &hour.timings[1]);
        assert_eq!((ack.0, run.0), ("ack", "run"));
        let minute = ack.1[MINUTES - 2];
        assert_eq!((minute.count, minute.mean_ms, minute.max_ms), (2, 4.0, 6.0));
        assert_eq!(ack.1[MINUTES - 1].count, 0);
        assert_eq!(run.1[MINUTES - 1].max_ms, 3000.0);
        // An hour later, minute 1000's bucket holds only what the new minute timed.
        rollup.record_timing_at(Timing::Ack, Duration::from_millis(1), 1_060);
        let minute = rollup.last_hour_at(1_060).timings[0].1[MINUTES - 1];
        assert_eq!((minute.count, minute.mean_ms, minute.max_ms), (1, 1.0, 1.0));
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
