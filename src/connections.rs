//! The open connections of a listener: which a new one may push out, and how a request earns.
//!
//! A connection is sheddable while nobody has vouched for it: in its TLS handshake, waiting
//! for a request head, between requests, or inside a request before anything authenticated it
//! (a webhook body before its HMAC, a sign-in form, a CSP report, a `GET /healthz`). Its
//! request earns its slot when the router calls [`earned`] (a valid signature, a live console
//! session, a valid bearer token). At the connection limit the connection sheddable for
//! longest makes room, once past a grace. Only a connection whose last request was vouched
//! for starts a fresh grace, at its answer and at its next head: a stranger's clock runs from
//! his connect however often he asks. A peer address (an IPv6 /64) past its share makes room
//! for its new connection out of its own.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use hyper_util::server::graceful::GracefulConnection;

/// Past this fraction of `max_connections` (and never below [`PEER_FLOOR`]), a peer's new
/// connection pushes out its own oldest sheddable one past its grace, not another peer's.
const PEER_SHARE: usize = 8;
const PEER_FLOOR: usize = 8;
/// How long a connection is safe from the connection limit's shedding: long enough for a real
/// client's handshake and request on a busy machine, short enough that strangers waiting in
/// the backlog ahead of a real sender go through it in about this long.
const GRACE: Duration = Duration::from_millis(500);

/// What [`Open::shed_oldest`] could do.
pub enum Room {
    /// A connection was asked to close: its slot is free once its task ends.
    Made,
    /// Nothing to shed before then: the oldest sheddable connection's grace ends, or, with
    /// every connection vouched for, one grace from now (one may be between requests by then).
    At(Instant),
}

tokio::task_local! {
    /// The connection whose request is being routed: a task-local rather than an argument,
    /// so the routers mark it where they authenticate without every signature carrying it.
    static SLOT: Arc<Tracked>;
}

/// The request being routed has earned its connection's slot: it is no longer shed at the
/// limit. Outside a connection (a unit test calling a router), nothing.
pub fn earned() {
    let _ = SLOT.try_with(|slot| slot.earned());
}

/// The open connections, and since when each has been sheddable.
pub struct Open {
    epoch: Instant,
    per_peer: usize,
    connections: Mutex<Connections>,
}

#[derive(Default)]
struct Connections {
    last_id: u64,
    open: HashMap<u64, Arc<Tracked>>,
    /// Open connections per peer (its address, an IPv6 /64); gone at zero.
    of_peer: HashMap<IpAddr, usize>,
}

/// One open connection, as the accept loop and the shutdown see it.
pub struct Tracked {
    epoch: Instant,
    peer: IpAddr,
    /// Microseconds since `epoch` when the connection became sheddable; 0 once earned.
    since: AtomicU64,
    /// Whether something vouched for the connection's last request ([`earned`]), until its
    /// next request's head.
    vouched: AtomicBool,
    /// What the server asks of the connection (an [`Ask`]); it only ever rises.
    asked: AtomicU8,
    /// The connection's task, woken when `asked` rises. Registering it is two atomic
    /// operations per poll, where a cancellation token or a watch channel takes a lock each.
    waker: AtomicWaker,
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Ask {
    Nothing = 0,
    /// Answer the request in progress, if any, then close (shutdown).
    Drain = 1,
    /// Close now (shed, or the shutdown grace is over).
    Close = 2,
}

/// What a per-peer cap counts: the address, or an IPv6 address's /64 (one subscriber's
/// network, where each address costs nothing).
pub(crate) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u64::MAX as u128))),
        },
    }
}

impl Tracked {
    fn earned(&self) {
        self.vouched.store(true, Ordering::Relaxed);
        self.since.store(0, Ordering::Relaxed);
    }

    /// Sheddable from now on, with a grace from now.
    fn sheddable_from_now(&self) {
        let micros = self.epoch.elapsed().as_micros().max(1);
        self.since
            .store(micros.try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Routes a request with this connection as the one [`earned`] marks. A connection whose
    /// last request was vouched for gets a fresh grace from this one's head (a sender idle on
    /// keep-alive for a minute is not shed mid-delivery) and from its answer; a stranger's
    /// requests, with a body or without, leave his clock running: asking more often than the
    /// grace earns him nothing.
    pub async fn route<F: std::future::Future>(self: &Arc<Self>, route: F) -> F::Output {
        if self.vouched.swap(false, Ordering::Relaxed) {
            self.sheddable_from_now();
        }
        let answer = SLOT.scope(self.clone(), route).await;
        if self.vouched.load(Ordering::Relaxed) {
            self.sheddable_from_now();
        }
        answer
    }

    pub fn ask(&self, ask: Ask) {
        self.asked.fetch_max(ask as u8, Ordering::SeqCst);
        self.waker.wake();
    }

    fn asked(&self) -> Ask {
        match self.asked.load(Ordering::SeqCst) {
            0 => Ask::Nothing,
            1 => Ask::Drain,
            _ => Ask::Close,
        }
    }

    /// Runs `step` (a TLS handshake) unless the server asks the connection to drain or close
    /// first: before its first request, a connection has nothing to finish.
    pub async fn unless_asked<F: std::future::Future>(&self, step: F) -> Option<F::Output> {
        let mut step = std::pin::pin!(step);
        std::future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            if self.asked() != Ask::Nothing {
                return Poll::Ready(None);
            }
            step.as_mut().poll(cx).map(Some)
        })
        .await
    }

