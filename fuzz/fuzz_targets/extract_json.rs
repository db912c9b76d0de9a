//! Fuzzes `extract_json`: JSON pulled out of arbitrary model text, checked
//! against the plain quadratic scan it replaced (one walk per bracket).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use troupe::runtime::extract::extract_json;

fuzz_target!(|text: &str| {
    let found = extract_json(text);
    // Text that is itself a JSON object or array comes back as it is.
    if let Ok(v) = serde_json::from_str::<Value>(text.trim())
        && (v.is_object() || v.is_array())
    {
        assert_eq!(found, Some(v));
    }
    // The reference is quadratic: compare where it is quick.
    if text.len() <= 16 * 1024 {
        assert_eq!(found, reference::extract_json(text));
    }
});

/// The scan as it was before it was made linear: the specification.
#[path = "../../tests/common/extract_reference.rs"]
mod reference;
