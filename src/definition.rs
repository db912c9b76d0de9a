//! Pipeline definitions: YAML and markdown on disk to a typed, validated,
//! immutable model, with the built-in tool catalog and each stage's tool
//! manifest (its contract with the model).

pub mod duration;
pub mod expr;
pub mod fields;
pub mod graph;
pub mod hooks;
pub mod loader;
pub mod mcp;
pub mod model;
pub mod pipeline_file;
pub mod schema;
pub mod stage_file;
pub mod template;
pub mod tool_catalog;
pub mod tool_manifest;
pub mod yaml;

pub use loader::{load_pipeline, load_pipeline_text, load_pipeline_with};
pub use model::*;
pub use tool_catalog::{ToolSpec, builtin_tools, is_builtin};
pub use tool_manifest::stage_manifest;
