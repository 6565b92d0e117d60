//! The job_ids acknowledged in the last minutes: a duplicate of one is answered from memory.
//!
//! Sume resends a delivery whose answer it did not get (lost, or later than its 10 s timeout)
//! every 30 s (its default), up to 10 attempts: those duplicates come within minutes of the
//! claim. Answered from here, a duplicate costs a hash look-up instead of a trip through the
//! ledger (on SQLite, the writer's queue, a transaction and two thread wake-ups).
//!
//! Only a job_id the ledger has answered for is remembered: its claim committed and on disk, or
//! found there. So "duplicate" from here promises nothing the ledger's own answer would not,
//! and a claim the ledger failed is not remembered. A job_id is found by its hash and then compared
//! whole: two ids with the same hash are never taken for each other. The memory is bounded: at
//! most [`CAPACITY`] job_ids in [`TEXT_BYTES`], the oldest dropped first, each for
//! [`REMEMBER_FOR`]; once full, about 1.6 MiB resident, in two allocations a shard.
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
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::job_id::{JobId, MAX_JOB_ID_BYTES};

/// Job_ids remembered at most.
pub const CAPACITY: usize = SHARDS * SHARD_IDS;
/// Bytes remembered at most, [`ENTRY_HEADER`] included: 28,672 ids of up to 31 bytes fit, and
/// 4,032 of the longest (255 bytes).
pub const TEXT_BYTES: usize = SHARDS * SHARD_TEXT_BYTES;
/// Sume's retries of one delivery span about 6 minutes (9 delays of 30 s, 10 timeouts of 10 s).
pub const REMEMBER_FOR: Duration = Duration::from_secs(600);
/// Independent locks, so that the runtime's worker threads seldom wait for each other.
const SHARDS: usize = 16;
/// Half of what a shard's table of 4,096 slots holds (3,584): past half, the table would clear
/// its removed slots by doubling, not in place.
const SHARD_IDS: usize = 1_792;
/// A shard's entries cycle through all of their buffer, so all of it is resident: it is sized to
/// hold [`SHARD_IDS`] ids of 31 bytes, not of the longest.
const SHARD_TEXT_BYTES: usize = 64 * 1024;
/// Before each job_id's text: its length (one byte), then when the ledger last answered for it
/// (four, little-endian seconds since the epoch).
const ENTRY_HEADER: usize = 5;

pub struct RecentlyAcknowledged {
    /// A job_id's hash, keyed per process: its shard and its key in the shard's table.
    hasher: RandomState,
    /// Times are kept as whole seconds since this instant.
    epoch: Instant,
    shards: [Mutex<Shard>; SHARDS],
}

/// One shard's job_ids, in two allocations (not two per id): the entries in one buffer, oldest
/// first, and a table from each one's key to where its entry is.
struct Shard {
    /// 32 bits of a job_id's hash -> the position of its entry. Two ids with the same key never
    /// share the table: the second is not remembered.
    entries_by_key: HashMap<u32, u32, BuildHasherDefault<SpreadKey>>,
    /// Each job_id as [`ENTRY_HEADER`] then its text, in the order they were first remembered.
    entries: VecDeque<u8>,
    /// The position of `entries`' first byte, counted (wrapping) since the shard began.
    first: u32,
}

/// The table's keys are hash bits already; this only spreads them over the 64 bits its slots
/// and tags are taken from.
#[derive(Default)]
struct SpreadKey(u64);

impl Hasher for SpreadKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("the table's keys are u32 hash bits")
    }
    fn write_u32(&mut self, key: u32) {
        self.0 = u64::from(key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Default for RecentlyAcknowledged {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            epoch: Instant::now(),
            shards: std::array::from_fn(|_| Mutex::new(Shard::empty())),
        }
    }
}

