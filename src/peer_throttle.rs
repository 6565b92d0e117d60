//! Failed authentications throttled per peer: a growing delay for the address that fails, a
//! global ceiling far above it, and a summary line per interval (peer, count) instead of a line
//! per try.
//!
//! Nobody is locked out by another's failures: a peer with no recent failure always gets its
//! try, so a guesser cannot keep the right token out (OWASP's Authentication Cheat Sheet; the
//! global lock this replaces could be held by anyone for ever). A right token does not forget a
//! peer's failures either: a token holder guessing at others' tokens would otherwise reset its
//! own throttle between guesses. Failures are forgotten only [`FORGET_AFTER`] after the last.
//! Behind a proxy every client is the proxy's address: it is throttled as one peer (forwarded
//! headers are not trusted, as a client could send any).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Failures a peer may make before it has to wait.
pub const FREE_FAILURES: u32 = 5;
/// The first wait, doubled at each further failure, up to [`MAX_DELAY`].
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
pub const MAX_DELAY: Duration = Duration::from_secs(60);
/// Failures from everyone together in [`CEILING_WINDOW`] past which each further failure costs
/// its peer [`MAX_DELAY`] at once (many addresses guessing together).
pub const GLOBAL_CEILING: u32 = 1000;
pub const CEILING_WINDOW: Duration = Duration::from_secs(60);
/// A peer's failures are forgotten this long after its last.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Peers remembered at once; past it, the one that failed longest ago is forgotten.
const MAX_PEERS: usize = 10_000;
/// How often the refusals are summed up in the log.
const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);
/// Peers named in a summary line (the busiest).
const PEERS_NAMED: usize = 5;

/// One peer's record.
struct Peer {
    failures: u32,
    /// No try before this.
    wait_until: Instant,
    last_failure: Instant,
}

#[derive(Default)]
struct State {
    peers: HashMap<IpAddr, Peer>,
    window: Option<(Instant, u32)>,
    /// Failed and refused tries per peer since the last summary line.
    unlogged: HashMap<IpAddr, u64>,
    last_summary: Option<Instant>,
}

/// The throttle of one door (the console's sign-in, the API's bearer token).
pub struct PeerThrottle {
    shared: Arc<Shared>,
    /// The task that writes a summary when it is due, whether or not another try comes.
    summarizer: AbortHandle,
}

/// What the throttle and its summarizer share.
struct Shared {
    what: &'static str,
    state: Mutex<State>,
    /// Told when the first try since the last summary line is counted.
    counted: Notify,
    interval: Duration,
}

impl PeerThrottle {
    /// Spawns its summarizer: one task per throttle, however many peers.
    pub fn new(what: &'static str) -> PeerThrottle {
        PeerThrottle::summing_up_every(what, SUMMARY_INTERVAL)
    }

    fn summing_up_every(what: &'static str, interval: Duration) -> PeerThrottle {
        let shared = Arc::new(Shared {
            what,
            state: Mutex::default(),
            counted: Notify::new(),
            interval,
        });
        let summarizer = tokio::spawn(summarize_when_due(shared.clone())).abort_handle();
        PeerThrottle { shared, summarizer }
    }

    /// `Err(wait)` when `peer` must wait before trying again (the try is counted as refused).
    pub fn check(&self, peer: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let mut state = self.shared.state.lock().expect("not poisoned");
        let wait = state
            .peers
            .get(&peer)
            .map(|record| record.wait_until.saturating_duration_since(now))
            .filter(|wait| !wait.is_zero());
        let Some(wait) = wait else {
            return Ok(());
        };
        self.shared.count(&mut state, peer, now);
        Err(wait)
    }

