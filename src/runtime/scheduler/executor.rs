//! Where executions run: the seam between the scheduler's decisions and
//! the machinery that carries them out. The scheduler hands each
//! execution it decides to start to an [`Executor`]; the local pool runs
//! it as a stage actor on one of the run's arbiters, and an executor for
//! remote workers can take its place without the scheduler changing.
//!
//! Every execution an executor starts reports exactly once
//! ([`ToScheduler::Report`]) and stops when its cancellation scope fires.
//! A sibling does not ask to start: the scheduler spawns one only into a
//! free slot of a live group, so it records the sibling's start request
//! itself as it starts it, and the sibling checks only its scope (which
//! the scheduler stops if it refuses after all: a budget tripped
//! meanwhile). Asking, and waiting for the grant, were two of the four
//! hops between threads a local sibling made, each a wake of a parked
//! thread, and three on a remote sibling's way.

use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;

use super::planner::Spawn;
use super::protocol::ToScheduler;
use crate::definition::Stage;
use crate::definition::StageKind;
use crate::definition::tool_manifest::stage_manifest_with;
use crate::runtime::cancel::CancelScope;
use crate::runtime::interaction::InteractionHub;
use crate::runtime::stage::{EventIds, StageCommon, StageKit, StageRun};
use crate::runtime::stage_actor::{self, StageActor};

/// Makes a run's executor once the scheduler can be addressed: the run's
/// way to put its executions somewhere else than the local pool (workers
/// over NATS). `local` runs what stays here.
pub trait ExecutorFactory: Send + Sync + std::fmt::Debug {
    fn make(&self, local: LocalExecutor, scheduler: Recipient<ToScheduler>) -> Box<dyn Executor>;
}

/// Runs the executions the scheduler starts.
pub trait Executor: std::fmt::Debug {
    /// Starts one execution in a scope of its own under `parent`, and
    /// returns that scope (which the scheduler cancels to stop it alone);
    /// `group` is its parallel group's scope (siblings only), which a
    /// failing sibling cancels on its way out. The execution reports to
    /// the scheduler.
    fn start(
        &mut self,
        spawn: Spawn,
        parent: &CancelScope,
        group: Option<CancelScope>,
    ) -> CancelScope;

    /// From now until [`Executor::flush`], executions started may be held
    /// and handed to their threads together. An executor that does not
    /// hold starts each at once.
    fn hold(&mut self) {}

    /// Starts every execution held since [`Executor::hold`].
    fn flush(&mut self) {}

    /// Whether every execution this executor starts holds its own scope
    /// for as long as it can still run (so the scheduler need only keep a
    /// [`ScopeKey`](crate::runtime::cancel::ScopeKey) to stop it). An
    /// executor that does not say so has the scheduler keep the scope.
    fn executions_hold_their_scopes(&self) -> bool {
        false
    }
}

/// The local pool: each execution is a [`StageActor`], started on one of
/// the run's arbiters in turn (on the caller's when there are none).
pub struct LocalExecutor {
    kit: Arc<StageKit>,
    /// Shared by every execution: cloning an `Addr` allocates (actix gives
    /// each sender its own parking slot), an `Arc` clone does not.
    hub: Option<Arc<Addr<InteractionHub>>>,
    scheduler: Arc<Recipient<ToScheduler>>,
    /// Each stage's common part (its manifest among it), with the MCP
    /// listings' generation it was built on.
    commons: super::FastMap<String, (u64, Arc<StageCommon>)>,
    /// The arbiters executions run on; empty runs them on the current one.
    arbiters: Vec<ArbiterHandle>,
    next: usize,
    /// Per arbiter, the relay its siblings are started under, with the
    /// group scope it stands for (`cancel.rs`): a group cancel then wakes
    /// one task per arbiter, and siblings link to a scope of their
    /// arbiter's, not all to the group's.
    relays: Vec<Option<(CancelScope, CancelScope)>>,
    relaying: bool,
    /// Siblings hand their results over packed (`Kept`).
    packing: bool,
    /// Between [`Executor::hold`] and [`Executor::flush`]: executions
    /// are kept in `held`, per arbiter, and handed over together.
    holding: bool,
    /// Per arbiter, the executions held. Handed over one by one, each
    /// start was a push onto the arbiter's queue and, as often as not, a
    /// wake-up of its thread: on 16 cores the scheduler's thread spent
    /// more time in the kernel waking arbiters than in any function of
    /// its own.
    held: Vec<Vec<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for LocalExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalExecutor")
            .field("arbiters", &self.arbiters.len())
            .finish()
    }
}

