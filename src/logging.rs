//! Where log lines go: journald (with priorities and fields) under systemd, JSON for log
//! shippers, plain text on a terminal. `RUST_LOG` overrides the level.

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the process's log subscriber; `default_level` applies unless `RUST_LOG` is set.
pub fn init(default_level: &str, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let registry = tracing_subscriber::registry().with(filter);
    match resolve(format) {
        LogFormat::Journald => match tracing_journald::layer() {
            // Fields become journal fields of our own prefix (SUME_JOB_ID=...: bare JOB_ID is
            // systemd's own field), levels become priorities (INFO is 6, "info").
            Ok(journald) => {
                let journald = journald
                    .with_field_prefix(Some("SUME".to_owned()))
                    .with_priority_mappings(tracing_journald::PriorityMappings {
                        info: tracing_journald::Priority::Informational,
                        ..tracing_journald::PriorityMappings::new()
                    });
                return registry.with(journald).init();
            }
            Err(error) => {
                eprintln!("cannot write to journald ({error}); logging to stderr instead")
            }
        },
        LogFormat::Json => {
            return registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .json()
                        .flatten_event(true)
                        .with_writer(std::io::stderr),
                )
                .init()
        }
        LogFormat::Auto | LogFormat::Text => {}
    }
    registry
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr),
        )
        .init();
}

/// `auto`: journald when systemd connected stderr to the journal (it sets `JOURNAL_STREAM`),
/// text otherwise.
fn resolve(format: LogFormat) -> LogFormat {
    match format {
        LogFormat::Auto if std::env::var_os("JOURNAL_STREAM").is_some() => LogFormat::Journald,
        LogFormat::Auto => LogFormat::Text,
        other => other,
    }
}
