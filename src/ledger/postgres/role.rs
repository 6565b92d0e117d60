//! The server's role, watched: no connection outlives its server's turn as the primary.
//!
//! A failover leaves connections behind on the old primary: closed ones (a kill, a restart,
//! terminated sessions), which the pool notices, and open ones to a server that stays up but
//! can no longer write (a managed cloud's read-only flip, a demoted primary), which it does
//! not. So every connection is checked writable when it is made; a pool checks one of its
//! connections again when it hands one out at most every [`VERIFY_EVERY`]; an error that means
//! "this server cannot write" or "is going away" ([`role_lost`]) drops its connection and
//! every one opened before it; and no connection lives past [`MAX_LIFETIME`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Hook, HookError, Metrics, PoolBuilder};
use tokio::sync::watch;
use tokio_postgres::{Client, SimpleQueryMessage};

/// How long a connection attempt may take before the operation fails (503 for a claim).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest a pooled connection lives. It bounds how long a connection can stay on a server
/// whose role changed in a way no check sees (a virtual IP or DNS name moved to another server
/// while the old one still writes: a split brain the operator's tooling must end). Reopening
/// the ten connections of a receiver every five minutes costs a few milliseconds each; HikariCP
/// and pgx default to 30 and 60 minutes, which would leave a receiver on the wrong server far
/// longer than a failover takes.
pub(super) const MAX_LIFETIME: Duration = Duration::from_secs(300);
/// How often a pool checks, on the connection it hands out next, that its server still takes
/// writes: a read-only flip under open connections is seen within this, even by a pool whose
/// statements only read. One small query a second per pool; checking every hand-out would
/// add a round trip to every claim batch.
pub(super) const VERIFY_EVERY: Duration = Duration::from_secs(1);

/// The error with its cause: tokio-postgres puts the server's message in the source.
pub(super) fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Whether a failed statement means its connection is done for: the server cannot take
/// writes, or its session is going or gone.
/// - 25006 read_only_sql_transaction: a standby, or a primary flipped read-only (the
///   `default_transaction_read_only` of a managed failover); also "cannot execute LISTEN
///   during recovery".
/// - 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now: the session was
///   terminated or the server is stopping, restarting or starting.
/// - 57P05 idle_session_timeout: the server closed an idle session.
/// - class 08, connection exception, and a connection closed without a word.
///
/// Not 40001 (serialization_failure) nor 40P01 (deadlock): they are about one transaction, on
/// a server that is fine; nor 57014 (a cancelled statement) and 53xxx (resources), which a
/// fresh connection to the same server would meet again.
pub(super) fn role_lost(error: &tokio_postgres::Error) -> bool {
    match error.code() {
        Some(code) => {
            let code = code.code();
            code.starts_with("08")
                || matches!(code, "25006" | "57P01" | "57P02" | "57P03" | "57P05")
        }
        None => error.is_closed(),
    }
}

/// The role of the server behind one ledger's pools, as its connections found it.
#[derive(Clone)]
pub(super) struct RoleWatch(Arc<Watched>);

struct Watched {
    /// What the millisecond counts below count from.
    origin: Instant,
    /// When a connection last proved that its server is no longer the primary (milliseconds
    /// after `origin`, 0 for never): every connection opened before then is dropped.
    lost_at: AtomicU64,
    /// The server a new connection last found writable ("host:port"); `None` after a loss,
    /// so that each loss and each find is logged once.
    primary: Mutex<Option<String>>,
    /// Bumped at each loss: the LISTEN connection follows.
    losses: watch::Sender<u64>,
}

