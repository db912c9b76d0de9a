//! One stage execution: Setup → Init → CheckGate → Act → Assert → Exit,
//! with pre/post markers around every phase; Exit's record and the Next
//! walk belong to the execution's owner (`stage_actor`, the scheduler).
//! Plain async code driven by the stage-execution actor, which owns it
//! and drops it on strict cancellation. See ARCHITECTURE.md, Actors and
//! ownership.
//!
//! One file per role: the run's `settings`; what an execution needs
//! (`run`), where it is (`whereabouts`) and how it concluded
//! (`conclusion`); the phases (`lifecycle`), the gate (`gate`) and the
//! asserts (`asserts`); the message loop (`model_loop`), its provider
//! requests (`request`) and hook slots (`slots`); tool calls
//! (`dispatch`) and their approval (`approval`); deterministic `steps`.

mod approval;
mod asserts;
mod conclusion;
mod dispatch;
mod gate;
mod lifecycle;
mod model_loop;
mod request;
mod run;
mod settings;
mod slots;
mod steps;
mod tool_step;
mod whereabouts;

pub use model_loop::COMPLETION_ACCEPTED;
pub(crate) use run::tool_named;
pub use run::{EventIds, StageCommon, StageKit, StageRun};
pub use settings::RunSettings;
pub use whereabouts::Whereabouts;