    /// A wrong token from `peer`: it waits longer before its next try.
    pub fn failed(&self, peer: IpAddr) {
        let now = Instant::now();
        let mut state = self.shared.state.lock().expect("not poisoned");
        let (start, count) = match state.window {
            Some((start, count)) if now.duration_since(start) < CEILING_WINDOW => (start, count),
            _ => (now, 0),
        };
        state.window = Some((start, count + 1));
        let over_ceiling = count + 1 > GLOBAL_CEILING;
        if !state.peers.contains_key(&peer) && state.peers.len() >= MAX_PEERS {
            state.forget_one(now);
        }
        let record = state.peers.entry(peer).or_insert(Peer {
            failures: 0,
            wait_until: now,
            last_failure: now,
        });
        if now.duration_since(record.last_failure) >= FORGET_AFTER {
            record.failures = 0;
        }
        record.failures += 1;
        record.last_failure = now;
        let delay = if over_ceiling {
            MAX_DELAY
        } else {
            delay_after(record.failures)
        };
        record.wait_until = now + delay;
        self.shared.count(&mut state, peer, now);
    }
}

impl Drop for PeerThrottle {
    /// Logs what the last summary did not say yet (at shutdown).
    fn drop(&mut self) {
        self.summarizer.abort();
        let mut state = self.shared.state.lock().expect("not poisoned");
        state.summarize(self.shared.what, Instant::now(), None);
    }
}

impl Shared {
    /// One more failed or refused try from `peer`, and its summary line if one is due.
    fn count(&self, state: &mut State, peer: IpAddr, now: Instant) {
        if state.unlogged.is_empty() {
            self.counted.notify_one();
        }
        // Bounded like the peers: a flood of addresses fills one summary, not the memory.
        if state.unlogged.len() < MAX_PEERS || state.unlogged.contains_key(&peer) {
            *state.unlogged.entry(peer).or_default() += 1;
        }
        state.summarize(self.what, now, Some(self.interval));
    }
}

/// Writes the summary of tries counted since the last line once the interval since that line
/// is over, so that the last of a burst is not held until the next try (or shutdown).
async fn summarize_when_due(shared: Arc<Shared>) {
    loop {
        shared.counted.notified().await;
        let last = shared.state.lock().expect("not poisoned").last_summary;
        if let Some(last) = last {
            tokio::time::sleep_until((last + shared.interval).into()).await;
        }
        let mut state = shared.state.lock().expect("not poisoned");
        state.summarize(shared.what, Instant::now(), Some(shared.interval));
    }
}

/// The wait after a peer's `failures`-th failure.
pub fn delay_after(failures: u32) -> Duration {
    let Some(past_free) = failures.checked_sub(FREE_FAILURES + 1) else {
        return Duration::ZERO;
    };
    FIRST_DELAY
        .saturating_mul(1u32 << past_free.min(16))
        .min(MAX_DELAY)
}

impl State {
    /// Forgets the peer whose last failure is the oldest (the map is full).
    fn forget_one(&mut self, now: Instant) {
        self.peers
            .retain(|_, peer| now.duration_since(peer.last_failure) < FORGET_AFTER);
        if self.peers.len() >= MAX_PEERS {
            if let Some(oldest) = self
                .peers
                .iter()
                .min_by_key(|(_, peer)| peer.last_failure)
                .map(|(address, _)| *address)
            {
                self.peers.remove(&oldest);
            }
        }
    }