impl RecentlyAcknowledged {
    /// Whether the ledger answered for `job_id` less than [`REMEMBER_FOR`] before `now` (to the
    /// second).
    pub fn contains(&self, job_id: &JobId, now: Instant) -> bool {
        let (key, shard) = self.shard(job_id);
        let now = self.seconds(now);
        shard
            .lock()
            .expect("not poisoned")
            .contains(key, job_id.as_str().as_bytes(), now)
    }

    /// Remembers that the ledger answered for `job_id` (claimed, or already there) at `now`.
    pub fn remember(&self, job_id: &JobId, now: Instant) {
        let (key, shard) = self.shard(job_id);
        let now = self.seconds(now);
        let mut shard = shard.lock().expect("not poisoned");
        shard.remember(key, job_id.as_str().as_bytes(), now, &self.hasher);
    }

    /// Forgets every job_id: the ledger may have forgotten any of them.
    pub fn forget_all(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().expect("not poisoned");
            shard.entries_by_key.clear();
            shard.entries.clear();
        }
    }

    fn shard(&self, job_id: &JobId) -> (u32, &Mutex<Shard>) {
        let hash = self.hasher.hash_one(job_id.as_str().as_bytes());
        (key_of(hash), &self.shards[(hash >> 32) as usize % SHARDS])
    }

    fn seconds(&self, now: Instant) -> u32 {
        let since = now.saturating_duration_since(self.epoch).as_secs();
        u32::try_from(since).unwrap_or(u32::MAX)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let lengths = self.shards.iter().map(|shard| {
            let shard = shard.lock().expect("not poisoned");
            let mut entries = 0;
            let mut at = 0;
            while at < shard.entries.len() {
                entries += 1;
                at += ENTRY_HEADER + usize::from(shard.entries[at]);
            }
            assert_eq!(entries, shard.entries_by_key.len());
            entries
        });
        lengths.sum()
    }
}

/// The hash's low half; its high half picks the shard.
fn key_of(hash: u64) -> u32 {
    hash as u32
}

fn expired(answered_at: u32, now: u32) -> bool {
    u64::from(now.saturating_sub(answered_at)) >= REMEMBER_FOR.as_secs()
}

impl Shard {
    fn empty() -> Shard {
        Shard {
            entries_by_key: HashMap::with_capacity_and_hasher(2 * SHARD_IDS, Default::default()),
            entries: VecDeque::with_capacity(SHARD_TEXT_BYTES),
            first: 0,
        }
    }

    fn contains(&self, key: u32, text: &[u8], now: u32) -> bool {
        self.entry_of(key, text)
            .is_some_and(|at| !expired(self.answered_at(at), now))
    }

    fn remember(&mut self, key: u32, text: &[u8], now: u32, hasher: &RandomState) {
        if self.entries_by_key.contains_key(&key) {
            // Another job_id with the same key keeps its place: this one is answered by the
            // ledger, as any id not remembered is.
            if let Some(at) = self.entry_of(key, text) {
                self.set_answered_at(at, now);
            }
            return;
        }
        while self.is_full(text.len()) {
            self.drop_oldest(hasher);
        }
        let position = self.first.wrapping_add(self.entries.len() as u32);
        self.entries.push_back(text.len() as u8);
        self.entries.extend(now.to_le_bytes());
        self.entries.extend(text);
        self.entries_by_key.insert(key, position);
    }

    /// Where `text`'s entry is in `entries`, if it is remembered.
    fn entry_of(&self, key: u32, text: &[u8]) -> Option<usize> {
        let position = *self.entries_by_key.get(&key)?;
        let at = position.wrapping_sub(self.first) as usize;
        let length = usize::from(self.entries[at]);
        let start = at + ENTRY_HEADER;
        let same =
            length == text.len() && self.entries.range(start..start + length).eq(text.iter());
        same.then_some(at)
    }

    fn answered_at(&self, at: usize) -> u32 {
        let mut seconds = [0; 4];
        for (byte, stored) in seconds
            .iter_mut()
            .zip(self.entries.range(at + 1..at + ENTRY_HEADER))
        {
            *byte = *stored;
        }
        u32::from_le_bytes(seconds)
    }

