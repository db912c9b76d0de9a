//! The scheduler: one actor owns every decision of a run. Its pure core
//! (`planner`, with the fan-out core of `troupe-actors`) walks the Next
//! table and decides the cap, fail-fast, the join and how the run ends;
//! the actor shell (`actor`) carries the decisions out through an
//! executor (`executor`); executions and the session talk to it in the
//! messages of `protocol`. See ARCHITECTURE.md.

pub mod actor;
pub mod executor;
pub mod next;
pub mod planner;
pub mod post;
pub mod protocol;

pub use actor::Scheduler;
pub use executor::{Executor, ExecutorFactory, LocalExecutor};
pub use next::{NextDecision, next_of};
pub use planner::{PlanCommand, PlanEvent, Planner, Restore, Spawn};
pub use protocol::{
    ExecKey, RunFinished, Slot, StageOutcome, ToScheduler, sibling_failed_reason, sibling_label,
};

/// A map the scheduler's thread looks up once or more per execution:
/// foldhash, not SipHash (its keys are the run's own stage ids and slots).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The set of [`FastMap`].
pub(crate) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