    /// Serves `connection` until it ends or is asked to close; asked to drain, it finishes
    /// the request in progress (hyper's graceful shutdown of the connection).
    pub async fn serve<C: GracefulConnection>(&self, connection: C) -> Result<(), C::Error> {
        let mut connection = std::pin::pin!(connection);
        let mut draining = false;
        std::future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            match self.asked() {
                Ask::Close => return Poll::Ready(Ok(())),
                Ask::Drain if !draining => {
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
                Ask::Drain | Ask::Nothing => {}
            }
            connection.as_mut().poll(cx)
        })
        .await
    }
}

impl Open {
    pub fn new(max_connections: usize) -> Open {
        Open {
            epoch: Instant::now(),
            per_peer: (max_connections / PEER_SHARE).max(PEER_FLOOR),
            connections: Mutex::default(),
        }
    }

    /// Tracks a new connection from `peer`; whether it pushed out one of the same peer's
    /// (the peer was at its share).
    pub fn register(&self, peer: IpAddr) -> (u64, Arc<Tracked>, bool) {
        let tracked = Arc::new(Tracked {
            epoch: self.epoch,
            peer: peer_key(peer),
            since: AtomicU64::new(0),
            vouched: AtomicBool::new(false),
            asked: AtomicU8::new(Ask::Nothing as u8),
            waker: AtomicWaker::new(),
        });
        tracked.sheddable_from_now();
        let mut connections = self.connections.lock().expect("not poisoned");
        let of_peer = connections.of_peer.entry(tracked.peer).or_default();
        *of_peer += 1;
        // Only a peer past its share pays for the scan. A burst of its deliveries is not
        // pushed out by itself: each has its grace.
        let own = (*of_peer > self.per_peer)
            .then(|| oldest(&connections.open, |other| other.peer == tracked.peer))
            .flatten()
            .filter(|own| self.past_grace(own));
        if let Some(own) = own {
            own.ask(Ask::Close);
        }
        let shed = own.is_some();
        connections.last_id += 1;
        let id = connections.last_id;
        connections.open.insert(id, tracked.clone());
        (id, tracked, shed)
    }

    pub fn unregister(&self, id: u64) {
        let mut connections = self.connections.lock().expect("not poisoned");
        let Some(tracked) = connections.open.remove(&id) else {
            return;
        };
        if let Some(count) = connections.of_peer.get_mut(&tracked.peer) {
            *count -= 1;
            if *count == 0 {
                connections.of_peer.remove(&tracked.peer);
            }
        }
    }

    /// Closes the connection that has been sheddable longest, if it has been for
    /// [`GRACE`]: a new connection has that long to be vouched for, however fast strangers
    /// reconnect to push it out.
    pub fn shed_oldest(&self) -> Room {
        let connections = self.connections.lock().expect("not poisoned");
        let Some(oldest) = oldest(&connections.open, |_| true) else {
            return Room::At(Instant::now() + GRACE);
        };
        if !self.past_grace(oldest) {
            return Room::At(self.sheddable_at(oldest));
        }
        oldest.ask(Ask::Close);
        Room::Made
    }

    /// When `tracked`, sheddable now, may be shed.
    fn sheddable_at(&self, tracked: &Tracked) -> Instant {
        self.epoch + Duration::from_micros(tracked.since.load(Ordering::Relaxed)) + GRACE
    }

    fn past_grace(&self, tracked: &Tracked) -> bool {
        Instant::now() >= self.sheddable_at(tracked)
    }

    pub fn ask_all(&self, ask: Ask) {
        let connections = self.connections.lock().expect("not poisoned");
        for tracked in connections.open.values() {
            tracked.ask(ask);
        }
    }
}

