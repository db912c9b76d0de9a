//! What one stage execution needs (`StageRun`), and how it records
//! itself: the events it publishes and the phase markers around each
//! phase.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use crate::runtime::cancel::CancelScope;
use actix::Addr;

use super::whereabouts::Whereabouts;
use crate::definition::{Pipeline, Stage, ToolSpec};
use crate::provider::{Provider, ToolCall};
use crate::runtime::context::StageContext;
use crate::runtime::events::{Event, EventName};
use crate::runtime::hooks::HookSet;
use crate::runtime::interaction::InteractionHub;
use troupe_actors::EventBus;

use super::settings::RunSettings;

/// What every execution of a run shares, whichever executor starts it.
#[derive(Debug, Clone)]
pub struct StageKit {
    pub pipeline: Arc<Pipeline>,
    pub provider: Arc<dyn Provider>,
    pub bus: EventBus<Event>,
    pub settings: Arc<RunSettings>,
    pub hooks: Arc<HookSet>,
}

/// The run's and the stage's ids as one execution's events carry them:
/// copies of its own, not the `Arc`s every execution shares. Each event
/// clones them where it is made and drops them on an audit thread, and a
/// reference count is a cache line: shared, the run's id and the stage's
/// were written by every arbiter and every formatter, a dozen times per
/// sibling. Made on the execution's arbiter ([`EventIds::own`]).
#[derive(Debug, Clone)]
pub struct EventIds {
    pub run: Arc<str>,
    pub stage: Arc<str>,
}

impl EventIds {
    /// Fresh copies of the context's ids.
    pub fn own(ctx: &StageContext) -> EventIds {
        EventIds {
            run: Arc::from(&*ctx.workflow_run_id),
            stage: Arc::from(&*ctx.stage_id),
        }
    }
}

/// What every execution of one stage shares (read through a
/// [`StageRun`] by `Deref`), in one `Arc`: each clone of a shared `Arc` is
/// a write to a cache line every arbiter and the scheduler's thread
/// contend for, so an execution takes one, not four.
#[derive(Debug)]
pub struct StageCommon {
    /// What every execution of the run shares.
    pub kit: Arc<StageKit>,
    pub stage: Arc<Stage>,
    /// Where out-of-envelope calls are put to the interactors; `None`
    /// denies them (headless).
    pub hub: Option<Arc<Addr<InteractionHub>>>,
    /// The stage's tool manifest (`allowedTools` plus the completion
    /// channel); empty for deterministic steps.
    pub tools: Arc<Vec<ToolSpec>>,
}

/// Everything one execution needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct StageRun {
    /// What the executions of its stage share (see [`StageCommon`]).
    pub common: Arc<StageCommon>,
    pub ctx: Arc<StageContext>,
    /// The ids its events carry (see [`EventIds`]).
    pub ids: EventIds,
    pub index: Option<usize>,
    pub visit: u32,
    /// The execution's scope: cancelled when the execution is strictly
    /// cancelled; tool calls run in child scopes of it. A scope, not only
    /// its token: under a relay (`cancel.rs`) the token fires a moment
    /// after a group's cancel, the scope's marks at once.
    pub cancel: CancelScope,
    /// What it has emitted in the poll under way (see [`Deferred`]).
    pub deferred: Rc<Deferred>,
}

impl std::ops::Deref for StageRun {
    type Target = StageCommon;

    fn deref(&self) -> &StageCommon {
        &self.common
    }
}

/// The events an execution emits while its actor polls it, published
/// together when the poll ends ([`Deferred::polling`]): one draw of
/// numbers and one hold of the bus for the few events a poll makes (a
/// fan-out sibling's dozen came in four or five polls), where each
/// publish alone drew from the counter every thread writes.
///
/// Their place in the log does not change: nothing else on this thread
/// runs until the poll ends, and before the execution hands work to a
/// party that may publish from elsewhere (the interaction hub, a human
/// step's asker, a provider reporting tokens, a command hook) it
/// publishes what it holds ([`StageRun::flush`]), so that party's events
/// come after its own; so too before a provider's answer is counted
/// against the run's budget, whose meter wakes the scheduler. Its tool
/// calls' actors run on this thread, after the poll. Outside a poll (its
/// entry, its exit, its cancellation) an execution publishes at once.
#[derive(Debug)]
pub struct Deferred {
    polling: Cell<bool>,
    events: RefCell<Vec<Event>>,
}

