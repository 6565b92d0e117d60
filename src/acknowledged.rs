//! The job_ids acknowledged in the last minutes: a duplicate of one is answered from memory.
//!
//! Sume resends a delivery whose answer it did not get (lost, or later than its 10 s timeout)
//! every 30 s (its default), up to 10 attempts: those duplicates come within minutes of the
//! claim. Answered from here, a duplicate costs a hash look-up instead of a trip through the
//! ledger (on SQLite, the writer's queue, a transaction and two thread wake-ups).
//!
//! Only a job_id the ledger has answered for is remembered: its claim committed and on disk, or
//! found there. So "duplicate" from here promises nothing the ledger's own answer would not,
//! and a claim the ledger failed is not remembered. The memory is bounded: at most
//! [`CAPACITY`] job_ids (255 bytes each at most), the oldest dropped first, each for
//! [`REMEMBER_FOR`].
//!
//! This process's retention forgets all of them whenever it forgets any job_id (`dedupe_ttl`).
//! (A duplicate the ledger answered for just before such a run may be remembered after it, for up
//! to [`REMEMBER_FOR`]: a job_id at the very edge of `dedupe_ttl`, whose forgetting already waits
//! up to a retention `interval`.)
//!
//! A job_id removed from the ledger by someone else (the command line's `vacuum`, another
//! receiver on the same PostgreSQL database, a DELETE by hand) is still answered "duplicate"
//! here until [`REMEMBER_FOR`] after this process acknowledged it.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::job_id::JobId;

/// Job_ids remembered at most: 5-8 MiB of peak RSS with the benchmark's 27-byte ids (bench/run.sh),
/// roughly twice that with 255-byte ones.
pub const CAPACITY: usize = 32_768;
/// Sume's retries of one delivery span about 6 minutes (9 delays of 30 s, 10 timeouts of 10 s).
pub const REMEMBER_FOR: Duration = Duration::from_secs(600);
/// Independent locks, so that the runtime's worker threads seldom wait for each other.
const SHARDS: usize = 16;

pub struct RecentlyAcknowledged {
    /// Picks a job_id's shard; keyed per process like the shards' own maps.
    shard_of: RandomState,
    shards: [Mutex<Shard>; SHARDS],
}

#[derive(Default)]
struct Shard {
    /// When the ledger last answered for each job_id.
    answered_at: HashMap<JobId, Instant>,
    /// The same job_ids, in the order they were first remembered: the oldest is dropped first.
    order: VecDeque<JobId>,
}

impl Default for RecentlyAcknowledged {
    fn default() -> Self {
        Self {
            shard_of: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

impl RecentlyAcknowledged {
    /// Whether the ledger answered for `job_id` less than [`REMEMBER_FOR`] before `now`.
    pub fn contains(&self, job_id: &JobId, now: Instant) -> bool {
        let shard = self.shard(job_id).lock().expect("not poisoned");
        shard
            .answered_at
            .get(job_id)
            .is_some_and(|at| now.saturating_duration_since(*at) < REMEMBER_FOR)
    }

    /// Remembers that the ledger answered for `job_id` (claimed, or already there) at `now`.
    pub fn remember(&self, job_id: &JobId, now: Instant) {
        let mut shard = self.shard(job_id).lock().expect("not poisoned");
        if let Some(at) = shard.answered_at.get_mut(job_id) {
            *at = now;
            return;
        }
        if shard.order.len() >= CAPACITY / SHARDS {
            if let Some(oldest) = shard.order.pop_front() {
                shard.answered_at.remove(&oldest);
            }
        }
        shard.order.push_back(job_id.clone());
        shard.answered_at.insert(job_id.clone(), now);
    }

    /// Forgets every job_id: the ledger may have forgotten any of them.
    pub fn forget_all(&self) {
        for shard in &self.shards {
            *shard.lock().expect("not poisoned") = Shard::default();
        }
    }

    fn shard(&self, job_id: &JobId) -> &Mutex<Shard> {
        &self.shards[self.shard_of.hash_one(job_id) as usize % SHARDS]
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let lengths = self.shards.iter().map(|shard| {
            let shard = shard.lock().expect("not poisoned");
            assert_eq!(shard.order.len(), shard.answered_at.len());
            shard.order.len()
        });
        lengths.sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> JobId {
        JobId::parse(text).unwrap()
    }

    #[test]
    fn a_job_id_is_remembered_for_remember_for_after_the_ledgers_last_answer() {
        let recent = RecentlyAcknowledged::default();
        let start = Instant::now();
        assert!(!recent.contains(&id("job-1"), start));
        recent.remember(&id("job-1"), start);
        assert!(recent.contains(&id("job-1"), start));
        assert!(!recent.contains(&id("job-2"), start));
        let almost = start + REMEMBER_FOR - Duration::from_millis(1);
        assert!(recent.contains(&id("job-1"), almost));
        assert!(!recent.contains(&id("job-1"), start + REMEMBER_FOR));
        // A later answer of the ledger starts the time again.
        recent.remember(&id("job-1"), almost);
        assert!(recent.contains(&id("job-1"), start + REMEMBER_FOR));
        assert_eq!(recent.len(), 1);
    }

    #[test]
    fn past_capacity_the_oldest_job_ids_are_dropped_first() {
        let recent = RecentlyAcknowledged::default();
        let now = Instant::now();
        let ids: Vec<JobId> = (0..CAPACITY * 2).map(|i| id(&format!("job-{i}"))).collect();
        for job_id in &ids {
            recent.remember(job_id, now);
        }
        // Each shard holds its share; the ids spread unevenly, so some hold fewer.
        let kept = recent.len();
        assert!(kept <= CAPACITY && kept > CAPACITY * 3 / 4, "{kept}");
        let newest_kept = ids[CAPACITY..].iter().filter(|id| recent.contains(id, now));
        let oldest_kept = ids[..CAPACITY / 4]
            .iter()
            .filter(|id| recent.contains(id, now));
        assert_eq!(oldest_kept.count(), 0);
        assert!(newest_kept.count() > CAPACITY * 3 / 4);
    }

    #[test]
    fn forget_all_forgets_every_job_id() {
        let recent = RecentlyAcknowledged::default();
        let now = Instant::now();
        recent.remember(&id("job-1"), now);
        recent.remember(&id("job-2"), now);
        recent.forget_all();
        assert!(!recent.contains(&id("job-1"), now));
        assert!(!recent.contains(&id("job-2"), now));
        assert_eq!(recent.len(), 0);
    }
}
