//! The service: opens the ledger, starts the background tasks and the listeners, stops cleanly.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::access::Tokens;
use crate::acknowledged::RecentlyAcknowledged;
use crate::admin::Admin;
use crate::config::{AdminTokens, Config, Credentials, Listener, ServerConfig, TlsConfig};
use crate::console::{Console, ReceiverHealth};
use crate::duplicates::DuplicateTally;
use crate::instance_lock::InstanceLock;
use crate::ledger::{self, Ledger};
use crate::logging::Escaped;
use crate::peer_throttle::PeerThrottle;
use crate::reconcile::Reconciler;
use crate::refusals::Refusals;
use crate::rollup::flush::RollupFlush;
use crate::rollup::ROLLUP;
use crate::route_name::RouteName;
use crate::server::{self, App};
use crate::sweeper::Sweeper;
use crate::tls::certificate::Certificate;
use crate::tls::Tls;
use crate::traces::Tracer;
use crate::vacuum::Vacuum;
use crate::worker::{self, Crew};
use crate::{check, ingest, notify, process};

/// Runs the receiver on `listener` until `shutdown` resolves, then shuts down gracefully.
pub async fn run(
    mut config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    // The port listened on, which differs from `server.listen` for a listener bound to port 0.
    let port = listener
        .local_addr()
        .context("cannot read the listener's address")?
        .port();
    config.database.name_receiver(port);
    // What check-config (the unit's ExecStartPre) refuses, serve refuses too: a handler that
    // cannot run would acknowledge every delivery and then let it go dead. First: a ledger
    // directory this user cannot write is said in its words, not as a lock file it cannot open.
    let mut findings = check::check(&config, check::Unreadable::Error);
    findings.refuse_errors()?;
    // The values the check judged are those the service runs with: each credential file is
    // read once per start. As the service's user, one that cannot be read is refused above.
    let credentials = findings
        .credentials
        .take()
        .context("a credential could not be read")?;
    // Several receivers may share a PostgreSQL ledger; a SQLite file has one owner.
    let _instance = match config.database.sqlite_path() {
        Some(path) => Some(InstanceLock::acquire(path)?),
        None => None,
    };
    // The check's warnings hold the configuration's own (computed once, there) and the
    // certificates'; `serve` only warns of weak or exposed secrets (`check-config --strict`,
    // the unit's check before each start, refuses them).
    for warning in findings.warnings.iter().chain(&findings.weak_secrets) {
        tracing::warn!("{warning}");
    }
    process::return_freed_memory();
    match process::raise_open_files_limit() {
        Ok(limit) => {
            tracing::info!(
                open_files = limit,
                max_connections = config.server.max_connections,
                "open files limit"
            );
            if (limit as usize) < config.server.max_connections + RESERVED_FILE_DESCRIPTORS {
                tracing::warn!("the open files limit ({limit}) is below server.max_connections + {RESERVED_FILE_DESCRIPTORS}: raise LimitNOFILE or lower max_connections");
            }
        }
        Err(error) => tracing::warn!(%error, "cannot read or raise the open files limit"),
    }
    let ledger = Ledger::open_at(&config.database, credentials.database_url.as_ref())
        .await
        .with_context(|| match config.database.sqlite_path() {
            Some(path) => format!("cannot open the ledger {}", path.display()),
            None => "cannot open the PostgreSQL ledger".to_owned(),
        })?;
    run_on(config, credentials, ledger, listener, shutdown).await
}

