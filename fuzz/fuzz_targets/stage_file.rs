//! Fuzzes stage-file parsing: markdown with YAML frontmatter, then the
//! body template rendered against a small scope.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use troupe::definition::stage_file::parse_stage_file;

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    let mut diags = Vec::new();
    let parsed = parse_stage_file(
        Path::new("x.md"),
        &text,
        &troupe::definition::is_builtin,
        &mut diags,
    );
    // A file either parses cleanly or says why it does not.
    assert_eq!(parsed.is_some(), diags.is_empty(), "{diags:?}");
    if let Some(parsed) = parsed {
        let scope = serde_json::json!({
            "ctx": {"task": "t", "upstream": [{"parsed": {"summary": "s"}}]},
            "stage": {"id": "x", "name": "X"},
        });
        let _ = parsed.definition.body.render(&scope);
    }
});
