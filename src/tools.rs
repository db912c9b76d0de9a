//! Tools a stage may call: the catalog of built-in tool specs (names,
//! descriptions, argument schemas), tool manifests, and the built-in
//! implementations, confined to the project root (`Bash`'s writes by
//! its sandbox, when the run has one).

pub mod args;
pub mod bash;
pub mod catalog;
pub mod edit;
pub mod env;
pub mod exec;
pub mod lines;
pub mod manifest;
pub mod path;
pub mod process_group;
pub mod read;
pub mod sandbox;
pub mod search;

pub use catalog::{ToolSpec, builtin_tools, is_builtin};
pub use env::{ToolEnv, ToolLimits};
pub use manifest::stage_manifest;
