//! The loop of every periodic background task: a step each interval, until shutdown.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::ledger::StorageError;

/// Runs `step` every `interval` (the first time at once) until `shutdown`; a failed step is
/// logged and tried again at the next interval. The loop of every periodic background task.
pub(crate) async fn repeat_every<F, Fut, T>(
    task: &'static str,
    interval: std::time::Duration,
    shutdown: &CancellationToken,
    mut step: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StorageError>>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if let Err(error) = step().await {
                    tracing::warn!(task, %error, "background step failed; trying again next interval");
                }
            }
            () = shutdown.cancelled() => break,
        }
    }
}
