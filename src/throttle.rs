//! Throttled warnings: a failure that repeats every few milliseconds (a full disk, no file
//! descriptors left) is logged once, then summed up at most once a minute.

use std::time::{Duration, Instant};

/// How often a repeating failure is summed up in the log.
const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);

/// One kind of repeating failure, owned by the one loop that meets it.
pub struct Throttled {
    what: &'static str,
    last_logged: Option<Instant>,
    /// Failures since the last line that said so.
    unlogged: u64,
}

impl Throttled {
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// Records one failure; logs it if it is the first, or if a summary is due.
    pub fn warn(&mut self, error: &str) {
        self.warn_at(error, Instant::now());
    }

    /// The failure stopped: says so if any went unlogged, and starts afresh.
    pub fn recovered(&mut self) {
        if self.last_logged.take().is_some() && self.unlogged > 0 {
            tracing::warn!(
                what = self.what,
                repeated = self.unlogged,
                "recovered after repeated failures"
            );
        }
        self.unlogged = 0;
    }

    /// `true` if this failure was logged.
    fn warn_at(&mut self, error: &str, now: Instant) -> bool {
        let due = self
            .last_logged
            .is_none_or(|last| now.duration_since(last) >= SUMMARY_INTERVAL);
        if !due {
            self.unlogged += 1;
            return false;
        }
        if self.last_logged.is_none() {
            tracing::warn!(error, "{}", self.what);
        } else {
            tracing::warn!(
                error,
                repeated = self.unlogged + 1,
                "{} (still failing; count since the last line)",
                self.what
            );
        }
        self.last_logged = Some(now);
        self.unlogged = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_failure_then_one_line_a_minute() {
        let mut throttled = Throttled::new("checkpoint failed");
        let start = Instant::now();
        assert!(throttled.warn_at("disk full", start));
        let logged = (1..=1200)
            .filter(|i| throttled.warn_at("disk full", start + Duration::from_millis(50 * i)))
            .count();
        assert_eq!(logged, 1, "60 s of failures every 50 ms: one summary line");
        assert_eq!(throttled.unlogged, 0);
        throttled.recovered();
        assert!(
            throttled.warn_at("disk full", start + Duration::from_secs(61)),
            "after a recovery the next failure is news again"
        );
    }
}
