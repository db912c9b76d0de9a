//! Running hooks: guard, transform and observer hooks at
//! `<TURN_STAGE>/pre|post` of the six message-loop stages (declared in
//! `definition::hooks`). A hook is Rust code (the [`Hook`] trait, for
//! library users) or a command declared in `pipeline.yaml` that reads the
//! payload as JSON on stdin and answers JSON on stdout.
//!
//! A guard that crashes, hangs or prints garbage denies (fail closed); a
//! transform that does so is an error of the thing it was transforming;
//! neither ever hangs a run.

mod command;
mod hook;
mod set;

pub use command::CommandHook;
pub use hook::{Hook, HookError, HookReply};
pub use set::{HookRun, HookSet, SlotOutcome};