impl LocalExecutor {
    pub fn new(
        kit: StageKit,
        hub: Option<Addr<InteractionHub>>,
        scheduler: Recipient<ToScheduler>,
        arbiters: Vec<ArbiterHandle>,
    ) -> LocalExecutor {
        LocalExecutor {
            kit: Arc::new(kit),
            hub: hub.map(Arc::new),
            scheduler: Arc::new(scheduler),
            commons: super::FastMap::default(),
            relays: vec![None; arbiters.len()],
            relaying: true,
            packing: true,
            holding: false,
            held: arbiters.iter().map(|_| Vec::new()).collect(),
            arbiters,
            next: 0,
        }
    }

    /// Starts siblings directly under the scope they are given: for a
    /// caller that gives each its own parent (a worker, which cancels its
    /// tasks one by one), where a relay per execution would only add a task.
    pub fn without_relays(mut self) -> LocalExecutor {
        self.relaying = false;
        self
    }

    /// Siblings hand their results over whole: for a worker, which sends
    /// each on at once rather than keeping it.
    pub fn keeping_results_whole(mut self) -> LocalExecutor {
        self.packing = false;
        self
    }

    /// One of the run's arbiters, for work the run does off the thread
    /// that built it (`None` with one thread: there is only that one).
    pub fn arbiter(&self) -> Option<ArbiterHandle> {
        self.arbiters.first().cloned()
    }

    /// The run's arbiters but the one [`LocalExecutor::arbiter`] gives,
    /// for work spread off it.
    pub fn other_arbiters(&self) -> Vec<ArbiterHandle> {
        self.arbiters.iter().skip(1).cloned().collect()
    }

    /// The relay of `group` on arbiter `at`, made (and its task sent
    /// there, ahead of the executions under it) when the arbiter's last
    /// one stood for another scope. Once the task has forwarded a cancel
    /// it records the cancellation of the executions enrolled under the
    /// relay (see `stage_actor`'s roll).
    fn relayed(&mut self, at: usize, group: &CancelScope) -> &CancelScope {
        let slot = &mut self.relays[at];
        if !slot.as_ref().is_some_and(|(of, _)| of.same(group)) {
            let (relay, forward) = group.relay();
            let key = relay.key();
            self.arbiters[at].spawn(async move {
                if forward.await {
                    stage_actor::record_under(&key);
                } else {
                    stage_actor::forget(&key);
                }
            });
            *slot = Some((group.clone(), relay));
        }
        &slot.as_ref().expect("set above").1
    }

