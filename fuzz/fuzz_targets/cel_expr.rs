//! Fuzzes CEL expressions: compile, list variables, evaluate against a
//! small context with the variables an `assert` sees.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::definition::expr::Expr;

fuzz_target!(|source: &str| {
    let Ok(expr) = Expr::compile(source) else {
        return;
    };
    let _ = expr.variables();
    let ctx = serde_json::json!({
        "task": "t",
        "upstream": [{"parsed": {"verdict": "approve", "items": [1, 2, 3], "n": 2.5}}],
        "item": {"name": "a"},
        "index": 1,
    });
    let parsed = serde_json::json!({"steps": ["a", "b"], "ok": true, "score": 8});
    let cap_hit = serde_json::Value::Bool(false);
    let attempt = serde_json::Value::from(1);
    let vars = [
        ("ctx", &ctx),
        ("parsed", &parsed),
        ("capHit", &cap_hit),
        ("attempt", &attempt),
    ];
    let _ = expr.eval(&vars);
    let _ = expr.eval_bool(&vars);
});
