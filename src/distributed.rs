//! Fan-out siblings spread over machines through NATS JetStream: the
//! coordinator's executor (`troupe run --nats`), the worker
//! (`troupe worker`) and its intake of delivered tasks, the results a
//! resumed coordinator finds waiting, the connection and topology, and
//! what travels between them. See ARCHITECTURE.md, "Across machines".

pub mod arrived;
mod collected;
pub mod coordinator;
mod groups;
pub mod intake;
pub mod lease;
pub mod nats;
pub mod outbox;
pub mod stored_context;
mod taker;
pub mod taking;
pub mod wire;
pub mod worker;

pub use coordinator::RemoteSiblings;
pub use nats::{Nats, NatsArgs, NatsError};
