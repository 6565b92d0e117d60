//! Duplicate deliveries per job: counted in memory on the request path, written to the ledger
//! a second after the first one counted, so that a duplicate costs the claim path no write of
//! its own (and a receiver without duplicates no wake-up).
//!
//! The counts are for people (`jobs show`): a crash loses at most the last second of them,
//! and past [`MAX_PENDING`] distinct jobs waiting the rest go uncounted (a flood of replayed
//! deliveries cannot grow memory). Counts the ledger refused (a failover, a lock held too
//! long) wait for the next write, a second later, within the same bound: a failover used to
//! lose them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::job_id::JobId;
use crate::ledger::{now_ms, Ledger};
use crate::logging::Escaped;
use crate::throttle::Throttled;

/// Distinct jobs whose duplicates wait for the next write.
pub const MAX_PENDING: usize = 10_000;
/// How long after the first duplicate counted the counts are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Counts per ledger write: claims commit between two (a long write would hold them back).
const WRITE_BATCH: usize = 256;

#[derive(Default)]
pub struct DuplicateTally {
    /// Per job: duplicates since the last write, and when the last one came (Unix ms).
    pending: Mutex<HashMap<JobId, (u32, i64)>>,
    /// Told when the first duplicate since the last write is counted.
    counted: tokio::sync::Notify,
    /// The ledger refusing the counts, once a second while it lasts: logged once, then rarely.
    refused: Mutex<Option<Throttled>>,
}

impl DuplicateTally {
    pub fn record(&self, job_id: &JobId) {
        self.add(job_id, 1, now_ms());
    }

    /// Adds `count` duplicates of `job_id`, the last at `last`, to those waiting.
    fn add(&self, job_id: &JobId, count: u32, last: i64) {
        let mut pending = self.pending.lock().expect("not poisoned");
        if let Some((counted, latest)) = pending.get_mut(job_id) {
            *counted = counted.saturating_add(count);
            *latest = (*latest).max(last);
        } else if pending.len() < MAX_PENDING {
            if pending.is_empty() {
                self.counted.notify_one();
            }
            pending.insert(job_id.clone(), (count, last));
        }
    }

    /// Writes what was counted since the last write; how many jobs it updated.
    pub async fn flush_once(&self, ledger: &Ledger) -> usize {
        let taken = std::mem::take(&mut *self.pending.lock().expect("not poisoned"));
        if taken.is_empty() {
            return 0;
        }
        let mut seen: Vec<(JobId, u32, i64)> = taken
            .into_iter()
            .map(|(job_id, (count, last))| (job_id, count, last))
            .collect();
        // One order for every writer: concurrent writes lock rows the same way round.
        seen.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut written = 0;
        for batch in seen.chunks(WRITE_BATCH) {
            if let Err(error) = ledger.record_duplicates(batch).await {
                let error = format!(
                    "{} (the deliveries were answered)",
                    Escaped(&error.to_string())
                );
                let mut refused = self.refused.lock().expect("not poisoned");
                refused
                    .get_or_insert_with(|| {
                        Throttled::new(
                            "could not write duplicate counts; they wait for the next write",
                        )
                    })
                    .warn(&error);
                drop(refused);
                for (job_id, count, last) in &seen[written..] {
                    self.add(job_id, *count, *last);
                }
                return written;
            }
            written += batch.len();
        }
        if let Some(refused) = self.refused.lock().expect("not poisoned").as_mut() {
            refused.recovered();
        }
        written
    }

    /// Writes the counts [`FLUSH_EVERY`] after the first one since the last write, until
    /// `stop`, then once more.
    pub async fn run(self: Arc<Self>, ledger: Arc<Ledger>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = self.counted.notified() => {}
                () = stop.cancelled() => break,
            }
            tokio::select! {
                () = tokio::time::sleep(FLUSH_EVERY) => {}
                () = stop.cancelled() => break,
            }
            self.flush_once(&ledger).await;
        }
        self.flush_once(&ledger).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LedgerConfig, SqliteConfig};
    use crate::ledger::{NewClaim, Source};

    /// Regression: a write the ledger refused (here a lock another process held past
    /// `busy_timeout`; in production a failover) lost its counts ("they are lost").
    #[tokio::test(flavor = "multi_thread")]
    async fn counts_the_ledger_refused_are_written_at_the_next_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite3");
        let config = LedgerConfig::Sqlite(SqliteConfig {
            path: path.clone(),
            busy_timeout: Duration::from_millis(50),
            ..SqliteConfig::default()
        });
        let ledger = Ledger::open(&config).await.unwrap();
        let job_id = JobId::parse("popular").unwrap();
        let claim = NewClaim {
            job_id: job_id.clone(),
            event_type: None,
            body: "{}".into(),
            source: Source::Webhook,
            trace_context: None,
            routing: crate::ledger::Routing::default_route(),
        };
        ledger.claim(claim).await.unwrap();
        let tally = DuplicateTally::default();
        tally.record(&job_id);
        tally.record(&job_id);

        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN EXCLUSIVE").unwrap();
        assert_eq!(tally.flush_once(&ledger).await, 0);
        other.execute_batch("COMMIT").unwrap();
        tally.record(&job_id);
        assert_eq!(tally.flush_once(&ledger).await, 1);
        let job = ledger
            .show_job(&JobId::parse("popular").unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(job.duplicates, 3);
        ledger.close().await;
    }
}
