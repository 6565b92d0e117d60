//! The ledger contract: every operation declared once, implemented by each backend.
//!
//! [`operations!`] is the one list of operations. It becomes the [`Backend`] trait, which the
//! SQLite and PostgreSQL ledgers implement (the compiler holds both to the same signatures),
//! and [`Ledger`](super::Ledger)'s methods, which forward to whichever backend it is. An
//! operation with a body (`= { ... }`) has that default for a backend that lacks it.
//! Algorithms that are the same on both backends are written once on `Ledger` (`mod.rs`), from
//! these operations.

use std::future::Future;

use super::error::StorageError;
use super::model::{
    Attempt, AttemptEnd, ClaimOutcome, Cursor, Dispatch, DispatchStop, DueExpectation, DueJobs,
    Expectation, Hold, JobDetail, JobPage, JobStats, LeasedAttempt, Leases, NewClaim, PollResult,
    Release, RetentionStep, RetryCount, RetryError, RetryFilter, State,
};
use super::params::{ActionTaken, Actor, ProbeMove};
use super::rollups::MinuteRollup;
use super::work_side::WorkSide;

/// One operation of the [`Backend`] trait, from [`operations!`].
macro_rules! backend_method {
    (@async [$($meta:tt)*] $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $($meta)*
        fn $name(&self $(, $arg: $ty)*) -> impl Future<Output = $ret> + Send;
    };
    (@async [$($meta:tt)*] $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty = $default:block) => {
        $($meta)*
        #[allow(unused_variables)]
        fn $name(&self $(, $arg: $ty)*) -> impl Future<Output = $ret> + Send {
            async move $default
        }
    };
    (@sync [$($meta:tt)*] $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $($meta)*
        fn $name(&self $(, $arg: $ty)*) -> $ret;
    };
    (@sync [$($meta:tt)*] $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty = $default:block) => {
        $($meta)*
        #[allow(unused_variables)]
        fn $name(&self $(, $arg: $ty)*) -> $ret $default
    };
}

/// One of [`Ledger`](super::Ledger)'s methods, from [`operations!`]: it forwards to the backend
/// the ledger is (a default lives in the trait, so it is not needed here).
macro_rules! forwarding_method {
    (@async [$($meta:tt)*] $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty $(= $default:block)?) => {
        $($meta)*
        pub async fn $name(&self $(, $arg: $ty)*) -> $ret {
            match self {
                Ledger::Sqlite(backend) => backend.$name($($arg),*).await,
                Ledger::Postgres(backend) => backend.$name($($arg),*).await,
            }
        }
    };
    (@sync [$($meta:tt)*] $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty $(= $default:block)?) => {
        $($meta)*
        pub fn $name(&self $(, $arg: $ty)*) -> $ret {
            match self {
                Ledger::Sqlite(backend) => backend.$name($($arg),*),
                Ledger::Postgres(backend) => backend.$name($($arg),*),
            }
        }
    };
}
pub(super) use forwarding_method;