    /// The common part of `stage`'s executions: made once per stage (and
    /// again when an MCP server's tool list changed), then shared.
    fn common(&mut self, stage: &Arc<Stage>) -> Arc<StageCommon> {
        // A server that announced a changed tool list makes every manifest
        // built before stale: executions that start later see the new one.
        let generation = self.kit.settings.mcp.as_ref().map_or(0, |p| p.generation());
        if let Some((built, common)) = self.commons.get(&stage.id)
            && *built == generation
        {
            return Arc::clone(common);
        }
        let tools = match &stage.kind {
            StageKind::Llm(def) => {
                // A chat's mode shows every offered tool and decides each
                // call itself.
                let shown;
                let def = match &self.kit.settings.tool_mode {
                    Some(mode) => {
                        let mut offered = (**def).clone();
                        offered.allowed_tools.clone_from(&mode.offered);
                        shown = offered;
                        &shown
                    }
                    None => def,
                };
                let mcp = self
                    .kit
                    .settings
                    .mcp
                    .as_ref()
                    .map(|p| p.specs(&def.allowed_tools))
                    .unwrap_or_default();
                Arc::new(stage_manifest_with(def, mcp))
            }
            _ => Arc::default(),
        };
        let common = Arc::new(StageCommon {
            kit: Arc::clone(&self.kit),
            stage: Arc::clone(stage),
            hub: self.hub.clone(),
            tools,
        });
        self.commons
            .insert(stage.id.clone(), (generation, Arc::clone(&common)));
        common
    }
}

impl Executor for LocalExecutor {
    fn start(
        &mut self,
        spawn: Spawn,
        parent: &CancelScope,
        group: Option<CancelScope>,
    ) -> CancelScope {
        let common = self.common(&spawn.stage);
        // A sibling under a relay or straight under its group enrols in
        // its thread's roll: a relay's task records under the relay when
        // it forwards a cancel, a failed sibling under its own parent. (A
        // cancel from the scheduler with one thread has no relay: each
        // actor records its own, as before.)
        let enrolling = spawn.is_sibling() && self.relaying;
        let arbiter = (!self.arbiters.is_empty()).then(|| {
            let at = self.next % self.arbiters.len();
            self.next = self.next.wrapping_add(1);
            at
        });
        // Every sibling goes under its arbiter's relay, asked or granted
        // at spawn.
        let scope = match arbiter {
            Some(at) if spawn.is_sibling() && self.relaying => self.relayed(at, parent).child(),
            _ => parent.child(),
        };
        // The spawn's own handle on the stage goes here, on this thread:
        // the execution reads it through its common part.
        let Spawn {
            exec,
            stage: _,
            ctx,
            index,
            visit,
        } = spawn;
        let cancel = scope.clone();
        let scheduler = Arc::clone(&self.scheduler);
        let own = scope.clone();
        let packing = self.packing;
        // Made where it runs: its event ids are allocated on its arbiter.
        let make = move || {
            let run = StageRun {
                common,
                ids: EventIds::own(&ctx),
                ctx,
                index,
                visit,
                cancel,
                deferred: Rc::default(),
            };
            let mut actor = StageActor::new(run, exec, scheduler, own, group);
            if enrolling {
                actor = actor.enrolling();
            }
            if packing {
                actor
            } else {
                actor.keeping_results_whole()
            }
        };
        match arbiter {
            None => {
                make().start();
            }
            // The actor and its mailbox are made on the arbiter that runs
            // them, so they are freed where they were allocated: a block
            // freed on another thread is collected later by the allocating
            // one, which on 16 cores cost the scheduler's thread a good
            // part of its time.
            Some(at) if self.holding => self.held[at].push(Box::new(move || {
                make().start();
            })),
            Some(at) => {
                self.arbiters[at].spawn_fn(move || {
                    make().start();
                });
            }
        }
        scope
    }

    fn hold(&mut self) {
        self.holding = !self.arbiters.is_empty();
    }

    /// The start (held, or on its way to its arbiter) and then the stage
    /// actor hold each execution's scope until it ends.
    fn executions_hold_their_scopes(&self) -> bool {
        true
    }

    fn flush(&mut self) {
        self.holding = false;
        for (arbiter, held) in self.arbiters.iter().zip(&mut self.held) {
            if held.is_empty() {
                continue;
            }
            let starts = std::mem::take(held);
            arbiter.spawn_fn(move || {
                for start in starts {
                    // Each start on its own, as when each was handed over
                    // alone: one that panics does not keep the rest from
                    // starting.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start));
                }
            });
        }
    }
}