impl Default for Deferred {
    fn default() -> Deferred {
        Deferred {
            polling: Cell::new(false),
            // A poll's events without growing: an unobserved fan-out
            // sibling's most in one poll is four (phase markers, made
            // only when someone observes, add to that).
            events: RefCell::new(Vec::with_capacity(8)),
        }
    }
}

impl Deferred {
    /// Runs `poll` (one poll of the execution) with its events held, then
    /// publishes them on `bus`. A panic in `poll` (the execution's own
    /// are caught inside it) still publishes what was held.
    pub fn polling<T>(&self, bus: &EventBus<Event>, poll: impl FnOnce() -> T) -> T {
        struct Ends<'a>(&'a Deferred, &'a EventBus<Event>);
        impl Drop for Ends<'_> {
            fn drop(&mut self) {
                self.0.polling.set(false);
                self.0.publish(self.1);
            }
        }
        self.polling.set(true);
        let _ends = Ends(self, bus);
        poll()
    }

    fn publish(&self, bus: &EventBus<Event>) {
        let mut events = self.events.borrow_mut();
        if !events.is_empty() {
            bus.publish_all(&mut events);
        }
    }
}

impl StageRun {
    pub(super) fn event(&self, name: EventName) -> Event {
        Event::new(name, Arc::clone(&self.ids.run)).stage(
            Arc::clone(&self.ids.stage),
            Arc::clone(&self.ctx.stage_execution_id),
        )
    }

    /// Publishes `event`: with the others of this poll when it ends, if
    /// the execution is being polled ([`Deferred`]), else now.
    pub(super) fn emit(&self, event: Event) {
        if self.deferred.polling.get() {
            self.deferred.events.borrow_mut().push(event);
        } else {
            self.kit.bus.publish(event);
        }
    }

    /// Publishes what this poll has emitted so far: before the execution
    /// hands work to a party that may publish from another thread.
    pub(super) fn flush(&self) {
        self.deferred.publish(&self.kit.bus);
    }

    /// Marks a phase boundary: the phase is remembered for `StageCancelled`,
    /// and a `StagePreFired`/`StagePostFired` observer event is published
    /// when anyone observes (they are not audit events; see `EventName::class`).
    pub(super) fn phase(
        &self,
        whereabouts: &Rc<RefCell<Whereabouts>>,
        phase: &'static str,
        pre: bool,
    ) {
        if pre {
            whereabouts.borrow_mut().phase = phase;
        }
        if !self.kit.bus.has_observers() {
            return;
        }
        let name = if pre {
            EventName::StagePreFired
        } else {
            EventName::StagePostFired
        };
        self.emit(self.event(name).with_static("phase", phase));
    }

    /// Whether this LLM stage's frontmatter says `network: deny`.
    pub(super) fn network_denied(&self) -> bool {
        matches!(&self.stage.kind, crate::definition::StageKind::Llm(def) if def.network_deny)
    }

    pub(super) fn tool_event(&self, name: EventName, call: &ToolCall) -> Event {
        tool_named(self.event(name), &call.name).with("callId", Arc::clone(&call.id))
    }
}

/// `event` about the tool `name`: an MCP tool's also names its server and
/// the server's own name for the tool, as every event of a call does.
pub(crate) fn tool_named(event: Event, name: &Arc<str>) -> Event {
    let event = event.tool(Arc::clone(name));
    match crate::definition::mcp::split_tool_name(name) {
        Some((server, tool)) => event.with("mcpServer", server).with("mcpTool", tool),
        None => event,
    }
}
