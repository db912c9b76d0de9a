//! The actor runtime: sessions, the scheduler, stage executions, tool calls,
//! hooks, approvals, events and the audit log. It writes nothing to the
//! terminal: prompts and messages are the CLI's.

pub mod ask;
pub mod audit;
pub mod cancel;
pub mod context;
pub mod elicit;
pub mod events;
pub mod extract;
pub mod hooks;
pub mod ids;
pub mod interaction;
pub mod launch;
pub mod ledger;
pub mod limits;
pub mod observer;
pub mod result;
pub mod scheduler;
pub mod session;
pub mod spec;
pub mod stage;
pub mod stage_actor;
pub mod summary;
pub mod tool_call;
pub mod tool_mode;
pub mod transcript;
