//! JSON Schemas compiled once at load and shared (the validator is Send + Sync).

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// A compiled JSON Schema with its source document.
#[derive(Clone)]
pub struct Schema {
    document: Arc<serde_json::Value>,
    validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schema").field(&self.document).finish()
    }
}

impl serde::Serialize for Schema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.document.serialize(s)
    }
}

impl Schema {
    /// Compiles a schema (draft 2020-12 unless `$schema` says otherwise).
    pub fn compile(document: serde_json::Value) -> Result<Schema, String> {
        let compiled = catch_unwind(AssertUnwindSafe(|| jsonschema::validator_for(&document)));
        match compiled {
            Ok(Ok(validator)) => Ok(Schema {
                document: Arc::new(document),
                validator: Arc::new(validator),
            }),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err("the schema compiler failed on this schema".to_owned()),
        }
    }

    pub fn document(&self) -> &serde_json::Value {
        &self.document
    }

    /// The document, shared (no copy): for requests sent every turn.
    pub fn shared_document(&self) -> Arc<serde_json::Value> {
        Arc::clone(&self.document)
    }

    /// Validates an instance; on failure returns every error as
    /// `<instance path>: <message>`, one per line, values masked.
    pub fn check(&self, instance: &serde_json::Value) -> Result<(), Vec<String>> {
        if self.validator.is_valid(instance) {
            return Ok(());
        }
        let errors: Vec<String> = self
            .validator
            .iter_errors(instance)
            .take(20)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                format!("{path}: {}", e.masked())
            })
            .collect();
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_instances() {
        let s = Schema::compile(json!({
            "type": "object", "required": ["item"],
            "properties": {"item": {"type": "integer"}}
        }))
        .unwrap();
        assert!(s.check(&json!({"item": 1})).is_ok());
        let errs = s.check(&json!({"item": "x"})).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("/item"), "{errs:?}");
    }

    #[test]
    fn invalid_schema_is_an_error() {
        assert!(Schema::compile(json!({"type": "objekt"})).is_err());
        assert!(Schema::compile(json!({"required": "x"})).is_err());
    }
}
