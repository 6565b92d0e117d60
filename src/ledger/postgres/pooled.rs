//! How a statement runs on a pool: a connection whose server lost its role is dropped, never
//! pooled again, and the statement tried once more on a fresh one where that is safe.

use std::time::Duration;

use deadpool_postgres::{Object, Pool, Runtime};

use super::connection::{pool_error, statement_error, StandbyWarnings, Tls};
use super::role::{error_text, role_lost, RoleWatch, CONNECT_TIMEOUT};
use crate::ledger::error::{Cause, StorageError};

/// How long a statement may go unanswered before its connection is given up: far longer than
/// any of the ledger's bounded statements takes on a server that works, and short enough that
/// a commit waiting for a synchronous standby that will never answer (promoted away, while
/// the old primary stays up: a managed cloud's failover) frees its connection, and the claim
/// batcher its slot, within seconds rather than never.
pub(super) const ANSWER_BUDGET: Duration = Duration::from_secs(10);

/// A pool and the watch on its server's role.
#[derive(Clone)]
pub(super) struct Pooled {
    pool: Pool,
    role: RoleWatch,
}

/// Whether a statement may run again after its connection was lost mid-way, its outcome
/// unknown. A statement the server refused with an error (a read-only server, a terminated
/// session) was rolled back, and runs again whatever it is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Rerun {
    /// It reads only, or changing twice is changing once.
    Safe,
    /// Its outcome must be reported unknown (a claim's 503, a start that may have counted).
    Unsafe,
}

/// Why [`run_on!`] failed: no connection, the statement's error, or no answer within
/// [`ANSWER_BUDGET`] (and whether the statement was one whose outcome that leaves unknown).
pub(super) enum RunError {
    Pool(StorageError),
    Statement(tokio_postgres::Error),
    Unanswered(Rerun),
}

impl Pooled {
    /// A pool of at most `size` connections, each counting its notices in `warnings`, checked
    /// by `role` (writable too, if `writes`).
    pub(super) fn build(
        tls: &Tls,
        config: &tokio_postgres::Config,
        warnings: &StandbyWarnings,
        size: usize,
        role: &RoleWatch,
        writes: bool,
    ) -> anyhow::Result<Pooled> {
        let builder = Pool::builder(tls.manager(config, warnings.clone()))
            .max_size(size)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT));
        let pool = role.watch_pool(builder, writes).build().map_err(|error| {
            anyhow::anyhow!("cannot build a PostgreSQL connection pool: {error}")
        })?;
        Ok(Pooled {
            pool,
            role: role.clone(),
        })
    }

    /// A connection from the pool.
    pub(super) async fn get(&self) -> Result<Object, RunError> {
        self.pool
            .get()
            .await
            .map_err(|error| RunError::Pool(pool_error(error)))
    }

    /// What comes of one try of a statement on `client` ([`run_on!`]). If the server lost its
    /// role or the session ([`role_lost`]) the connection is dropped, with every other opened
    /// before it, and the statement runs once more on a fresh connection (`Again`) on the first
    /// try, when the server refused it (nothing committed) or `rerun` allows.
    /// Unanswered within [`ANSWER_BUDGET`], the connection is dropped (its answer, if it ever
    /// comes, would hold up every later statement on it), and the statement runs once more
    /// on a fresh connection if `rerun` allows.
    pub(super) fn settle<T>(
        &self,
        client: Object,
        answered: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
        rerun: Rerun,
        first_try: bool,
    ) -> Settled<T> {
        let error = match answered {
            Ok(Ok(value)) => return Settled::Done(Ok(value)),
            Ok(Err(error)) => error,
            Err(_) => {
                drop(Object::take(client));
                tracing::warn!(
                    budget = ?ANSWER_BUDGET,
                    "PostgreSQL did not answer a statement in time: its connection is given up"
                );
                if first_try && rerun == Rerun::Safe {
                    return Settled::Again;
                }
                return Settled::Done(Err(RunError::Unanswered(rerun)));
            }
        };
        if !role_lost(&error) {
            return Settled::Done(Err(RunError::Statement(error)));
        }
        let created = Object::metrics(&client).created;
        drop(Object::take(client));
        let why = error_text(&error);
        self.role.lost_on(created, &why);
        let refused = error.code().is_some();
        if first_try && (refused || rerun == Rerun::Safe) {
            tracing::debug!(error = %why, "running a statement again on a fresh connection");
            return Settled::Again;
        }
        Settled::Done(Err(RunError::Statement(error)))
    }

    pub(super) fn close(&self) {
        self.pool.close();
    }
}

/// See [`Pooled::settle`].
pub(super) enum Settled<T> {
    Done(Result<T, RunError>),
    Again,
}

/// Runs a statement on a connection of a [`Pooled`]: `run_on!(pooled, rerun, |client| body)`,
/// where `body` is an async block's content returning `Result<T, tokio_postgres::Error>`;
/// yields `Result<T, RunError>`. A macro, not a method taking a closure: the statements'
/// futures borrow their parameters, which a closure's future could not prove `Send` for.
macro_rules! run_on {
    ($pooled:expr, $rerun:expr, |$client:ident| $body:block) => {{
        let pooled: &$crate::ledger::postgres::pooled::Pooled = $pooled;
        let mut first_try = true;
        loop {
            let $client = match pooled.get().await {
                Ok(client) => client,
                Err(error) => break Err(error),
            };
            let answered: Result<Result<_, tokio_postgres::Error>, _> =
                tokio::time::timeout($crate::ledger::postgres::pooled::ANSWER_BUDGET, async {
                    $body
                })
                .await;
            match pooled.settle($client, answered, $rerun, first_try) {
                $crate::ledger::postgres::pooled::Settled::Done(result) => break result,
                $crate::ledger::postgres::pooled::Settled::Again => first_try = false,
            }
        }
    }};
}
pub(super) use run_on;

impl RunError {
    pub(super) fn into_storage(self) -> StorageError {
        match self {
            RunError::Pool(error) => error,
            RunError::Statement(error) => statement_error(error),
            RunError::Unanswered(rerun) => {
                let cause = Cause::message(format!(
                    "PostgreSQL did not answer within {ANSWER_BUDGET:?}; the connection was given up"
                ));
                match rerun {
                    Rerun::Safe => StorageError::Unavailable(cause),
                    Rerun::Unsafe => StorageError::OutcomeUnknown(cause),
                }
            }
        }
    }
}
