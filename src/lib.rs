//! sume-receiver: verified, durable, exactly-once processing of Sume job webhooks.
//!
//! The flow of a delivery, one module per step:
//! `server` (HTTP) -> [`ingest`] ([`signature`] check, parse) -> [`ledger`] (durable claim,
//! group commit) -> [`worker`] (leases, retries) -> `handler` (command or HTTP) -> `done`.
//! Background tasks keep it whole: [`sweeper`] re-runs lost work, [`vacuum`] applies retention,
//! `reconcile` polls Sume for expected jobs whose webhook never arrived (registered through
//! `admin` or the CLI). [`config`] reads the TOML file, `metrics` counts, [`cli`] is the
//! command line, `loadgen` the benchmark client (the `bench` feature); `service` puts it all together ([`run`]).

// Public: what main.rs, the integration tests and the fuzz target use.
mod admin;
mod check;
pub mod cli;
pub mod config;
pub mod event_type;
mod handler;
pub mod http_client;
pub mod ingest;
mod instance_lock;
pub mod job_id;
pub mod ledger;
#[cfg(feature = "bench")]
mod loadgen;
pub mod logging;
mod metrics;
mod notify;
mod process;
mod reconcile;
mod repeat;
mod send;
mod server;
mod service;
pub mod signature;
pub mod sweeper;
mod throttle;
pub mod vacuum;
pub mod worker;

pub use service::{run, run_on};
