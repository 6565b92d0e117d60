//! Duplicate deliveries per job: counted in memory on the request path, written to the ledger
//! a second after the first one counted, so that a duplicate costs the claim path no write of
//! its own (and a receiver without duplicates no wake-up).
//!
//! The counts are for people (`jobs show`): a crash loses at most the last second of them,
//! and past [`MAX_PENDING`] distinct jobs in one second the rest go uncounted (a flood of
//! replayed deliveries cannot grow memory).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::job_id::JobId;
use crate::ledger::{now_ms, Ledger};
use crate::logging::Escaped;

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
}

impl DuplicateTally {
    pub fn record(&self, job_id: &JobId) {
        let now = now_ms();
        let mut pending = self.pending.lock().expect("not poisoned");
        if let Some((count, last)) = pending.get_mut(job_id) {
            *count = count.saturating_add(1);
            *last = now;
        } else if pending.len() < MAX_PENDING {
            if pending.is_empty() {
                self.counted.notify_one();
            }
            pending.insert(job_id.clone(), (1, now));
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
                let error = error.to_string();
                let lost = seen.len() - written;
                tracing::warn!(jobs = lost, error = %Escaped(&error), "could not write duplicate counts; they are lost (the deliveries were answered)");
                break;
            }
            written += batch.len();
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
