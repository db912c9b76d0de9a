//! troupe-actors: reusable, LLM-free actor machinery for the troupe runtime.
//!
//! It knows nothing about LLMs, stages or workflow files. It provides the
//! deterministic cores that the runtime's actors drive: [`FanOut`] schedules a
//! group of units under a concurrency cap (lazy feed, start handshake,
//! fail-fast, escalating cancellation, join barrier) as a synchronous state
//! machine, [`Arbiter`] puts one question to several responders (first
//! answer wins, the rest withdraw), and [`EventBus`] projects events to
//! bounded subscriber queues.

pub mod arbiter;
pub mod bus;
pub mod fanout;

pub use arbiter::{Arbiter, ArbiterCommand, InteractionId, ResponderId, Unanswered};
pub use bus::{BusEvent, Delivery, Envelope, EventBus, EventClass, Published, Subscription};
pub use fanout::{
    CancelReason, Escalation, FanOut, FanOutCommand, FanOutError, FanOutEvent, GroupState,
    UnitOutcome,
};
