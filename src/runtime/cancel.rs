//! Cancellation scopes: the token tree (run → parallel group → stage
//! execution) together with the reason each scope was cancelled for.
//!
//! A scope's token is a child of its parent's, so cancelling the run stops
//! every group and execution under it at once. The reason travels with the
//! scope so that a cancelled execution records *why* (`StageCancelled`'s
//! `reason`): the first reason given to a scope is kept, and a scope
//! cancelled only through its parent reports the nearest ancestor's reason.
//! The reason is a record, never a decision: who failed and how the run ends
//! are decided by the scheduler.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

/// Why an execution or the run was cancelled by the user (Ctrl-C), and the
/// reason recorded when no scope says otherwise.
pub const TURN_CANCELLED: &str = "Cancellation/TurnCancelled";

/// One node of the cancellation tree. Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct CancelScope(Arc<Node>);

#[derive(Debug)]
struct Node {
    token: CancellationToken,
    reason: OnceLock<Arc<str>>,
    parent: Option<CancelScope>,
}

impl Default for CancelScope {
    fn default() -> Self {
        CancelScope::root()
    }
}

impl CancelScope {
    /// A scope with no parent (a run's).
    pub fn root() -> CancelScope {
        CancelScope(Arc::new(Node {
            token: CancellationToken::new(),
            reason: OnceLock::new(),
            parent: None,
        }))
    }

    /// A scope cancelled with this one (and on its own).
    pub fn child(&self) -> CancelScope {
        CancelScope(Arc::new(Node {
            token: self.0.token.child_token(),
            reason: OnceLock::new(),
            parent: Some(self.clone()),
        }))
    }

    /// Cancels the scope and everything under it. The first reason given
    /// to a scope is the one it keeps.
    pub fn cancel(&self, reason: impl Into<Arc<str>>) {
        let _ = self.0.reason.set(reason.into());
        self.0.token.cancel();
    }

    /// The token that fires when this scope or an ancestor is cancelled.
    pub fn token(&self) -> &CancellationToken {
        &self.0.token
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.token.is_cancelled()
    }

    /// Why the scope was cancelled: its own reason, else the nearest
    /// ancestor's; `None` while it is not cancelled or no one said why.
    pub fn reason(&self) -> Option<Arc<str>> {
        let mut scope = Some(self);
        while let Some(s) = scope {
            if let Some(r) = s.0.reason.get() {
                return Some(Arc::clone(r));
            }
            scope = s.0.parent.as_ref();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_reports_its_own_reason_else_its_nearest_ancestors() {
        let run = CancelScope::root();
        let group = run.child();
        let exec = group.child();
        assert!(!exec.is_cancelled());
        assert_eq!(exec.reason(), None);
        group.cancel("sibling failed");
        assert!(exec.is_cancelled() && !run.is_cancelled());
        assert_eq!(exec.reason().as_deref(), Some("sibling failed"));
        run.cancel("interrupted");
        assert_eq!(
            exec.reason().as_deref(),
            Some("sibling failed"),
            "the nearest reason wins"
        );
        group.cancel("later");
        assert_eq!(group.reason().as_deref(), Some("sibling failed"));
        let other = run.child().child();
        assert!(
            other.is_cancelled(),
            "a child of a cancelled scope starts cancelled"
        );
        assert_eq!(other.reason().as_deref(), Some("interrupted"));
    }
}
