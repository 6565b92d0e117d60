//! Connections to PostgreSQL: TLS, the pool's connector that reads notices, and LISTEN.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod};
use tokio::sync::Notify;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::{DbError, Severity, SqlState};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

use super::role::{error_text, RoleWatch, CONNECT_TIMEOUT, VERIFY_EVERY};
use crate::config::PostgresUrl;
use crate::ledger::error::{Cause, StorageError};
use crate::throttle::Throttled;

/// The channel claims and `jobs retry` notify, and every receiver listens on.
pub(super) const CHANNEL: &str = "sume_jobs";

/// The connection settings, with a connect timeout unless the URL sets one, and a dead
/// connection noticed within seconds (a partition, a server that vanished without closing
/// it): data unacknowledged for 10 s aborts it (TCP_USER_TIMEOUT), and an idle one is
/// probed after 30 s (keepalives). Otherwise a statement could wait for the kernel's
/// retransmissions, about 15 minutes, while every claim behind it gets 503.
pub(super) fn settings(url: &PostgresUrl, connect_timeout: Duration) -> tokio_postgres::Config {
    let mut config = url.settings().clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(connect_timeout);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(Duration::from_secs(10));
    }
    if config.get_keepalives_interval().is_none() {
        config
            .keepalives_idle(Duration::from_secs(30))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
    }
    if config.get_application_name().is_none() {
        config.application_name("sume-receiver");
    }
    config
}

/// A failed statement. A server error means PostgreSQL rolled the statement back, and a client
/// side error (a value that cannot be sent) means nothing was sent; but a connection lost
/// during the statement may have been lost after its commit reached the server.
pub(super) fn statement_error(error: tokio_postgres::Error) -> StorageError {
    let connection_lost = error.is_closed()
        || std::error::Error::source(&error).is_some_and(|cause| cause.is::<std::io::Error>());
    if error.code().is_none() && connection_lost {
        StorageError::OutcomeUnknown(Cause::new(error))
    } else {
        StorageError::Unavailable(Cause::new(error))
    }
}

pub(super) fn pool_error(error: deadpool_postgres::PoolError) -> StorageError {
    StorageError::Unavailable(Cause::new(error))
}

/// After a lost LISTEN connection, how long before connecting again.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// Waits for the synchronous standby that PostgreSQL cancelled (`pg_cancel_backend`, a "kill
/// long queries" script) on any connection of one pool. PostgreSQL then reports the commit as
/// done, saying only in a WARNING that the standby may not have it; the notice reaches the
/// connection's task before the statement's answer reaches the caller. Counted across the
/// pool: another connection's cancel during a claim costs that claim a needless 503 (Sume
/// retries), never a false 200. One count per pool, so that one ledger's warnings never touch
/// another's claims (several ledgers in one process: the tests).
#[derive(Clone, Default)]
pub(super) struct StandbyWarnings(Arc<AtomicU64>);

impl StandbyWarnings {
    /// How many so far: compared before and after a claim's statement.
    pub(super) fn seen(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// The cancel's WARNING has no SQLSTATE of its own (01000) and a translated text, so every
    /// warning counts; the termination's carries ADMIN_SHUTDOWN. A claim raises no other
    /// warning.
    fn note(&self, notice: &DbError) {
        let warning = notice.parsed_severity() == Some(Severity::Warning)
            || notice.code().code().starts_with("01");
        if warning || notice.code() == &SqlState::ADMIN_SHUTDOWN {
            self.0.fetch_add(1, Ordering::SeqCst);
            tracing::warn!(notice = %notice, "PostgreSQL warned during a statement (a cancelled wait for the synchronous standby?): claims committed meanwhile are answered 503");
        }
    }
}

/// How the pool connects: as deadpool does, but the connection's task reads its notices.
struct WatchingConnect<T> {
    tls: T,
    warnings: StandbyWarnings,
}

impl<T> deadpool_postgres::Connect for WatchingConnect<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> Pin<
        Box<
            dyn Future<
                    Output = Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
                > + Send
                + '_,
        >,
    > {
        let (tls, pg_config) = (self.tls.clone(), pg_config.clone());
        let warnings = self.warnings.clone();
        Box::pin(async move {
            let (client, mut connection) = pg_config.connect(tls).await?;
            let task = tokio::spawn(async move {
                while let Some(message) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    match message {
                        Ok(AsyncMessage::Notice(notice)) => warnings.note(&notice),
                        Ok(_) => {}
                        Err(error) => {
                            tracing::debug!(%error, "PostgreSQL connection ended");
                            break;
                        }
                    }
                }
            });
            Ok((client, task))
        })
    }
}

