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

/// Who changed the ledger by hand, and why: an operator (`cli:<user>`, `console:<name>`,
/// `admin`) or the receiver itself. It goes with the change down to the SQL that records it,
/// in the change's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub by: String,
    pub reason: Option<String>,
}

impl Actor {
    /// `by`, with no reason given.
    pub fn new(by: &str) -> Actor {
        Actor {
            by: by.to_owned(),
            reason: None,
        }
    }

    /// `by`, for `reason` (if it says something).
    pub fn because(by: &str, reason: Option<&str>) -> Actor {
        Actor {
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
        }
    }

    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// A cancel's error, as the job keeps it: who cancelled it, and why (the dead letters
    /// group every cancel by its prefix).
    pub fn cancelled(&self) -> String {
        format!("cancelled by {}: {}", self.by, self.reason().unwrap_or(""))
    }
}

/// [`Backend::record_action`](super::Backend::record_action): an action on a job that changes
/// nothing else, and its actor.
#[derive(Debug, Clone, Copy)]
pub struct ActionTaken<'a> {
    pub action: &'a str,
    pub actor: &'a Actor,
}
