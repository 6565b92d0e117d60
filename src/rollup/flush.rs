//! The rollup kept in the ledger: each finished minute with counts written once, soon after it
//! ends, and the current minute at a graceful stop; the last hour read back at the start. A
//! crash loses the minutes not yet written (at most the current one and the one that just
//! ended).
//!
//! A receiver with nothing to count neither writes nor wakes: the task sleeps until a bucket
//! starts a new minute (the first count of that minute), then until that minute has ended.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::{this_minute, Rollup, MINUTES};
use crate::ledger::{Ledger, MinuteRollup, StorageError};
use crate::logging::Escaped;

/// How long after its end a minute is written: counts recorded as it ended land first.
pub const FLUSH_DELAY: Duration = Duration::from_secs(2);

pub struct RollupFlush {
    ledger: Arc<Ledger>,
    rollup: &'static Rollup,
    /// The newest minute written; at the start, the minute before it (the minutes before are
    /// in the ledger already, or were never counted by this process).
    written_through: AtomicI64,
}

impl RollupFlush {
    pub fn new(ledger: Arc<Ledger>, rollup: &'static Rollup) -> RollupFlush {
        RollupFlush {
            ledger,
            rollup,
            written_through: AtomicI64::new(this_minute() - 1),
        }
    }

    /// Puts the last hour the ledger kept back in the ring (at the start, before serving); how
    /// many minutes. One read of at most [`MINUTES`] rows, by the table's key.
    pub async fn restore(&self) -> Result<usize, StorageError> {
        let now = this_minute();
        let kept = self
            .ledger
            .rollups_since(now - MINUTES as i64 + 1, MINUTES)
            .await?;
        for minute in &kept {
            self.rollup.restore(minute, now);
        }
        Ok(kept.len())
    }

    /// Writes the minutes before `until` (Unix seconds / 60) not written yet that counted
    /// anything, still in the ring; how many.
    pub async fn flush_before(&self, until: i64) -> Result<usize, StorageError> {
        let first = (self.written_through.load(Relaxed) + 1).max(until - MINUTES as i64);
        let mut written = 0;
        for minute in first..until {
            if let Some(kept) = self.rollup.kept(minute) {
                self.ledger.store_rollup(&kept).await?;
                written += 1;
            }
            self.written_through.store(minute, Relaxed);
        }
        Ok(written)
    }

    /// At a graceful stop, once nothing counts any more: the minutes not written yet, the
    /// current one too (its end is written again after the next start, if it comes within it).
    pub async fn flush_at_stop(&self) {
        self.flush_logged(this_minute() + 1).await;
    }

    async fn flush_logged(&self, until: i64) {
        if let Err(error) = self.flush_before(until).await {
            let error = error.to_string();
            tracing::warn!(error = %Escaped(&error), "could not keep the console's minutes in the ledger; the next write tries again");
        }
    }

    /// Writes each minute that counted anything [`FLUSH_DELAY`] after its end, until `stop`
    /// (then [`RollupFlush::flush_at_stop`] writes the rest).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = self.rollup.minute_started() => {}
                () = stop.cancelled() => break,
            }
            tokio::select! {
                () = tokio::time::sleep(until_the_minute_ends() + FLUSH_DELAY) => {}
                () = stop.cancelled() => break,
            }
            self.flush_logged(this_minute()).await;
        }
    }
}

fn until_the_minute_ends() -> Duration {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_secs(60 - since.as_secs() % 60)
        - Duration::from_nanos(since.subsec_nanos().into())
}

/// The ring's minutes as the ledger's rows: written here, with the task that writes them, so
/// that the ring itself knows nothing of the ledger (the ledger records into it, via metrics).
impl Rollup {
    /// `minute` as the ledger keeps it, if the ring still holds it and anything was counted.
    fn kept(&self, minute: i64) -> Option<MinuteRollup> {
        let bucket = self.bucket(minute)?;
        let signed = |value: &AtomicU64| i64::try_from(value.load(Relaxed)).unwrap_or(i64::MAX);
        let rollup = MinuteRollup {
            minute,
            counts: bucket.counts.each_ref().map(signed),
            max_skew_secs: signed(&bucket.max_skew),
            timings: bucket
                .timings
                .each_ref()
                .map(|d| [&d.count, &d.total_us, &d.max_us].map(signed)),
        };
        let mut counted = rollup
            .counts
            .iter()
            .chain(rollup.timings.iter().map(|t| &t[0]));
        counted.any(|count| *count > 0).then_some(rollup)
    }

