//! The recent refused deliveries: a bounded ring of who was refused, when, and why.
//!
//! A flood of bad requests only overwrites the oldest entries: memory is fixed. The admin
//! listener shows them (`GET /v1/refusals`); each is also a `delivery refused` log line.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;

use serde::Serialize;

/// How many refusals the ring remembers.
pub const RING_CAPACITY: usize = 256;
/// How much of a refusal's reason is kept (what a stranger sent can be long).
const REASON_CHARS: usize = 200;

/// One refused delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// Unix ms.
    pub at: i64,
    pub peer: String,
    pub status: u16,
    /// unauthorized, bad_request, too_large, unavailable
    pub outcome: &'static str,
    pub reason: String,
}

#[derive(Default)]
pub struct Refusals {
    ring: Mutex<VecDeque<Refusal>>,
}

impl Refusals {
    pub fn record(&self, peer: SocketAddr, status: u16, outcome: &'static str, reason: &str) {
        let refusal = Refusal {
            at: crate::ledger::now_ms(),
            peer: peer.to_string(),
            status,
            outcome,
            reason: reason.chars().take(REASON_CHARS).collect(),
        };
        let mut ring = self.ring.lock().expect("not poisoned");
        if ring.len() == RING_CAPACITY {
            ring.pop_front();
        }
        ring.push_back(refusal);
    }

    /// Newest first.
    pub fn recent(&self) -> Vec<Refusal> {
        self.ring
            .lock()
            .expect("not poisoned")
            .iter()
            .rev()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_and_cuts_long_reasons() {
        let refusals = Refusals::default();
        let peer: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        for n in 0..RING_CAPACITY + 10 {
            refusals.record(
                peer,
                401,
                "unauthorized",
                &format!("bad {n} {}", "x".repeat(500)),
            );
        }
        let recent = refusals.recent();
        assert_eq!(recent.len(), RING_CAPACITY);
        assert!(recent[0]
            .reason
            .starts_with(&format!("bad {} ", RING_CAPACITY + 9)));
        assert!(recent[RING_CAPACITY - 1].reason.starts_with("bad 10 "));
        assert!(recent
            .iter()
            .all(|r| r.reason.chars().count() == REASON_CHARS));
        assert_eq!(recent[0].peer, "192.0.2.7:4000");
    }
}
