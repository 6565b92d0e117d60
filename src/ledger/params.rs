//! The arguments of contract operations that would otherwise be a row of one type.
//!
//! Named fields where positions could be swapped unseen (River's `JobSetStateParams` and the
//! like in `riverdriver`).

/// [`Backend::move_probe`](super::Backend::move_probe): moves the next probe of the hold open
/// since `since` from `from` to `to`, with `interval_ms` as its new wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeMove {
    pub route: String,
    pub since: i64,
    pub from: i64,
    pub to: i64,
    pub interval_ms: i64,
}

/// [`Backend::record_action`](super::Backend::record_action): an action on a job that changes
/// nothing else, who took it and why.
#[derive(Debug, Clone, Copy)]
pub struct ActionTaken<'a> {
    pub action: &'a str,
    pub by: &'a str,
    pub reason: &'a str,
}
