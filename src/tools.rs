//! Tools a stage may call: the catalog of built-in tool specs (names,
//! descriptions, argument schemas) used for validation and tool manifests.

pub mod catalog;
pub mod exec;
pub mod manifest;

pub use catalog::{ToolSpec, builtin_tools, is_builtin};
pub use manifest::stage_manifest;
