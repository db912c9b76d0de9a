//! What a run is made of before it starts: the pipeline, the run's
//! identity, ctx fields, provider, event bus, settings, cap, limits,
//! interactors, hooks, and — for a resumed run — what it already has.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use troupe_actors::EventBus;

use super::cancel::CancelScope;
use super::events::Event;
use super::ids::RunId;
use super::interaction::InteractorSpec;
use super::scheduler::{ExecutorFactory, Restore};
use super::stage::RunSettings;
use super::stage::StageKit;
use crate::definition::Pipeline;
use crate::provider::Provider;

/// What the scheduler needs to run a pipeline.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub pipeline: Arc<Pipeline>,
    pub run_id: RunId,
    pub fields: Arc<Map<String, Value>>,
    pub provider: Arc<dyn Provider>,
    pub bus: EventBus<Event>,
    pub settings: Arc<RunSettings>,
    /// Effective fan-out cap (CLI > pipeline.yaml > 8).
    pub cap: usize,
    /// The run's scope in the cancellation tree.
    pub cancel: CancelScope,
    /// Past it the run is cancelled and fails with
    /// `Session/RunTimeExceeded` (`--max-run-time`).
    pub max_run_time: Option<Duration>,
    /// Who may approve out-of-envelope tool calls; empty is headless.
    pub interactors: Vec<InteractorSpec>,
    /// How long an approval may wait for an answer (`None`: forever).
    pub approval_timeout: Option<Duration>,
    /// Hooks at the message-loop slots (the pipeline's, plus any a library
    /// user adds).
    pub hooks: Arc<super::hooks::HookSet>,
    /// A resumed run's stored results and logged turns (empty for a new
    /// run).
    pub restore: Restore,
    /// Where fan-out siblings run when not here (`None`: the local pool).
    pub executor: Option<Arc<dyn ExecutorFactory>>,
}

impl RunSpec {
    /// What every execution of this run shares.
    pub fn kit(&self) -> StageKit {
        StageKit {
            pipeline: Arc::clone(&self.pipeline),
            provider: Arc::clone(&self.provider),
            bus: self.bus.clone(),
            settings: Arc::clone(&self.settings),
            hooks: Arc::clone(&self.hooks),
        }
    }
}
