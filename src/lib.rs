//! sume-receiver: verified, durable, exactly-once processing of Sume job webhooks.
//!
//! The flow of a delivery, one module per step:
//! `server` (HTTP) -> [`ingest`] ([`signature`] check, parse) -> [`ledger`] (durable claim,
//! group commit) -> [`worker`] (leases, retries) -> `handler` (command or HTTP) -> `done`.
//! Background tasks keep it whole: [`sweeper`] re-runs lost work, [`vacuum`] applies retention,
//! `reconcile` polls Sume for expected jobs whose webhook never arrived (registered through
//! `admin` or the CLI). [`config`] reads the TOML file, `metrics` counts, `loadgen` is the
//! benchmark client (the `bench` feature); `service` puts it all together ([`run`]). The
//! command line (its tree, man page, completions and tables) is the binary's: `src/cli/`.

// Public: what main.rs, the integration tests and the fuzz target use.
mod access;
pub mod acknowledged;
pub mod actions;
mod admin;
pub mod check;
pub mod config;
mod connections;
mod console;
pub mod duplicates;
pub mod event_type;
pub mod handler;
pub mod hold;
pub mod http_client;
pub mod ingest;
pub mod instance_lock;
pub mod job_id;
pub mod ledger;
#[cfg(feature = "bench")]
pub mod loadgen;
pub mod logging;
mod metrics;
mod notify;
mod paced_body;
mod payload;
mod peer_throttle;
mod process;
pub mod raw_body;
pub mod reconcile;
mod refusals;
mod repeat;
mod response;
mod rollup;
pub mod route_name;
pub mod server;
mod service;
pub mod signature;
pub mod sweeper;
mod throttle;
mod tls;
pub mod traces;
pub mod vacuum;
pub mod worker;

/// For `main`, before its first thread: handlers then hold none of the unit's capabilities.
pub use process::clear_ambient_capabilities;
pub use service::{run, run_on};