/// Listens for claims of every receiver on a connection of its own; wakes the worker for each
/// notification, and once after every (re)connection, since some may have been missed. The
/// connection follows the primary: it is checked writable every [`VERIFY_EVERY`] (a server
/// flipped read-only keeps its sessions, but the new primary's NOTIFYs never reach them), and
/// left at once when a pooled connection found the primary lost.
pub(super) async fn listen(
    pg_config: tokio_postgres::Config,
    tls: Tls,
    role: RoleWatch,
    work_added: Arc<Notify>,
    stopping: CancellationToken,
) {
    let mut failures = Throttled::new("cannot listen for new work on PostgreSQL; retrying");
    // Told apart from the pool's in pg_stat_activity.
    let mut pg_config = pg_config;
    let name = pg_config
        .get_application_name()
        .unwrap_or("sume-receiver")
        .to_owned();
    pg_config.application_name(format!("{name} (LISTEN)"));
    loop {
        let listening = async {
            match &tls {
                Tls::Off => listen_until_lost(&pg_config, NoTls, &role, &work_added).await,
                Tls::Verified(connector) => {
                    listen_until_lost(&pg_config, connector.clone(), &role, &work_added).await
                }
            }
        };
        tokio::select! {
            error = listening => failures.warn(&error),
            () = stopping.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(LISTEN_RETRY) => {}
            () = stopping.cancelled() => return,
        }
    }
}

/// One LISTEN connection, until it is lost or its server is no longer the primary (why): each
/// notification wakes the worker, and so does the start (notifications sent while no
/// connection listened are lost).
async fn listen_until_lost<T>(
    pg_config: &tokio_postgres::Config,
    tls: T,
    role: &RoleWatch,
    work_added: &Arc<Notify>,
) -> String
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let mut losses = role.losses();
    let (client, mut connection) = match pg_config.connect(tls).await {
        Ok(connected) => connected,
        Err(error) => return error_text(&error),
    };
    let wake = work_added.clone();
    let mut messages = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                Ok(_) => {}
                Err(error) => return error_text(&error),
            }
        }
        "the LISTEN connection ended".to_owned()
    });
    let listening = async {
        role.verify(&client, true).await?;
        client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .map_err(|error| error_text(&error))?;
        work_added.notify_one();
        losses.mark_unchanged();
        loop {
            tokio::select! {
                _ = losses.changed() => return Err::<(), _>("the primary was lost".to_owned()),
                () = tokio::time::sleep(VERIFY_EVERY) => role.verify(&client, true).await?,
            }
        }
    };
    let why = tokio::select! {
        ended = &mut messages => ended.unwrap_or_else(|error| error.to_string()),
        Err(why) = listening => why,
    };
    messages.abort();
    drop(client);
    why
}

/// How connections to PostgreSQL are made: in the clear, or over TLS when the URL asks for it
/// (`sslmode=require`), the server's certificate and host name verified against the system's
/// CA certificates and `database.ca_file`.
#[derive(Clone)]
pub(super) enum Tls {
    Off,
    Verified(MakeRustlsConnect),
}

impl Tls {
    pub(super) fn new(url: &PostgresUrl, ca_file: Option<&std::path::Path>) -> anyhow::Result<Tls> {
        let config = settings(url, CONNECT_TIMEOUT);
        if config.get_ssl_mode() != SslMode::Require {
            if !url.is_local() {
                tracing::warn!(ledger = %url.location(), "the connection to PostgreSQL is not encrypted: add sslmode=require to database.url");
            }
            return Ok(Tls::Off);
        }
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(file) = ca_file {
            crate::tls::certificate::add_ca_file(&mut roots, file).context("database.ca_file")?;
        }
        if roots.is_empty() {
            bail!("sslmode=require, but there is no CA certificate to verify PostgreSQL's with: install the system's (ca-certificates) or set database.ca_file");
        }
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::Verified(MakeRustlsConnect::new(client)))
    }

    /// Connects; the connection runs on a task of its own until the client is dropped.
    pub(super) async fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> Result<Client, tokio_postgres::Error> {
        async fn spawned<T>(
            config: &tokio_postgres::Config,
            tls: T,
        ) -> Result<Client, tokio_postgres::Error>
        where
            T: MakeTlsConnect<Socket>,
            T::Stream: Send + 'static,
        {
            let (client, connection) = config.connect(tls).await?;
            tokio::spawn(connection);
            Ok(client)
        }
        match self {
            Tls::Off => spawned(config, NoTls).await,
            Tls::Verified(connector) => spawned(config, connector.clone()).await,
        }
    }

    /// A pool manager whose connections count their notices in `warnings`.
    pub(super) fn manager(
        &self,
        config: &tokio_postgres::Config,
        warnings: StandbyWarnings,
    ) -> Manager {
        let recycling = || ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        match self {
            Tls::Off => Manager::from_connect(
                config.clone(),
                WatchingConnect {
                    tls: NoTls,
                    warnings,
                },
                recycling(),
            ),
            Tls::Verified(connector) => Manager::from_connect(
                config.clone(),
                WatchingConnect {
                    tls: connector.clone(),
                    warnings,
                },
                recycling(),
            ),
        }
    }
}