    fn set_answered_at(&mut self, at: usize, now: u32) {
        for (stored, byte) in self
            .entries
            .range_mut(at + 1..at + ENTRY_HEADER)
            .zip(now.to_le_bytes())
        {
            *stored = byte;
        }
    }

    fn is_full(&self, text_bytes: usize) -> bool {
        self.entries_by_key.len() >= SHARD_IDS
            || self.entries.len() + ENTRY_HEADER + text_bytes > SHARD_TEXT_BYTES
    }

    /// Drops the job_id remembered first: every entry has its key in the table.
    fn drop_oldest(&mut self, hasher: &RandomState) {
        let length = usize::from(self.entries[0]);
        let mut oldest = [0; MAX_JOB_ID_BYTES];
        let text = self.entries.range(ENTRY_HEADER..ENTRY_HEADER + length);
        for (byte, stored) in oldest.iter_mut().zip(text) {
            *byte = *stored;
        }
        let key = key_of(hasher.hash_one(&oldest[..length]));
        self.entries_by_key.remove(&key);
        self.entries.drain(..ENTRY_HEADER + length);
        self.first = self.first.wrapping_add((ENTRY_HEADER + length) as u32);
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
        // Kept to the second.
        let almost = start + REMEMBER_FOR - Duration::from_secs(1);
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

    #[test]
    fn a_job_id_is_compared_whole_not_taken_for_another_with_its_key() {
        let hasher = RandomState::new();
        let mut shard = Shard::empty();
        shard.remember(7, b"job-a", 0, &hasher);
        assert!(shard.contains(7, b"job-a", 0));
        assert!(!shard.contains(7, b"job-b", 0));
        assert!(!shard.contains(7, b"job-", 0));
        // The second id with the same key is not remembered, and does not renew the first.
        shard.remember(7, b"job-b", 1, &hasher);
        assert!(!shard.contains(7, b"job-b", 1));
        assert!(shard.contains(7, b"job-a", 1));
        assert!(!shard.contains(7, b"job-a", REMEMBER_FOR.as_secs() as u32));
    }

    #[test]
    fn past_text_bytes_fewer_long_job_ids_are_kept() {
        let recent = RecentlyAcknowledged::default();
        let now = Instant::now();
        let ids: Vec<JobId> = (0..CAPACITY).map(|i| id(&format!("{i:0>255}"))).collect();
        for job_id in &ids {
            recent.remember(job_id, now);
        }
        let fit = TEXT_BYTES / (ENTRY_HEADER + MAX_JOB_ID_BYTES);
        let kept = recent.len();
        assert!(kept <= fit && kept > fit * 3 / 4, "{kept}");
        assert!(recent.contains(ids.last().unwrap(), now));
        assert!(!recent.contains(&ids[0], now));
    }

    #[test]
    fn a_shard_keeps_its_newest_job_ids_while_positions_wrap_around() {
        let hasher = RandomState::new();
        let mut shard = Shard::empty();
        let allocated = (shard.entries_by_key.capacity(), shard.entries.capacity());
        shard.first = u32::MAX - 100;
        let texts: Vec<String> = (0..SHARD_IDS * 3).map(|i| format!("job-{i}")).collect();
        let key = |text: &String| key_of(hasher.hash_one(text.as_bytes()));
        for text in &texts {
            shard.remember(key(text), text.as_bytes(), 0, &hasher);
        }
        let (dropped, kept) = texts.split_at(texts.len() - SHARD_IDS);
        let remembered = |text: &String| shard.contains(key(text), text.as_bytes(), 0);
        assert!(kept.iter().all(remembered));
        assert!(!dropped.iter().any(remembered));
        assert_eq!(shard.entries_by_key.len(), SHARD_IDS);
        // Neither allocation grew (removed slots count against the table's capacity until it
        // clears them; a doubled table would report twice as much).
        assert!(shard.entries_by_key.capacity() <= allocated.0);
        assert_eq!(shard.entries.capacity(), allocated.1);
    }
}
