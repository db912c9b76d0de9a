//! A minimal value that satisfies a JSON Schema: what the scripted provider
//! answers for a stage with no script (required properties, the first enum
//! value, arrays of `minItems` or one element, numbers at their minimum).

use serde_json::{Map, Value, json};

/// Synthesizes a small instance of `schema`. Depth-limited so recursive
/// schemas terminate.
pub fn synthesize(schema: &Value) -> Value {
    synth(schema, 0)
}

fn synth(schema: &Value, depth: usize) -> Value {
    if depth > 16 {
        return Value::Null;
    }
    let Some(obj) = schema.as_object() else {
        return Value::Null;
    };
    if let Some(c) = obj.get("const") {
        return c.clone();
    }
    if let Some(first) = obj
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(first) = obj
            .get(key)
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            return synth(first, depth + 1);
        }
    }
    let ty = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts.iter().find_map(Value::as_str).unwrap_or("null"),
        _ => "object",
    };
    match ty {
        "string" => {
            let min = obj.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
            Value::String("x".repeat(min))
        }
        "integer" => json!(obj.get("minimum").and_then(Value::as_i64).unwrap_or(0)),
        "number" => json!(obj.get("minimum").and_then(Value::as_f64).unwrap_or(0.0)),
        "boolean" => Value::Bool(false),
        "null" => Value::Null,
        "array" => {
            let n = obj
                .get("minItems")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .min(64) as usize;
            let item = obj
                .get("items")
                .map_or(Value::Null, |i| synth(i, depth + 1));
            Value::Array(vec![item; n])
        }
        _ => {
            let mut out = Map::new();
            let props = obj.get("properties").and_then(Value::as_object);
            for name in obj
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                let sub = props
                    .and_then(|p| p.get(name))
                    .map_or(Value::Null, |s| synth(s, depth + 1));
                out.insert(name.to_owned(), sub);
            }
            Value::Object(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::schema::Schema;

    #[test]
    fn synthesized_values_satisfy_their_schemas() {
        let schemas = [
            json!({"type": "object", "required": ["summary", "steps"], "properties": {"summary": {"type": "string"}, "steps": {"type": "array", "items": {"type": "string"}}}}),
            json!({"type": "object", "required": ["verdict"], "properties": {"verdict": {"type": "string", "enum": ["approve", "revise"]}}}),
            json!({"type": "object", "required": ["tasks", "n"], "properties": {"tasks": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "string", "minLength": 3}}, "n": {"type": "integer", "minimum": 5}}}),
            json!({"type": "object", "required": ["x"], "properties": {"x": {"anyOf": [{"type": "boolean"}, {"type": "string"}]}}}),
            json!({"type": "object"}),
        ];
        for s in schemas {
            let v = synthesize(&s);
            assert!(
                Schema::compile(s.clone()).unwrap().check(&v).is_ok(),
                "{s} -> {v}"
            );
        }
    }
}