impl RoleWatch {
    pub(super) fn new() -> RoleWatch {
        RoleWatch(Arc::new(Watched {
            origin: Instant::now(),
            lost_at: AtomicU64::new(0),
            primary: Mutex::new(None),
            losses: watch::channel(0).0,
        }))
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.0.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// A connection met [`role_lost`], or a check found its server read-only: the connections
    /// opened so far are dropped as they come back, and the loss is logged once.
    pub(super) fn lost(&self, why: &str) {
        self.0
            .lost_at
            .store(self.millis(Instant::now()).max(1), Ordering::SeqCst);
        self.0.losses.send_modify(|losses| *losses += 1);
        if let Some(server) = self.0.primary.lock().expect("not poisoned").take() {
            tracing::warn!(%server, why, "lost the PostgreSQL primary; looking for it on new connections");
        }
    }

    /// A connection opened at `created` met [`role_lost`]: a loss, unless the connection
    /// predates the last one (its fellows, failing one by one, would otherwise drop every
    /// connection opened since, again and again).
    pub(super) fn lost_on(&self, created: Instant, why: &str) {
        if !self.predates_loss(created) {
            self.lost(why);
        }
    }

    /// A new connection's server takes writes.
    fn found(&self, server: String) {
        let mut primary = self.0.primary.lock().expect("not poisoned");
        if primary.as_deref() != Some(server.as_str()) {
            tracing::info!(%server, "found the PostgreSQL primary");
            *primary = Some(server);
        }
    }

    /// Resolves at the next loss after `seen` (from [`RoleWatch::losses`]).
    pub(super) fn losses(&self) -> watch::Receiver<u64> {
        self.0.losses.subscribe()
    }

    /// Whether a connection opened at `created` predates the last loss.
    fn predates_loss(&self, created: Instant) -> bool {
        let lost_at = self.0.lost_at.load(Ordering::SeqCst);
        lost_at != 0 && self.millis(created) <= lost_at
    }

    /// Checks that the server behind `client` is the primary and, for a pool that writes,
    /// that it takes writes; a server that is not is a loss.
    /// Unanswered within [`CONNECT_TIMEOUT`], the check fails and the pool drops the
    /// connection: a pool's hooks run outside its timeouts.
    pub(super) async fn verify(&self, client: &Client, writes: bool) -> Result<(), String> {
        let checked = tokio::time::timeout(CONNECT_TIMEOUT, client.simple_query(CHECK_SQL)).await;
        let messages = match checked {
            Ok(Ok(messages)) => messages,
            Err(_) => {
                return Err(format!(
                    "the role check went unanswered for {CONNECT_TIMEOUT:?}"
                ))
            }
            Ok(Err(error)) => {
                let why = error_text(&error);
                if role_lost(&error) {
                    self.lost(&why);
                }
                return Err(why);
            }
        };
        let row = messages.iter().find_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        });
        let Some(row) = row else {
            return Err("the role check returned no row".into());
        };
        let server = row.get(2).unwrap_or("?").to_owned();
        let in_recovery = row.get(0) == Some("t");
        let read_only = row.get(1) == Some("on");
        if in_recovery || (writes && read_only) {
            let why = if in_recovery {
                format!("{server} is a standby (in recovery)")
            } else {
                format!("{server} is read-only (transaction_read_only = on)")
            };
            self.lost(&why);
            return Err(why);
        }
        self.found(server);
        Ok(())
    }

    /// Adds the checks to a pool: each new connection verified, each one handed out again
    /// dropped if it outlived [`MAX_LIFETIME`] or predates a loss, and verified if the pool's
    /// last check is older than [`VERIFY_EVERY`].
    pub(super) fn watch_pool(&self, builder: PoolBuilder, writes: bool) -> PoolBuilder {
        let (on_create, on_recycle) = (self.clone(), self.clone());
        let checked_at = Arc::new(AtomicU64::new(0));
        builder
            .post_create(Hook::async_fn(move |client, _| {
                let watch = on_create.clone();
                Box::pin(async move {
                    watch
                        .verify(client, writes)
                        .await
                        .map_err(HookError::message)
                })
            }))
            .pre_recycle(Hook::async_fn(move |client, metrics: &Metrics| {
                let (watch, checked_at) = (on_recycle.clone(), checked_at.clone());
                let created = metrics.created;
                Box::pin(async move {
                    if created.elapsed() >= MAX_LIFETIME {
                        return Err(HookError::message("past its lifetime"));
                    }
                    if watch.predates_loss(created) {
                        return Err(HookError::message("opened before the primary was lost"));
                    }
                    let now = watch.millis(Instant::now());
                    let last = checked_at.load(Ordering::SeqCst);
                    let due = u128::from(now.saturating_sub(last)) >= VERIFY_EVERY.as_millis();
                    if due
                        && checked_at
                            .compare_exchange(last, now, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                    {
                        watch
                            .verify(client, writes)
                            .await
                            .map_err(HookError::message)?;
                    }
                    Ok(())
                })
            }))
    }
}

/// Whether the server is a standby, whether this session's transactions are read-only, and
/// which server it is (for the log).
const CHECK_SQL: &str = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only'), \
     coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_opened_before_a_loss_predates_it_and_one_after_does_not() {
        let watch = RoleWatch::new();
        let before = Instant::now();
        assert!(!watch.predates_loss(before), "no loss yet");
        std::thread::sleep(Duration::from_millis(2));
        watch.lost("test");
        assert!(watch.predates_loss(before));
        std::thread::sleep(Duration::from_millis(2));
        assert!(!watch.predates_loss(Instant::now()));
    }

    #[test]
    fn each_loss_is_announced_to_the_listener() {
        let watch = RoleWatch::new();
        let mut losses = watch.losses();
        watch.lost("test");
        assert!(losses.has_changed().unwrap());
        losses.mark_unchanged();
        watch.lost("again");
        assert!(losses.has_changed().unwrap());
    }

    #[test]
    fn a_connection_from_before_the_last_loss_is_no_new_loss() {
        let watch = RoleWatch::new();
        let old = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        watch.lost("first");
        let losses = watch.losses();
        watch.lost_on(old, "its fellow");
        assert!(!losses.has_changed().unwrap(), "already known");
        std::thread::sleep(Duration::from_millis(2));
        watch.lost_on(Instant::now(), "a new one");
        assert!(losses.has_changed().unwrap());
    }
}
