//! What the coordinator knows of each fan-out group it sent to workers:
//! its siblings (units) and where each is, its shared context being put,
//! its cancellation.

use futures::future::{LocalBoxFuture, Shared};

use crate::runtime::cancel::CancelScope;
use crate::runtime::scheduler::{ExecKey, FastMap};

/// One sibling of a group, by its unit number.
#[derive(Debug, Default)]
pub struct Unit {
    pub exec: Option<ExecKey>,
    /// The worker's `Accepted` came in.
    pub accepted: bool,
    /// Its end is recorded (or it was settled without running).
    pub done: bool,
}

/// Resolves once the group's context is in the bucket (every task of the
/// group waits for it before it is queued).
pub type ContextReady = Shared<LocalBoxFuture<'static, Result<(), String>>>;

#[derive(Default)]
pub struct Group {
    pub units: FastMap<usize, Unit>,
    /// The group's [`GroupContext`](super::wire::GroupContext) being put, made with the group.
    pub context: Option<ContextReady>,
    /// The group's scope: cancelled by the scheduler the moment it
    /// decides, before this loop hears of it.
    pub scope: Option<CancelScope>,
    /// Cancelled as this loop saw it (the mark and purge are done).
    pub cancelled: bool,
    /// Its barrier report was published.
    pub barrier: bool,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("units", &self.units.len())
            .field("cancelled", &self.is_cancelled())
            .field("barrier", &self.barrier)
            .finish_non_exhaustive()
    }
}

impl Group {
    /// Its siblings not yet settled, each marked settled now: for the
    /// coordinator to report them lost (a worker that died holding them,
    /// or NATS gone under the run).
    pub fn take_unsettled(&mut self) -> Vec<ExecKey> {
        self.settle_where(|_| true)
    }

    /// Its siblings not yet settled that no worker accepted, each marked
    /// settled now: past a cancelled group's barrier, those never started.
    pub fn take_unaccepted(&mut self) -> Vec<ExecKey> {
        self.settle_where(|u| !u.accepted)
    }

    fn settle_where(&mut self, which: impl Fn(&Unit) -> bool) -> Vec<ExecKey> {
        self.units
            .values_mut()
            .filter(|u| !u.done && which(u))
            .filter_map(|u| {
                u.done = true;
                u.exec.clone()
            })
            .collect()
    }

    /// Cancelled by this loop or, already, by the scheduler.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled || self.scope.as_ref().is_some_and(CancelScope::is_cancelled)
    }
}