    /// Puts a minute the ledger kept back in its bucket, if it is in the hour up to `now`. Each
    /// value is the larger of the kept and the counted: after a restart the bucket is empty,
    /// and in the process that wrote the minute the bucket never counts less than it wrote.
    fn restore(&self, kept: &MinuteRollup, now: i64) {
        if kept.minute > now || kept.minute <= now - MINUTES as i64 {
            return;
        }
        let bucket = self.bucket_of(kept.minute);
        let unsigned = |value: i64| u64::try_from(value).unwrap_or(0);
        for (count, value) in bucket.counts.iter().zip(kept.counts) {
            count.fetch_max(unsigned(value), Relaxed);
        }
        bucket
            .max_skew
            .fetch_max(unsigned(kept.max_skew_secs), Relaxed);
        for (durations, [count, total_us, max_us]) in bucket.timings.iter().zip(kept.timings) {
            durations.count.fetch_max(unsigned(count), Relaxed);
            durations.total_us.fetch_max(unsigned(total_us), Relaxed);
            durations.max_us.fetch_max(unsigned(max_us), Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LedgerConfig, SqliteConfig};
    use crate::rollup::{Series, Timing};

    async fn ledger_in(dir: &std::path::Path) -> Arc<Ledger> {
        let config = LedgerConfig::Sqlite(SqliteConfig {
            path: dir.join("ledger.sqlite3"),
            ..SqliteConfig::default()
        });
        Ledger::open(&config).await.unwrap()
    }

    /// A flush of `rollup` whose newest minute written is `minute`.
    fn flushing_after(minute: i64, ledger: &Arc<Ledger>, rollup: &'static Rollup) -> RollupFlush {
        RollupFlush {
            ledger: ledger.clone(),
            rollup,
            written_through: AtomicI64::new(minute),
        }
    }

    fn fresh_rollup() -> &'static Rollup {
        Box::leak(Box::new(Rollup::new()))
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn each_minute_that_counted_is_kept_once_an_idle_one_never_and_a_restart_reads_them_back()
    {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path()).await;
        let now = this_minute();
        let counted = fresh_rollup();
        let flush = flushing_after(now - 10, &ledger, counted);
        counted.record_at(Series::Claimed, now - 5);
        counted.record_at(Series::Claimed, now - 5);
        counted.record_timing_at(Timing::Ack, Duration::from_millis(3), now - 5);
        counted.record_at(Series::Dead, now - 3);
        counted.record_at(Series::Claimed, now);

        assert_eq!(
            flush.flush_before(now).await.unwrap(),
            2,
            "minute now-4 was idle"
        );
        assert_eq!(
            flush.flush_before(now).await.unwrap(),
            0,
            "each minute once"
        );
        let kept = ledger.rollups_since(now - 60, 60).await.unwrap();
        let minutes: Vec<i64> = kept.iter().map(|kept| kept.minute).collect();
        assert_eq!(
            minutes,
            [now - 5, now - 3],
            "the current minute waits for its end"
        );
        assert_eq!(kept[0].counts[Series::Claimed as usize], 2);
        assert_eq!(kept[0].timings[Timing::Ack as usize], [1, 3_000, 3_000]);

        // The next start, in a process whose ring is empty.
        let restarted = fresh_rollup();
        let flush = RollupFlush::new(ledger.clone(), restarted);
        assert_eq!(flush.restore().await.unwrap(), 2);
        let hour = restarted.last_hour_at(now);
        let at = |minutes_ago: usize| MINUTES - 1 - minutes_ago;
        assert_eq!(hour.series[Series::Claimed as usize].1[at(5)], 2);
        assert_eq!(hour.series[Series::Dead as usize].1[at(3)], 1);
        assert_eq!(hour.timings[Timing::Ack as usize].1[at(5)].max_ms, 3.0);
        assert_eq!(hour.series[Series::Claimed as usize].1[at(0)], 0);
        ledger.close().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_minute_written_at_a_stop_is_written_whole_after_a_start_within_it() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path()).await;
        let now = this_minute();
        let before_stop = fresh_rollup();
        let flush = flushing_after(now - 1, &ledger, before_stop);
        before_stop.record_at(Series::Done, now);
        flush.flush_before(now + 1).await.unwrap();

        let after_start = fresh_rollup();
        let flush = flushing_after(now - 1, &ledger, after_start);
        flush.restore().await.unwrap();
        after_start.record_at(Series::Done, now);
        flush.flush_before(now + 1).await.unwrap();
        let kept = ledger.rollups_since(now, 60).await.unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(
            kept[0].counts[Series::Done as usize],
            2,
            "one before, one after"
        );
        ledger.close().await;
    }
}
