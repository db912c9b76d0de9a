//! Where executions run: the seam between the scheduler's decisions and
//! the machinery that carries them out. The scheduler hands each
//! execution it decides to start to an [`Executor`]; the local pool runs
//! it as a stage actor on one of the run's arbiters, and an executor for
//! remote workers can take its place without the scheduler changing.
//!
//! Every execution an executor starts asks the scheduler before it begins
//! (siblings), reports exactly once ([`ToScheduler::Report`]) and stops
//! when its cancellation scope fires.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;

use super::planner::Spawn;
use super::protocol::ToScheduler;
use crate::definition::Pipeline;
use crate::definition::StageKind;
use crate::definition::tool_manifest::stage_manifest_with;
use crate::provider::Provider;
use crate::runtime::cancel::CancelScope;
use crate::runtime::events::Event;
use crate::runtime::hooks::HookSet;
use crate::runtime::interaction::InteractionHub;
use crate::runtime::stage::RunSettings;
use crate::runtime::stage::StageRun;
use crate::runtime::stage_actor::StageActor;
use crate::tools::ToolSpec;
use troupe_actors::EventBus;

/// Makes a run's executor once the scheduler can be addressed: the run's
/// way to put its executions somewhere else than the local pool (workers
/// over NATS). `local` runs what stays here.
pub trait ExecutorFactory: Send + Sync + std::fmt::Debug {
    fn make(&self, local: LocalExecutor, scheduler: Recipient<ToScheduler>) -> Box<dyn Executor>;
}

/// Runs the executions the scheduler starts.
pub trait Executor: std::fmt::Debug {
    /// Starts one execution under `scope`; `group` is its parallel
    /// group's scope (siblings only), which a failing sibling cancels on
    /// its way out. The execution reports to `scheduler`.
    fn start(&mut self, spawn: Spawn, scope: CancelScope, group: Option<CancelScope>);
}

/// What every execution of a run shares, whichever executor starts it.
#[derive(Debug, Clone)]
pub struct StageKit {
    pub pipeline: Arc<Pipeline>,
    pub provider: Arc<dyn Provider>,
    pub bus: EventBus<Event>,
    pub settings: Arc<RunSettings>,
    pub hooks: Arc<HookSet>,
}

/// The local pool: each execution is a [`StageActor`], started on one of
/// the run's arbiters in turn (on the caller's when there are none).
pub struct LocalExecutor {
    kit: StageKit,
    /// Shared by every execution: cloning an `Addr` allocates (actix gives
    /// each sender its own parking slot), an `Arc` clone does not.
    hub: Option<Arc<Addr<InteractionHub>>>,
    scheduler: Arc<Recipient<ToScheduler>>,
    /// Each LLM stage's manifest, with the MCP listings' generation it was built on.
    manifests: HashMap<String, (u64, Arc<Vec<ToolSpec>>)>,
    /// The arbiters executions run on; empty runs them on the current one.
    arbiters: Vec<ArbiterHandle>,
    next: usize,
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
            kit,
            hub: hub.map(Arc::new),
            scheduler: Arc::new(scheduler),
            manifests: HashMap::new(),
            arbiters,
            next: 0,
        }
    }

    /// One of the run's arbiters, for work the run does off the thread
    /// that built it (`None` with one thread: there is only that one).
    pub fn arbiter(&self) -> Option<ArbiterHandle> {
        self.arbiters.first().cloned()
    }

    fn tools(&mut self, spawn: &Spawn) -> Arc<Vec<ToolSpec>> {
        // A server that announced a changed tool list makes every manifest
        // built before stale: executions that start later see the new one.
        let generation = self.kit.settings.mcp.as_ref().map_or(0, |p| p.generation());
        match (&spawn.stage.kind, self.manifests.get(&spawn.stage.id)) {
            (StageKind::Llm(_), Some((built, tools))) if *built == generation => Arc::clone(tools),
            (StageKind::Llm(def), _) => {
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
                let tools = Arc::new(stage_manifest_with(def, mcp));
                self.manifests
                    .insert(spawn.stage.id.clone(), (generation, Arc::clone(&tools)));
                tools
            }
            _ => Arc::default(),
        }
    }
}

impl Executor for LocalExecutor {
    fn start(&mut self, spawn: Spawn, scope: CancelScope, group: Option<CancelScope>) {
        let tools = self.tools(&spawn);
        let gated = spawn.is_sibling();
        let Spawn {
            exec,
            stage,
            ctx,
            index,
            visit,
        } = spawn;
        let run = StageRun {
            pipeline: Arc::clone(&self.kit.pipeline),
            stage,
            ctx,
            provider: Arc::clone(&self.kit.provider),
            bus: self.kit.bus.clone(),
            settings: Arc::clone(&self.kit.settings),
            index,
            visit,
            cancel: scope.token().clone(),
            hub: self.hub.clone(),
            hooks: Arc::clone(&self.kit.hooks),
            tools,
        };
        let scheduler = Arc::clone(&self.scheduler);
        let make = move || StageActor::new(run, exec, gated, scheduler, scope, group);
        if self.arbiters.is_empty() {
            make().start();
        } else {
            let arbiter = &self.arbiters[self.next % self.arbiters.len()];
            self.next = self.next.wrapping_add(1);
            StageActor::start_in_arbiter(arbiter, move |_| make());
        }
    }
}
