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
//!
//! **Relays.** A token tree is cancelled by one thread: whoever cancels a
//! group wakes every execution under it, and each wake-up of an execution
//! on another thread crosses to that thread's queue. Linking and
//! unlinking a child token also takes its parent's lock, so siblings
//! started and ended on many threads all meet at the group's lock. A
//! [relay](CancelScope::relay) is a stand-in for a scope on one thread:
//! its token is a tree of its own, and a task on that thread cancels it
//! when the scope it stands for is cancelled. Executions under a relay
//! link to it, not to the group; a group cancel wakes one task per
//! thread, and each wakes its own executions locally. Until that task has
//! run, [`CancelScope::is_cancelled`] already answers from the ancestors'
//! marks, so nothing under a relay starts, or is polled again by the
//! stage actor, once the group's cancel is visible.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio_util::sync::{CancellationToken, DropGuard};

/// Why an execution or the run was cancelled by the user (Ctrl-C), and the
/// reason recorded when no scope says otherwise.
pub const TURN_CANCELLED: &str = "Cancellation/TurnCancelled";

/// A scope's identity, for tables kept beside the tree (the stage actors'
/// rolls): it keeps no scope alive, and while it exists no other scope can
/// have the same [`id`](ScopeKey::id).
#[derive(Debug, Clone)]
pub struct ScopeKey(std::sync::Weak<Node>);

impl ScopeKey {
    /// The scope's [`CancelScope::id`].
    pub fn id(&self) -> usize {
        self.0.as_ptr() as usize
    }

    /// Whether the scope still exists.
    pub fn is_live(&self) -> bool {
        self.0.strong_count() > 0
    }

    /// Stops the scope ([`CancelScope::stop`]) if it still exists: a
    /// scope nobody holds any more has nothing left to stop.
    pub fn stop(&self) {
        if let Some(node) = self.0.upgrade() {
            CancelScope(node).stop();
        }
    }

    /// Whether the scope exists and is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0
            .upgrade()
            .is_some_and(|node| CancelScope(node).is_cancelled())
    }
}

/// One node of the cancellation tree. Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct CancelScope(Arc<Node>);

#[derive(Debug)]
struct Node {
    token: CancellationToken,
    /// Set when this scope itself is cancelled (through [`CancelScope::cancel`]
    /// or [`CancelScope::stop`]): read along the parents, the marks tell
    /// whether a scope is cancelled without any token's lock.
    marked: AtomicBool,
    reason: OnceLock<Arc<str>>,
    parent: Option<CancelScope>,
    /// A relay's: ends its forwarding task when the relay is dropped.
    _retire: Option<DropGuard>,
}

impl Default for CancelScope {
    fn default() -> Self {
        CancelScope::root()
    }
}

impl CancelScope {
    fn with(
        token: CancellationToken,
        parent: Option<CancelScope>,
        retire: Option<DropGuard>,
    ) -> Self {
        CancelScope(Arc::new(Node {
            token,
            marked: AtomicBool::new(false),
            reason: OnceLock::new(),
            parent,
            _retire: retire,
        }))
    }

    /// A scope with no parent (a run's).
    pub fn root() -> CancelScope {
        CancelScope::with(CancellationToken::new(), None, None)
    }

    /// A scope cancelled with this one (and on its own).
    pub fn child(&self) -> CancelScope {
        CancelScope::with(self.0.token.child_token(), Some(self.clone()), None)
    }

    /// A stand-in for this scope on another thread, and the task that
    /// forwards this scope's cancel to it, to be spawned on that thread
    /// (see the module's doc). The relay's children are cancelled with
    /// this scope, a moment later, and report its reason; the task ends
    /// when the relay and its children are gone (with `false`), or once
    /// it has forwarded (with `true`).
    pub fn relay(&self) -> (CancelScope, impl Future<Output = bool> + Send + 'static) {
        let token = CancellationToken::new();
        let retire = CancellationToken::new();
        let relay = CancelScope::with(
            token.clone(),
            Some(self.clone()),
            Some(retire.clone().drop_guard()),
        );
        let watched = self.0.token.clone();
        let forward = async move {
            tokio::select! {
                biased;
                () = watched.cancelled() => {
                    token.cancel();
                    true
                }
                () = retire.cancelled() => false,
            }
        };
        (relay, forward)
    }

