//! The actor runtime: sessions, the scheduler, stage executions, tool calls,
//! events and the audit log.

pub mod context;
pub mod events;
pub mod ids;
pub mod result;
pub mod transcript;
