//! Forwards a provider's observer signals of one request (streamed tokens,
//! waits for a provider slot) to the event bus as observer-class events,
//! which a lagging subscriber may drop.

use std::sync::Arc;

use troupe_actors::EventBus;

use super::events::{Event, EventName};
use crate::provider::RequestObserver;

/// Publishes `Token` and `Progress` events for one stage execution's turn.
#[derive(Debug)]
pub struct BusObserver {
    pub bus: EventBus<Event>,
    pub workflow_run_id: Arc<str>,
    pub stage_id: Arc<str>,
    pub stage_execution_id: Arc<str>,
    pub turn: u32,
}

impl BusObserver {
    fn event(&self, name: EventName) -> Event {
        Event::new(name, Arc::clone(&self.workflow_run_id))
            .stage(
                Arc::clone(&self.stage_id),
                Arc::clone(&self.stage_execution_id),
            )
            .with("turn", self.turn)
    }
}

impl RequestObserver for BusObserver {
    fn token(&self, text: &str) {
        self.bus
            .publish(self.event(EventName::Token).with("text", text));
    }

    fn waiting_for_slot(&self, waiting: bool) {
        let state = if waiting { "waiting" } else { "acquired" };
        self.bus
            .publish(self.event(EventName::Progress).with("providerSlot", state));
    }
}