    /// Cancels the scope and everything under it. The first reason given
    /// to a scope is the one it keeps.
    pub fn cancel(&self, reason: impl Into<Arc<str>>) {
        let _ = self.0.reason.set(reason.into());
        self.stop();
    }

    /// Cancels the scope and everything under it without a reason of its
    /// own: it reports its nearest ancestor's, if any.
    pub fn stop(&self) {
        self.0.marked.store(true, Ordering::Release);
        self.0.token.cancel();
    }

    /// The token that fires when this scope or an ancestor is cancelled
    /// (under a relay: once the relay's task has forwarded the cancel).
    pub fn token(&self) -> &CancellationToken {
        &self.0.token
    }

    /// Whether this scope or an ancestor was cancelled. Takes no lock
    /// unless no scope above is marked, then asks this scope's token,
    /// which may have been cancelled directly.
    pub fn is_cancelled(&self) -> bool {
        self.is_marked() || self.0.token.is_cancelled()
    }

    /// Whether this scope or an ancestor was cancelled through
    /// [`CancelScope::cancel`] or [`CancelScope::stop`]: a few atomic
    /// loads, for a check on every poll. Misses only a token cancelled
    /// directly, which its own `cancelled()` future reports.
    pub fn is_marked(&self) -> bool {
        let mut scope = Some(self);
        while let Some(s) = scope {
            if s.0.marked.load(Ordering::Acquire) {
                return true;
            }
            scope = s.0.parent.as_ref();
        }
        false
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

    /// The scope this one is cancelled with, if any.
    pub fn parent(&self) -> Option<&CancelScope> {
        self.0.parent.as_ref()
    }

    /// This scope's identity (see [`ScopeKey`]).
    pub fn key(&self) -> ScopeKey {
        ScopeKey(Arc::downgrade(&self.0))
    }

    /// A number no other living scope has, and no other scope has while a
    /// [`ScopeKey`] of this one exists. Reading it writes nothing (a key
    /// counts itself on the scope), so a table looks scopes up by it.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Whether both are the same scope.
    pub fn same(&self, other: &CancelScope) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
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

    #[tokio::test(flavor = "current_thread")]
    async fn a_relay_is_marked_at_once_and_its_children_woken_by_its_task() {
        let run = CancelScope::root();
        let group = run.child();
        let (relay, forward) = group.relay();
        let exec = relay.child();
        let forwarding = tokio::spawn(forward);
        tokio::task::yield_now().await;
        assert!(!exec.is_cancelled());
        group.cancel("sibling failed");
        assert!(
            exec.is_marked() && exec.is_cancelled(),
            "seen from the marks before the task has run"
        );
        assert!(!exec.token().is_cancelled(), "the task has not run yet");
        forwarding.await.unwrap();
        assert!(exec.token().is_cancelled(), "woken through the relay");
        assert_eq!(exec.reason().as_deref(), Some("sibling failed"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_relay_forwards_a_cancel_from_further_up_and_one_made_late() {
        let run = CancelScope::root();
        let group = run.child();
        let (relay, forward) = group.relay();
        let exec = relay.child();
        run.cancel("interrupted");
        assert!(exec.is_cancelled());
        assert!(forward.await, "forwarded");
        assert!(exec.token().is_cancelled());
        assert_eq!(exec.reason().as_deref(), Some("interrupted"));
        let (late, forward) = group.relay();
        assert!(
            late.is_cancelled(),
            "a relay of a cancelled scope starts cancelled"
        );
        assert!(forward.await);
        assert!(late.child().token().is_cancelled());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_relays_task_ends_when_the_relay_is_gone() {
        let group = CancelScope::root();
        let (relay, forward) = group.relay();
        let exec = relay.child();
        let forwarding = tokio::spawn(forward);
        drop(relay);
        tokio::task::yield_now().await;
        assert!(!forwarding.is_finished(), "a child still holds the relay");
        drop(exec);
        assert!(!forwarding.await.unwrap(), "retired, not forwarded");
        assert!(!group.is_cancelled());
    }

    #[test]
    fn a_token_cancelled_directly_is_seen_by_is_cancelled_not_by_the_marks() {
        let exec = CancelScope::root().child();
        exec.token().cancel();
        assert!(exec.is_cancelled() && !exec.is_marked());
        let other = CancelScope::root().child();
        other.stop();
        assert!(other.is_marked() && other.reason().is_none());
    }
}