    /// One line for the failed and refused tries since the last, if `interval` has passed
    /// since that line (or at once, without an interval).
    fn summarize(&mut self, what: &'static str, now: Instant, interval: Option<Duration>) {
        let due = match (self.last_summary, interval) {
            (Some(last), Some(interval)) => now.duration_since(last) >= interval,
            _ => true,
        };
        if self.unlogged.is_empty() || !due {
            return;
        }
        let mut by_peer: Vec<(IpAddr, u64)> = self.unlogged.drain().collect();
        by_peer.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: u64 = by_peer.iter().map(|(_, count)| count).sum();
        let busiest = by_peer
            .iter()
            .take(PEERS_NAMED)
            .map(|(peer, count)| format!("{peer} {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(
            what,
            total,
            peers = by_peer.len(),
            busiest = %busiest,
            "wrong tokens refused or throttled (a summary: at most one line a minute)"
        );
        self.last_summary = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUESSER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const OPERATOR: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    #[test]
    fn the_delay_grows_with_each_failure_up_to_the_maximum() {
        assert_eq!(delay_after(FREE_FAILURES), Duration::ZERO);
        assert_eq!(delay_after(FREE_FAILURES + 1), FIRST_DELAY);
        assert_eq!(delay_after(FREE_FAILURES + 2), FIRST_DELAY * 2);
        assert_eq!(delay_after(1000), MAX_DELAY);
    }

    #[tokio::test]
    async fn a_failing_peer_waits_and_the_others_do_not() {
        let throttle = PeerThrottle::new("test");
        for _ in 0..FREE_FAILURES {
            assert!(throttle.check(GUESSER).is_ok());
            throttle.failed(GUESSER);
        }
        throttle.failed(GUESSER);
        assert!(throttle.check(GUESSER).is_err());
        assert!(throttle.check(OPERATOR).is_ok(), "another peer is not held");
    }

    #[tokio::test]
    async fn failures_are_forgotten_long_after_the_last() {
        let throttle = PeerThrottle::new("test");
        for _ in 0..=FREE_FAILURES {
            throttle.failed(GUESSER);
        }
        let Some(long_ago) = Instant::now().checked_sub(FORGET_AFTER) else {
            return; // The machine started less than FORGET_AFTER ago.
        };
        {
            let mut state = throttle.shared.state.lock().unwrap();
            let record = state.peers.get_mut(&GUESSER).unwrap();
            (record.last_failure, record.wait_until) = (long_ago, long_ago);
        }
        throttle.failed(GUESSER);
        assert!(throttle.check(GUESSER).is_ok(), "a first failure again");
    }

    /// Regression: the line was written when the next try came, so the last of a burst waited
    /// for the next burst (or shutdown).
    #[tokio::test]
    async fn a_summary_is_written_when_due_without_another_try() {
        let throttle = PeerThrottle::summing_up_every("test", Duration::from_millis(200));
        throttle.failed(GUESSER);
        let unlogged = || throttle.shared.state.lock().unwrap().unlogged.len();
        assert_eq!(
            unlogged(),
            0,
            "the first try after a quiet time is said at once"
        );
        throttle.failed(GUESSER);
        throttle.failed(OPERATOR);
        assert_eq!(unlogged(), 2, "the next wait for the interval");
        let deadline = Instant::now() + Duration::from_secs(10);
        while unlogged() > 0 {
            assert!(Instant::now() < deadline, "no summary without another try");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let last = throttle.shared.state.lock().unwrap().last_summary.unwrap();
        assert!(last.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn past_the_global_ceiling_a_first_failure_costs_the_most_but_nobody_is_locked() {
        let throttle = PeerThrottle::new("test");
        for i in 0..GLOBAL_CEILING {
            throttle.failed(IpAddr::from((i + 1).to_be_bytes()));
        }
        assert!(throttle.check(OPERATOR).is_ok());
        throttle.failed(GUESSER);
        let wait = throttle.check(GUESSER).unwrap_err();
        assert!(wait > MAX_DELAY / 2, "{wait:?}");
        assert!(
            throttle.check(OPERATOR).is_ok(),
            "a peer not failing still tries"
        );
    }

    #[tokio::test]
    async fn the_peers_remembered_are_bounded() {
        let throttle = PeerThrottle::new("test");
        for i in 0..(MAX_PEERS as u32 + 50) {
            throttle.failed(IpAddr::from((i + 1).to_be_bytes()));
        }
        let state = throttle.shared.state.lock().unwrap();
        assert_eq!(state.peers.len(), MAX_PEERS);
        assert!(state.unlogged.len() <= MAX_PEERS);
    }
}
