//! Opening a PostgreSQL ledger: for the service (pools, claim batcher, LISTEN), or for the
//! command line (one connection, the schema checked).

use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::claims::{run_batcher, CommitHealth};
use super::connection::{listen, settings, StandbyWarnings, Tls};
use super::pooled::Pooled;
use super::role::{error_text, RoleWatch, CONNECT_TIMEOUT};
use super::start::{check_durability, connect_at_start, migrate, MIGRATIONS};
use super::{PostgresLedger, CLAIM_QUEUE_CAPACITY};
use crate::config::{PostgresConfig, PostgresUrl};
use crate::ledger::work_side::WorkSide;

/// Connections per receiver: the claim batches in flight, the worker's transitions, reads.
const POOL_SIZE: usize = 8;
/// Connections for the reads an operator's page or a scrape makes, apart from the pool that
/// claims and changes jobs: a burst of console reads waits for these, never for a claim's.
const READER_POOL_SIZE: usize = 2;
/// The server cancels a reader's statement past this (as SQLite's service reads are cut):
/// none takes more than milliseconds on an indexed ledger.
const READ_BUDGET_MS: u32 = 5_000;

impl PostgresLedger {
    /// Connects, checks the server's durability setting, migrates under the advisory lock, and
    /// starts the claim batcher and the LISTEN task.
    pub async fn open(url: &PostgresUrl, config: &PostgresConfig) -> anyhow::Result<Self> {
        let pg_config = settings(url, CONNECT_TIMEOUT);
        let location = url.location();
        let tls = Tls::new(url, config.ca_file.as_deref())?;
        let mut client = connect_at_start(&tls, &pg_config, &location).await?;
        let synchronous_commit = check_durability(&client, &location).await?;
        migrate(&mut client, &location).await?;
        drop(client);
        // Checked once, held on every connection: a later `ALTER ROLE ... SET
        // synchronous_commit = off` cannot reach a connection the pool opens afterwards.
        let mut pg_config = pg_config;
        let options = pg_config.get_options().unwrap_or_default();
        pg_config.options(format!("{options} -c synchronous_commit={synchronous_commit}").trim());

        let role = RoleWatch::new();
        let warnings = StandbyWarnings::default();
        let pool = Pooled::build(&tls, &pg_config, &warnings, POOL_SIZE, &role, true)?;
        let mut reader_config = pg_config.clone();
        reader_config.options(
            format!(
                "{} -c default_transaction_read_only=on -c statement_timeout={READ_BUDGET_MS}",
                pg_config.get_options().unwrap_or_default()
            )
            .trim(),
        );
        let readers = Pooled::build(
            &tls,
            &reader_config,
            &StandbyWarnings::default(),
            READER_POOL_SIZE,
            &role,
            false,
        )?;

        let (claims, inbox) = mpsc::channel(CLAIM_QUEUE_CAPACITY);
        let stopping = CancellationToken::new();
        let health = Arc::new(CommitHealth::default());
        let failed = CancellationToken::new();
        let work_added = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        let batcher = tokio::spawn(run_batcher(
            pool.clone(),
            warnings.clone(),
            inbox,
            config.max_batch,
            stopping.clone(),
            health.clone(),
        ));
        tasks.spawn({
            let failed = failed.clone();
            async move {
                if batcher.await.is_err() {
                    tracing::error!(
                        "the PostgreSQL claim batcher panicked; nothing can be claimed any more"
                    );
                    failed.cancel();
                }
            }
        });
        tasks.spawn(listen(
            pg_config,
            tls,
            role.clone(),
            work_added.clone(),
            stopping.clone(),
        ));
        tracing::info!(ledger = %location, "PostgreSQL ledger open");
        Ok(PostgresLedger {
            pool,
            readers,
            warnings,
            claims: Some(claims),
            tasks: Mutex::new(Some(tasks)),
            stopping,
            health,
            failed,
            work_added,
            work_side: Some(WorkSide::started()),
            location,
            receiver: config.receiver.clone(),
        })
    }

    /// Connects for the command line and checks that the schema is the one this binary knows
    /// (the service migrates it; the command line never does). No claim batcher, no LISTEN.
    pub async fn open_existing(url: &PostgresUrl, config: &PostgresConfig) -> anyhow::Result<Self> {
        let location = url.location();
        let tls = Tls::new(url, config.ca_file.as_deref())?;
        let pg_config = settings(url, CONNECT_TIMEOUT);
        let client = tls
            .connect(&pg_config)
            .await
            .map_err(|error| anyhow::anyhow!(error_text(&error)))
            .with_context(|| format!("cannot connect to PostgreSQL at {location}"))?;
        let version = client
            .query_opt("SELECT version FROM sume_schema", &[])
            .await
            .ok()
            .flatten()
            .map_or(0, |row| row.get::<_, i32>(0));
        if version as usize != MIGRATIONS.len() {
            bail!(
                "the ledger at {location} has schema version {version}, this binary expects {}: \
                 start the service once to create or migrate it, or use the matching \
                 sume-receiver",
                MIGRATIONS.len()
            );
        }
        drop(client);
        let warnings = StandbyWarnings::default();
        let pool = Pooled::build(&tls, &pg_config, &warnings, 1, &RoleWatch::new(), true)?;
        Ok(PostgresLedger {
            readers: pool.clone(),
            pool,
            warnings,
            claims: None,
            tasks: Mutex::new(None),
            stopping: CancellationToken::new(),
            health: Arc::default(),
            failed: CancellationToken::new(),
            work_added: Arc::new(Notify::new()),
            work_side: None,
            location,
            receiver: config.receiver.clone(),
        })
    }
}