/// Runs the receiver on an open `ledger` with the `credentials` read at start (see [`run`],
/// which checks the configuration, reads them, opens the ledger, and takes the instance lock of
/// a SQLite ledger).
/// Ends with an error, after a graceful stop, if the ledger's writer dies: systemd then
/// restarts the service instead of leaving it to answer 503 forever.
pub async fn run_on(
    config: Config,
    mut credentials: Credentials,
    ledger: Arc<Ledger>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let webhook_certificate = credentials.take_certificate(Listener::Webhook);
    let admin_certificate = credentials.take_certificate(Listener::Admin);
    // Before anything counts: the kept minutes are put back as they were.
    let minutes = Arc::new(RollupFlush::new(ledger.clone(), &ROLLUP));
    match minutes.restore().await {
        Ok(kept) => tracing::debug!(minutes = kept, "the console's last hour read back"),
        Err(error) => {
            tracing::warn!(%error, "cannot read the console's last hour back: its charts start empty");
        }
    }
    tasks.spawn(minutes.clone().run(stop.clone()));
    // Its own stop, after every other task's: the worker's last attempts end during the grace.
    let (tracer, exporter) =
        crate::traces::start(config.tracing.as_ref(), &credentials.trace_headers)
            .context("cannot start the trace exporter (tracing.headers_file)")?;
    let stop_exporting = CancellationToken::new();
    let exporter = exporter.map(|exporter| {
        if let Some(tracing) = &config.tracing {
            let endpoint = crate::config::redact_url(&tracing.endpoint.to_string());
            tracing::info!(%endpoint, sample_ratio = tracing.sample_ratio, "traces on: spans exported over OTLP/HTTP");
        }
        tokio::spawn(exporter.run(stop_exporting.clone(), config.server.shutdown_grace))
    });

    // A worker per route, with the route's handler, limits and hold; SIGHUP changes them.
    let routes = Arc::new(config.routes.clone());
    let mut crew = Crew::new(
        ledger.clone(),
        routes.clone(),
        (config.sweeper.stale_after, config.server.shutdown_grace),
        tracer.clone(),
        stop.clone(),
    );
    let queue = crew.queues();
    if routes.list().is_empty() {
        tracing::warn!(
            "no [handler] configured: claimed jobs stay `claimed` for an external consumer"
        );
    } else {
        let max_attempts = queue.clone();
        let sweeper = Sweeper::new(
            ledger.clone(),
            queue.clone(),
            Arc::new(move |route: &str| max_attempts.max_attempts(route)),
        )
        .traced_by(tracer.clone());
        let recovered = sweeper
            .recover()
            .await
            .context("cannot recover unfinished jobs")?;
        tracing::info!(
            interrupted = recovered.leases_expired,
            "recovered unfinished jobs"
        );
        crew.apply(routes)?;
        tasks.spawn(sweeper.run(config.sweeper.interval, stop.clone()));
    }

    let recent = Arc::new(RecentlyAcknowledged::default());
    let vacuum = Vacuum::new(ledger.clone(), config.retention.clone(), stop.clone())
        .forgetting_in(recent.clone());
    tasks.spawn(vacuum.run(config.retention.interval));
    match config.sume_api.clone().zip(credentials.api_key) {
        Some((api, api_key)) => {
            let base_url = crate::config::redact_url(&api.base_url);
            let reconciler = Reconciler::new(ledger.clone(), api, api_key, queue.clone())
                .traced_by(tracer.clone());
            tasks.spawn(reconciler.run(stop.clone()));
            tracing::info!(%base_url, "reconciliation on: expected jobs without a webhook are polled");
        }
        None => tracing::warn!("no [sume_api] configured: reconciliation is off (a job whose webhook never arrives is not polled)"),
    }
    let refusals = Arc::new(Refusals::default());
    let duplicates = Arc::new(DuplicateTally::default());
    tasks.spawn(duplicates.clone().run(ledger.clone(), stop.clone()));
    let tls = start_tls(
        config.server.tls.as_ref(),
        (Listener::Webhook, webhook_certificate),
        &config.server,
        &mut tasks,
        &stop,
    )
    .await?;
    let seen_by_admin = (ledger.clone(), queue.clone(), refusals.clone());
    let admin = start_admin(
        (&config, credentials.admin_tokens, admin_certificate),
        seen_by_admin,
        (&mut tasks, tls.clone()),
        (&stop, &tracer),
    )
    .await?;
    if let Some(admin) = admin {
        tasks.spawn(admin);
    }

    crate::metrics::METRICS.set_signature_tolerance(config.signature.tolerance);
    let app = Arc::new(App {
        webhook_path: config.server.webhook_path.clone(),
        ingest: ingest::Ingest::new(
            &config,
            credentials.signing_secrets,
            ledger.clone(),
            queue,
            (refusals, duplicates, recent),
            tracer,
        ),
        ledger: ledger.clone(),
        expose_metrics: config.server.expose_metrics,
        tls: tls.clone(),
    });
    tasks.spawn(reload_on_hangup(
        config.clone(),
        app.clone(),
        crew,
        stop.clone(),
    ));
    tracing::info!(
        listen = %listener.local_addr()?,
        https = config.server.tls.is_some(),
        webhook_path = %config.server.webhook_path,
        ledger = %ledger.location(),
        "sume-receiver listening"
    );
    let server = tokio::spawn({
        let stop = stop.clone();
        let server_config = config.server.clone();
        async move { server::serve(listener, app, &server_config, tls, stop).await }
    });

    tasks.spawn(notify::watchdog(ledger.clone(), stop.clone()));
    notify::ready();
    let writer_failed = tokio::select! {
        () = shutdown => false,
        () = ledger.failed() => true,
    };
    notify::stopping();
    if writer_failed {
        tracing::error!("stopping: the ledger failed, so no delivery can be claimed");
    } else {
        tracing::info!("shutting down: no new deliveries; finishing in-flight work");
    }
    stop.cancel();
    server.await?;
    while tasks.join_next().await.is_some() {}
    stop_exporting.cancel();
    if let Some(exporter) = exporter {
        let _ = exporter.await;
    }
    // After the worker's last attempts ended: they count in the current minute.
    if !writer_failed {
        minutes.flush_at_stop().await;
    }
    ledger.close().await;
    if writer_failed {
        if ledger.is_storage_lost() {
            return Err(ledger::StorageLost {
                location: ledger.location(),
            }
            .into());
        }
        if ledger.is_damaged() {
            return Err(ledger::LedgerDamaged(format!(
                "the check found the ledger {} damaged: the log above says where, and how to \
                 recover; the next start checks it before serving",
                ledger.location()
            ))
            .into());
        }
        anyhow::bail!("the ledger writer thread failed (see the log above); exiting so the service is restarted");
    }
    tracing::info!("stopped");
    Ok(())
}

