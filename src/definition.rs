//! Pipeline definitions: YAML and markdown on disk to a typed, validated,
//! immutable model.

pub mod duration;
pub mod expr;
pub mod fields;
pub mod loader;
pub mod model;
pub mod pipeline_file;
pub mod schema;
pub mod stage_file;
pub mod template;
pub mod yaml;

pub use loader::{load_pipeline, load_pipeline_text, load_pipeline_with};
pub use model::*;