/// The connection sheddable for longest of those `which` picks. One whose request is vouched
/// for in the very instant it is picked may still be closed: its client sees a reset, never a
/// 2xx, and Sume retries.
fn oldest(
    open: &HashMap<u64, Arc<Tracked>>,
    which: impl Fn(&Tracked) -> bool,
) -> Option<&Arc<Tracked>> {
    open.values()
        .filter(|tracked| which(tracked) && tracked.asked() != Ask::Close)
        .filter_map(|tracked| {
            let since = tracked.since.load(Ordering::Relaxed);
            (since != 0).then_some((since, tracked))
        })
        .min_by_key(|(since, _)| *since)
        .map(|(_, tracked)| tracked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_peer_is_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(peer_key(a), peer_key(b));
        assert_ne!(peer_key(a), peer_key(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(peer_key(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_peer_past_its_share_pushes_out_its_own_oldest_sheddable_connection() {
        let mut open = Open::new(64);
        open.epoch -= 2 * GRACE;
        let (stranger, other): (IpAddr, IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let (_, elsewhere, _) = open.register(other);
        let (_, vouched, _) = open.register(stranger);
        vouched.earned();
        let mut waiting = Vec::new();
        for _ in 1..PEER_FLOOR {
            let (_, tracked, shed) = open.register(stranger);
            assert!(!shed);
            waiting.push(tracked);
        }
        let (_, _, shed) = open.register(stranger);
        assert!(!shed, "a burst of young connections is not pushed out");
        // Sheddable since the epoch's first microsecond: past the grace.
        waiting[0].since.store(1, Ordering::Relaxed);
        let (_, _, shed) = open.register(stranger);
        assert!(shed, "one past its share pushes one out");
        assert!(waiting[0].asked() == Ask::Close, "its oldest sheddable one");
        assert!(vouched.asked() == Ask::Nothing, "not the one vouched for");
        assert!(elsewhere.asked() == Ask::Nothing, "not another peer's");
    }

    /// Regression (a review of the shedding): each answered request restarted its connection's
    /// grace, so a stranger asking every 0.4 s was never past it, and held his slot for good.
    #[tokio::test]
    async fn only_a_vouched_for_request_starts_a_fresh_grace() {
        let mut open = Open::new(64);
        open.epoch -= 2 * GRACE;
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let (_, stranger, _) = open.register(peer);
        // Sheddable since the epoch's first microsecond: past the grace.
        stranger.since.store(1, Ordering::Relaxed);
        stranger.route(async {}).await;
        assert_eq!(
            stranger.since.load(Ordering::Relaxed),
            1,
            "a request nobody vouched for leaves the clock running"
        );
        let (_, sender, _) = open.register(peer);
        sender.since.store(1, Ordering::Relaxed);
        sender.route(async { earned() }).await;
        assert!(
            sender.since.load(Ordering::Relaxed) > 1,
            "a vouched-for answer starts a fresh grace"
        );
        assert!(matches!(open.shed_oldest(), Room::Made));
        assert!(stranger.asked() == Ask::Close && sender.asked() == Ask::Nothing);
        // The sender's next request, unvouched, has a grace from its head, then none.
        sender.since.store(1, Ordering::Relaxed);
        sender.route(async {}).await;
        let head = sender.since.load(Ordering::Relaxed);
        assert!(head > 1, "a known sender's next head starts a fresh grace");
        sender.route(async {}).await;
        assert_eq!(sender.since.load(Ordering::Relaxed), head, "but only once");
    }

    #[test]
    fn at_the_limit_only_a_connection_past_its_grace_is_shed() {
        let mut open = Open::new(64);
        // Opened long enough ago for a connection to have been sheddable past its grace.
        open.epoch -= 2 * GRACE;
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let (_, young, _) = open.register(peer);
        assert!(matches!(open.shed_oldest(), Room::At(_)));
        assert!(young.asked() == Ask::Nothing);
        let (_, old, _) = open.register(peer);
        // Sheddable since the epoch's first microsecond: past the grace.
        old.since.store(1, Ordering::Relaxed);
        assert!(matches!(open.shed_oldest(), Room::Made));
        assert!(old.asked() == Ask::Close && young.asked() == Ask::Nothing);
        young.earned();
        assert!(
            matches!(open.shed_oldest(), Room::At(_)),
            "nothing left to shed"
        );
    }

    #[test]
    fn unregistering_forgets_an_empty_peer() {
        let open = Open::new(64);
        let (id, _, _) = open.register("192.0.2.1".parse().unwrap());
        open.unregister(id);
        let connections = open.connections.lock().unwrap();
        assert!(connections.open.is_empty() && connections.of_peer.is_empty());
    }
}
