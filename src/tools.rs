//! Tools a stage may call: the built-in implementations of the tools the
//! catalog (`definition::tool_catalog`) declares, confined to the project
//! root (`Bash`'s writes by its sandbox, when the run has one).

pub mod args;
pub mod bash;
pub mod blocking;
pub mod edit;
pub mod env;
pub mod error;
pub mod exec;
pub mod lines;
pub mod mcp;
pub mod path;
pub mod process_group;
pub mod read;
pub mod sandbox;
pub mod search;

// Declared with the definitions; the scheduler's executor names them here.
pub use crate::definition::{ToolSpec, stage_manifest};
pub use env::{ToolEnv, ToolLimits};
pub use error::{ModelError, ToolError};
