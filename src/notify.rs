//! systemd notifications (`Type=notify`): READY, STOPPING, a STATUS line, and watchdog pings
//! that stop when the ledger writer or the runtime is wedged. No-ops outside systemd.

use std::sync::Arc;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::ledger::Ledger;
use crate::metrics::METRICS;

fn send(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(%error, "cannot notify systemd");
    }
}

/// The service is up: ledger checked and migrated, unfinished work recovered, port bound.
pub fn ready() {
    send(&[NotifyState::Ready, NotifyState::Status("serving")]);
}

pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: finishing in-flight work"),
    ]);
}

/// Pings systemd's watchdog (when `WatchdogSec=` asks for it) at a third of its timeout, but only
/// after the ledger writer has taken and committed an empty change within that third: a wedged
/// writer, or a runtime too busy to run this task, misses pings and systemd restarts the service.
/// Each ping also updates the status line with live counts.
pub async fn watchdog(ledger: Arc<Ledger>, stop: CancellationToken) {
    let Some(timeout) = sd_notify::watchdog_enabled() else {
        return;
    };
    let period = timeout / 3;
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = stop.cancelled() => break,
        }
        let probe = tokio::time::timeout(period, ledger.probe()).await;
        match probe {
            Ok(Ok(())) => {
                let status = status_line(&ledger);
                send(&[NotifyState::Watchdog, NotifyState::Status(&status)]);
            }
            Ok(Err(error)) => {
                tracing::error!(%error, "watchdog: the ledger writer failed; not pinging")
            }
            Err(_) => tracing::error!(
                waited = ?period,
                "watchdog: the ledger writer did not answer; not pinging"
            ),
        }
    }
}

fn status_line(ledger: &Ledger) -> String {
    let (claimed, duplicates, refused) = METRICS.delivery_totals();
    format!(
        "serving: {claimed} claimed, {duplicates} duplicates, {refused} refused since start; \
         writer queue {}",
        ledger.claim_queue_depth()
    )
}
