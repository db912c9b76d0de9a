//! Fuzzes template parsing and rendering (`{{ path }}` placeholders).
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::definition::template::{Segment, Template, line_col, lookup};

fuzz_target!(|text: &str| {
    let Ok(template) = Template::parse(text) else {
        return;
    };
    assert_eq!(template.source(), text);
    let scope = serde_json::json!({
        "ctx": {
            "task": "t", "n": 3, "list": [1, "two", {"x": null}],
            "upstream": [{"parsed": {"summary": "s", "items": [1, 2]}}],
        },
        "stage": {"id": "x", "name": "X"},
    });
    let rendered = template.render(&scope);
    let _ = template.render_value(|path| lookup(&scope, path).cloned());
    // Text without placeholders renders to itself.
    if template.placeholders().next().is_none() {
        assert_eq!(rendered.as_deref(), Ok(text));
    }
    for ph in template.placeholders() {
        assert!(text[ph.offset..].starts_with("{{"));
        let _ = line_col(text, ph.offset);
        assert!(!ph.path.is_empty());
        assert!(matches!(ph.path[0], Segment::Key(_)));
    }
    // Every placeholder resolved to a string renders without error.
    let all = template.render_with(|_| Ok(serde_json::Value::String("v".into())));
    assert!(all.is_ok());
});