/// File descriptors the service needs besides connections: the ledger's files and
/// connections, handler pipes, the admin listener.
const RESERVED_FILE_DESCRIPTORS: usize = 64;

/// On SIGHUP: reads the config file again, and puts its signing secrets (the file's and
/// `secrets_file`'s) and its routes in force between two deliveries. A file that cannot be read
/// or is not valid keeps the secrets and routes in use. At the stop, waits for the routes'
/// workers.
async fn reload_on_hangup(config: Config, app: Arc<App>, mut crew: Crew, stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())
        .inspect_err(|error| {
            tracing::warn!(%error, "cannot handle SIGHUP: secrets and routes change only at restart");
        })
        .ok();
    say_work_not_run(&app).await;
    loop {
        tokio::select! {
            Some(_) = async { hangups.as_mut()?.recv().await } => {}
            () = stop.cancelled() => break,
        }
        let reloaded = config.reload().and_then(|fresh| {
            let secrets = fresh.signing_secrets()?;
            let routes = reloadable_routes(&config, &fresh)?;
            Ok((secrets, routes))
        });
        let (secrets, routes) = match reloaded {
            Ok(reloaded) => reloaded,
            Err(error) => {
                tracing::error!(
                    error = format!("{error:#}"),
                    live = app.ingest.secret_count(),
                    "SIGHUP: reload failed; the secrets and routes in use stay live"
                );
                continue;
            }
        };
        let routes = Arc::new(routes);
        let changes = match crew.apply(routes.clone()) {
            Ok(changes) => changes,
            Err(error) => {
                tracing::error!(
                    error = format!("{error:#}"),
                    "SIGHUP: reload failed: a route cannot run; the secrets and routes in use stay live"
                );
                continue;
            }
        };
        let live = secrets.len();
        app.ingest.replace_secrets(secrets);
        let names = |list: &[RouteName]| {
            list.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        tracing::info!(
            live,
            routes = routes.list().len(),
            started = names(&changes.started),
            replaced = names(&changes.replaced),
            stopped = names(&changes.stopped),
            "SIGHUP: signing secrets and routes reloaded (other settings change at restart)"
        );
        say_work_not_run(&app).await;
    }
    crew.stopped().await;
}

/// Reads each route's waiting work, and warns of the work of routes not in force: it waits
/// unrun until a route of its name comes back (`/readyz` shows it too).
async fn say_work_not_run(app: &App) {
    let queues = app.ingest.queue();
    if queues.names().is_empty() {
        return;
    }
    match app.ledger.metrics_snapshot().await {
        Ok(snapshot) => {
            for (route, waiting) in queues.note_work(&snapshot.work) {
                tracing::warn!(route = %Escaped(&route), waiting, "work waits for a route not in the config: it runs when a route of that name comes back");
            }
        }
        Err(error) => tracing::warn!(%error, "cannot read the routes' waiting work"),
    }
}