/// Hands each operation of the two lists to `$method` (`@async` or `@sync`, its attributes,
/// name, arguments, return type and default), in item position: inside the trait here, inside
/// `impl Ledger` in `mod.rs`.
macro_rules! each_operation {
    (
        $method:ident
        async {
            $( $(#[$async_meta:meta])*
               fn $async_name:ident(&self $(, $async_arg:ident: $async_ty:ty)*) -> $async_ret:ty
               $(= $async_default:block)?; )*
        }
        sync {
            $( $(#[$sync_meta:meta])*
               fn $sync_name:ident(&self $(, $sync_arg:ident: $sync_ty:ty)*) -> $sync_ret:ty
               $(= $sync_default:block)?; )*
        }
    ) => {
        $( $method!(@async [$(#[$async_meta])*] $async_name
               ($($async_arg: $async_ty),*) -> $async_ret $(= $async_default)?); )*
        $( $method!(@sync [$(#[$sync_meta])*] $sync_name
               ($($sync_arg: $sync_ty),*) -> $sync_ret $(= $sync_default)?); )*
    };
}
pub(super) use each_operation;

/// The operations, declared once, with paths that resolve wherever they are generated; each is
/// handed to `$method` (see [`each_operation!`]): [`backend_method!`] makes the [`Backend`]
/// trait here, [`forwarding_method!`] [`Ledger`](super::Ledger)'s methods in `mod.rs`.
macro_rules! operations {
    ($method:ident) => { $crate::ledger::contract::each_operation! { $method
    async {
        /// Records a delivery's claim unless its job_id is known (the one idempotency check);
        /// [`StorageError::Overloaded`] at once when too many claims wait for their commit.
        fn claim(&self, claim: NewClaim) -> Result<ClaimOutcome, StorageError>;

        /// Moves a job's due work on `route` to `running` under a lease and counts the
        /// attempt. `None` when that work is not waiting to run (running, finished, unknown,
        /// or being started by another receiver), so it is never started twice.
        fn start_attempt(
            &self,
            job_id: &crate::job_id::JobId,
            route: &crate::route_name::RouteName,
            now: i64,
            lease_expires_at: i64
        ) -> Result<Option<Attempt>, StorageError>;

        /// Records how a running attempt ended; the job's new state, or `None` if the attempt
        /// no longer owns the job (the attempt number is the fencing token).
        fn finish_attempt(&self, attempt: &Attempt, end: &AttemptEnd, now: i64)
            -> Result<Option<State>, StorageError>;

        /// Gives back an attempt our own shutdown interrupted, or a hold made uncounted: it
        /// does not count, its history says why, and the job is due again at `now`. `false`
        /// if the attempt no longer owned the job.
        fn release_attempt(&self, attempt: &Attempt, release: &Release, now: i64)
            -> Result<bool, StorageError>;

        /// The running attempts `leases` names: candidates for [`Backend::take_back_lease`].
        fn leases_to_take_back(&self, leases: Leases)
            -> Result<Vec<LeasedAttempt>, StorageError>;

        /// Takes back one lease that expired before `cutoff`: the attempt counts as failed
        /// with `error`; the work is due again at `now`, or dead after its last attempt. `None`
        /// if the lease is no longer that one (taken back, or a new attempt started, since).
        fn take_back_lease(
            &self,
            lease: &LeasedAttempt,
            cutoff: i64,
            now: i64,
            max_attempts: u32,
            error: &str
        ) -> Result<Option<State>, StorageError>;

        /// Jobs whose work on `route` waits to run and whose time has come, oldest first, at
        /// most `limit`.
        fn due_jobs(&self, route: &crate::route_name::RouteName, now: i64, limit: usize)
            -> Result<DueJobs, StorageError>;

        /// When the earliest waiting work of any route is due (the scrape's gauge), read as
        /// reads are: a ledger that cannot be written still answers it.
        fn next_due_at(&self) -> Result<Option<i64>, StorageError>;

        /// Makes a waiting job's waiting work (every route's) `dead` with `error` and no
        /// attempt (its stored id can never run), recorded as the receiver's action; `false`
        /// if none was waiting. The id is
        /// the stored text: it is one that [`JobId`](crate::job_id::JobId) refuses.
        fn give_up(&self, job_id: &str, error: &str, now: i64) -> Result<bool, StorageError>;

        /// An operator's cancel: makes a job's waiting work (`claimed` or `retrying`) on
        /// `route`, or on every route (`None`), `dead` without running it, recorded with who
        /// and why; `false` if none was waiting.
        fn cancel_job(
            &self,
            job_id: &crate::job_id::JobId,
            route: Option<&crate::route_name::RouteName>,
            actor: &Actor,
            now: i64
        ) -> Result<bool, StorageError>;

        /// Resolves once new work may be in the ledger that this process did not put there (a
        /// claim on another receiver); never, where this process is the only writer.
        fn work_added_elsewhere(&self) -> () = { std::future::pending().await };

        /// One retention step, at most `limit` rows; how many it changed.
        fn retention_step(&self, step: RetentionStep, before: i64, limit: usize)
            -> Result<usize, StorageError>;

        /// Returns unused pages to the file system, at most `pages` of them; `true` if some
        /// remain. A backend that does this on its own has nothing to do.
        fn release_free_pages(&self, pages: usize) -> Result<bool, StorageError> = { Ok(false) };

        /// Writes this receiver's `rollup` of its minute, replacing what an earlier write of that
        /// minute held (on PostgreSQL each receiver keeps its own minutes, under its lease name).
        fn store_rollup(&self, rollup: &MinuteRollup) -> Result<(), StorageError>;

        /// This receiver's minutes from `minute` (Unix seconds / 60) on, oldest first, at most
        /// `limit`: a range of the table's key.
        fn rollups_since(&self, minute: i64, limit: usize)
            -> Result<Vec<MinuteRollup>, StorageError>;

        /// Registers a job to expect; `false` if it was registered already.
        fn expect_job(&self, job_id: &crate::job_id::JobId, now: i64, first_poll_at: i64)
            -> Result<bool, StorageError>;

        /// Resolves due expectations whose webhook did arrive; how many.
        fn resolve_arrived(&self, now: i64) -> Result<usize, StorageError>;

        /// Expectations due for a poll, at most `limit`. With several receivers each one is
        /// handed to one of them only (its next poll moves `lease` ahead while it is polled).
        fn due_expectations(&self, now: i64, limit: usize, lease: std::time::Duration)
            -> Result<Vec<DueExpectation>, StorageError>;

        /// Records what a poll of a waiting expectation found. The id is the stored text: a
        /// poll gives up on one that [`JobId`](crate::job_id::JobId) refuses.
        fn record_poll(&self, job_id: &str, result: &PollResult, now: i64)
            -> Result<(), StorageError>;

        /// What `/metrics` shows of the ledger: the jobs by state (the backlog from partial
        /// indexes, the finished from kept counts), the oldest unfinished job (the head of a
        /// partial index), file sizes; nothing that grows with history.
        fn metrics_snapshot(&self) -> Result<crate::metrics::Snapshot, StorageError>;

        /// Merges the finished counts that ended sessions kept (PostgreSQL's per-process rows),
        /// so that reading them stays a few rows: a retention step.
        fn fold_counts(&self) -> Result<(), StorageError> = { Ok(()) };

        /// A change that commits nothing, through the same path as claims: proves that the
        /// ledger takes claims now (the watchdog's probe).
        fn probe(&self) -> Result<(), StorageError>;

        /// Brings [`readiness`](Backend::readiness) up to date with no claim to prove it, for
        /// those who ask (`/readyz`, a scrape): a backend whose readiness is only learnt from a
        /// round trip makes one (at most once a second); one that knows it at once does nothing.
        fn prove_readiness(&self) -> () = {};

        /// Resolves if the ledger can never commit again: the service must exit.
        fn failed(&self) -> ();

        /// Stops after everything queued before this call is committed.
        fn close(&self) -> ();

        /// Adds duplicate deliveries to their jobs' counts: (job_id, how many, when the last
        /// came); a job no longer in the ledger is skipped.
        fn record_duplicates(&self, seen: &[(crate::job_id::JobId, u32, i64)]) -> Result<(), StorageError>;

        /// One page of jobs, newest first, optionally in one state, after `after` (the end of
        /// the page before), down to `since` (a time of the list's own); each list reads its
        /// own index in order.
        fn list_jobs(
            &self,
            state: Option<State>,
            after: Option<&Cursor>,
            since: Option<i64>,
            limit: usize
        ) -> Result<JobPage, StorageError>;

        /// Which of `job_ids` have work on `route` (a page of a list filtered by route, a chunk
        /// of the list at a time: each a lookup of the work's key).
        fn jobs_on_route(&self, route: &crate::route_name::RouteName, job_ids: &[String])
            -> Result<Vec<String>, StorageError>;

        /// One job with its history: every attempt and action kept.
        fn show_job(&self, job_id: &crate::job_id::JobId) -> Result<Option<JobDetail>, StorageError>;

        /// The trace context kept with a job at its claim (see [`NewClaim::trace_context`]);
        /// `None` for a job without one, or not in the ledger.
        fn trace_context(&self, job_id: &crate::job_id::JobId) -> Result<Option<String>, StorageError>;

        /// Makes a `done` or `dead` job due again with a fresh set of attempts (and wakes the
        /// workers of every receiver), recorded as `actor`'s action: the finished work on
        /// `route`, or with `None` a dead job's dead routes and a done job's every route.
        fn retry_job(
            &self,
            job_id: &crate::job_id::JobId,
            route: Option<&crate::route_name::RouteName>,
            actor: &Actor,
            now: i64
        ) -> Result<(), RetryError>;

        /// Retries up to `limit` of the finished jobs `filter` takes, in one transaction, each
        /// recorded as `actor`'s action; how many. A job retried leaves the filter,
        /// so repeating this until it returns 0 takes them all, a batch at a time.
        fn retry_matching(&self, filter: &RetryFilter, actor: &Actor, now: i64, limit: usize)
            -> Result<usize, StorageError>;

        /// What [`Backend::retry_matching`] would take in all, counted exactly.
        fn count_retry_matching(&self, filter: &RetryFilter)
            -> Result<RetryCount, StorageError>;

        /// Makes a job waiting in backoff (`retrying`) due at `now`, skipping the rest of its
        /// backoff (and wakes the workers of every receiver), on `route` or on every route
        /// (`None`), recorded as `actor`'s action; `false` if none was waiting for a retry.
        fn run_now(
            &self,
            job_id: &crate::job_id::JobId,
            route: Option<&crate::route_name::RouteName>,
            actor: &Actor,
            now: i64
        ) -> Result<bool, StorageError>;

        /// Records an action on a job that changes nothing else (a replay through another
        /// handler); `false` if the job is not in the ledger.
        fn record_action(&self, job_id: &crate::job_id::JobId, taken: ActionTaken<'_>, now: i64)
            -> Result<bool, StorageError>;

        /// The running jobs per receiver that holds them (its name: `leased_by`); empty where
        /// one process is the only receiver.
        fn running_by_receiver(&self) -> Result<Vec<(String, u64)>, StorageError> = { Ok(Vec::new()) };

        /// Whether the workers (of every receiver) run jobs.
        fn dispatch(&self) -> Result<Dispatch, StorageError>;

        /// Pauses or resumes the workers of every receiver; `false` if they already were.
        /// Deliveries are received and claimed either way. Resuming also ends every hold and
        /// every route's own pause (and is then a change, recorded as `actor`'s, even if
        /// dispatch was not paused). A change begins or ends stops in the log of
        /// [`Backend::dispatch_stops`] (a pause with the actor's reason).
        fn set_dispatch(&self, paused: bool, actor: &Actor, now: i64)
            -> Result<bool, StorageError>;

        /// Whether `route`'s worker runs jobs: paused when every route is, or when the route
        /// is paused alone (which one says [`Dispatch::route`]).
        fn route_dispatch(&self, route: &crate::route_name::RouteName)
            -> Result<Dispatch, StorageError>;

        /// Pauses or resumes one route's work on every receiver; `false` if it already was.
        /// Resuming also ends the route's hold (and is then a change). A change begins or ends
        /// the route's stop in the log of [`Backend::dispatch_stops`].
        fn set_route_dispatch(
            &self,
            route: &crate::route_name::RouteName,
            paused: bool,
            actor: &Actor,
            now: i64
        ) -> Result<bool, StorageError>;

        /// `route`'s hold, if one is open (`src/hold/`).
        fn hold(&self, route: &crate::route_name::RouteName) -> Result<Option<Hold>, StorageError>;

        /// Every route's open hold, by route.
        fn holds(&self) -> Result<Vec<Hold>, StorageError>;

        /// Opens `hold` (and begins its stop) unless its route's hold is open; `false` if one
        /// was (and stays as it was).
        fn open_hold(&self, hold: &Hold) -> Result<bool, StorageError>;

        /// Moves the next probe of `moved.route`'s hold open since `moved.since` from `moved.from` to
        /// `moved.to`, with `moved.interval_ms` as its new wait; `false` if that hold is not
        /// open or its next probe is no longer at `from` (another receiver took the probe):
        /// one probe at a time.
        fn move_probe(&self, moved: &ProbeMove) -> Result<bool, StorageError>;

        /// Ends `route`'s hold open since `since` (its stop at `now`) and returns it; `None` if
        /// it was not open (ended already, by another receiver or `jobs resume`).
        fn end_hold(&self, route: &crate::route_name::RouteName, since: i64, now: i64)
            -> Result<Option<Hold>, StorageError>;

        /// The stops of dispatch (pauses, holds) in force during some of `from..to`: the first
        /// `limit` begun in it, and the last of each kind begun before `from` if it lasted
        /// past it; oldest first. Retention forgets the ended ones
        /// ([`RetentionStep::DeleteEndedStops`]).
        fn dispatch_stops(&self, from: i64, to: i64, limit: usize)
            -> Result<Vec<DispatchStop>, StorageError>;

        /// The counts of `jobs stats` (a table scan: a command for people).
        fn job_stats(&self, now: i64) -> Result<JobStats, StorageError>;

        /// The job_ids matching a `LIKE` pattern (the load generator's check of its run).
        #[cfg(feature = "bench")]
        fn job_ids_like(&self, pattern: &str) -> Result<Vec<String>, StorageError>;

        /// The most recently expected jobs.
        fn list_expectations(&self, limit: usize) -> Result<Vec<Expectation>, StorageError>;
    }
    sync {
        /// Where the ledger is, for logs: a file path, or PostgreSQL's host and database
        /// (never the password).
        fn location(&self) -> String;

        /// Whether other receivers may use this ledger at the same time.
        fn is_shared(&self) -> bool = { false };

        /// Whether [`work_added_elsewhere`](Backend::work_added_elsewhere) resolves for every
        /// change of another process: an idle worker then needs no timer to look for them.
        fn sees_work_added_elsewhere(&self) -> bool = { false };

        /// Claims waiting for their commit (on SQLite, with every other change: one writer
        /// queue).
        fn claim_queue_depth(&self) -> usize;

        /// Whether a delivery sent now would be claimed; the reason when not.
        fn readiness(&self) -> Result<(), &'static str>;

        /// Whether the work side can write the ledger, where the backend tracks it apart from
        /// readiness (PostgreSQL: a failover can leave it behind).
        fn work_side(&self) -> Option<WorkSide> = { None };

        /// Why the ledger cannot write now (it failed, or its last commit did), if it cannot;
        /// the console's verdict reads it. A backend that knows no such state has no answer.
        fn write_failure(&self) -> Option<&'static str> = { None };

        /// Whether the ledger failed because the disk did (see [`StorageLost`](crate::ledger::StorageLost)).
        fn is_storage_lost(&self) -> bool = { false };

        /// Whether the ledger failed because its damage check found damage (see
        /// [`LedgerDamaged`](crate::ledger::LedgerDamaged)).
        fn is_damaged(&self) -> bool = { false };
    }
} };
}
pub(super) use operations;

/// What a ledger backend does; see the module's documentation.
pub trait Backend: Send + Sync {
    operations!(backend_method);
}
