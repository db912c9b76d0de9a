//! What a provider's reply templates may read: the one operation a
//! `{{ctx.*}}`/`{{stage.*}}` placeholder needs from the execution's
//! context, so a provider never names the runtime's context type.

use serde_json::Value;

use crate::definition::template::Segment;

/// Resolves template placeholders for a request (the runtime's
/// `StageContext` is one).
pub trait TemplateScope: Send + Sync + std::fmt::Debug {
    /// The value at a placeholder path (`ctx.…` or `stage.…`), or why
    /// there is none.
    fn resolve(&self, path: &[Segment]) -> Result<Value, String>;
}