/// The routes of the config read again, checked as a start checks them (each route's program
/// and CA file). A receiver with routes keeps some, and one without gets none: the sweeper and
/// the work side start with the service.
fn reloadable_routes(running: &Config, fresh: &Config) -> anyhow::Result<crate::config::Routes> {
    match (running.routes.list().is_empty(), fresh.routes.list().is_empty()) {
        (false, true) => anyhow::bail!("the config has no [handler] nor [[route]] any more: a receiver that runs handlers stops running them at a restart, not at a reload"),
        (true, false) => anyhow::bail!("the config has a [handler] or [[route]] now: a receiver started without one starts running handlers at a restart, not at a reload"),
        _ => {}
    }
    // A CA file that cannot be read stops the routes' workers from being made (Crew::apply).
    let errors = check::route_errors(fresh);
    if !errors.is_empty() {
        anyhow::bail!("{}", errors.join("; "));
    }
    Ok(fresh.routes.clone())
}

/// A listener's TLS from its `[*.tls]` table (and the certificate files read at start), with
/// the task that keeps its certificate current and, for ACME's http-01, the listener that
/// answers the CA.
async fn start_tls(
    config: Option<&TlsConfig>,
    (listener, read_at_start): (Listener, Option<Certificate>),
    server_config: &ServerConfig,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Arc<Tls>>> {
    let Some(config) = config else {
        return Ok(None);
    };
    let tls = Tls::from_config(config, listener, read_at_start)?;
    if let Some((address, challenges)) = tls.http_challenges() {
        let http = server::bind(address).with_context(|| {
            format!("cannot listen on {address} (tls.acme.http_listen, for http-01)")
        })?;
        tracing::info!(listen = %address, "ACME http-01 listener on");
        let (server_config, stop) = (server_config.clone(), stop.clone());
        tasks.spawn(
            async move { server::serve(http, challenges, &server_config, None, stop).await },
        );
    }
    tasks.spawn(tls.clone().maintain(stop.clone()));
    Ok(Some(tls))
}

/// Binds the admin listener when `[admin]` has a token (`tokens`, read at start); returns the
/// server to spawn.
async fn start_admin(
    (config, tokens, certificate): (&Config, Option<AdminTokens>, Option<Certificate>),
    (ledger, queue, refusals): (Arc<Ledger>, worker::Queues, Arc<Refusals>),
    (tasks, webhook_tls): (&mut tokio::task::JoinSet<()>, Option<Arc<Tls>>),
    (stop, tracer): (&CancellationToken, &Tracer),
) -> anyhow::Result<Option<impl Future<Output = ()> + use<>>> {
    let Some((admin_config, tokens)) = config.admin.as_ref().zip(tokens) else {
        return Ok(None);
    };
    let Some(operator) = tokens.operator else {
        return Ok(None);
    };
    let tokens = Arc::new(Tokens {
        operator,
        read: tokens.read,
        named: tokens.named,
    });
    let address = admin_config.listen;
    let listener = server::bind(address)
        .with_context(|| format!("cannot listen on {address} (admin.listen)"))?;
    let tls = start_tls(
        admin_config.tls.as_ref(),
        (Listener::Admin, certificate),
        &config.server,
        tasks,
        stop,
    )
    .await?;
    let certificates = webhook_tls.iter().cloned().chain(tls.clone()).collect();
    let console = Console::new(
        config,
        (ledger.clone(), queue.clone(), refusals.clone()),
        Arc::new(ReceiverHealth {
            ledger: ledger.clone(),
            queue: queue.clone(),
        }),
        (tokens.clone(), certificates),
    )
    .traced_by(tracer.clone());
    let admin = Arc::new(Admin {
        ledger,
        tokens,
        api_auth: PeerThrottle::new("admin API bearer token"),
        reconcile_after: config.reconcile_after(),
        queue,
        refusals,
        console,
        webhook_tls,
        tracer: tracer.clone(),
    });
    tracing::info!(listen = %address, https = tls.is_some(), "admin listener on");
    let (server_config, stop) = (config.server.clone(), stop.clone());
    Ok(Some(async move {
        server::serve(listener, admin, &server_config, tls, stop).await
    }))
}
