//! Properties: no input, however broken, panics the loader.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use proptest::prelude::*;
use troupe::definition::stage_file::parse_stage_file;
use troupe::definition::template::Template;
use troupe::definition::{load_pipeline, yaml};

fn is_tool(name: &str) -> bool {
    troupe::definition::is_builtin(name)
}

/// Fragments that exercise YAML and template edge cases when spliced.
const FRAGMENTS: [&str; 16] = [
    "---\n", "\t", "\r\n", "\u{feff}", "{{", "}}", "&a ", "*a", ": ", "- ", "[", "]", "{", "}",
    "\"", "ctx.",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_stage_parser(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let text = String::from_utf8_lossy(&bytes);
        let mut diags = Vec::new();
        let parsed = parse_stage_file(Path::new("x.md"), &text, &is_tool, &mut diags);
        // Either it parsed, or it said why.
        prop_assert!(parsed.is_some() || !diags.is_empty());
    }

    #[test]
    fn spliced_fragments_never_panic(pieces in proptest::collection::vec((0usize..FRAGMENTS.len(), "[a-zA-Z0-9 :_\\n-]{0,12}"), 0..40)) {
        let mut text = String::from("---\nid: a\nname: A\n");
        for (i, filler) in &pieces {
            text.push_str(FRAGMENTS[*i]);
            text.push_str(filler);
        }
        let mut diags = Vec::new();
        let _ = parse_stage_file(Path::new("x.md"), &text, &is_tool, &mut diags);
        let _ = yaml::parse(&text);
        let _ = Template::parse(&text);
    }

    #[test]
    fn mutated_valid_files_never_panic(cut in 0usize..600, insert in "[\\PC]{0,8}") {
        let good = common::stage_md("a", "", "Task: {{ctx.task}}");
        let cut = cut.min(good.len());
        let cut = (0..=cut).rev().find(|i| good.is_char_boundary(*i)).unwrap_or(0);
        let text = format!("{}{}{}", &good[..cut], insert, &good[cut..]);
        let mut diags = Vec::new();
        let _ = parse_stage_file(Path::new("x.md"), &text, &is_tool, &mut diags);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_as_files_never_panic_the_loader(stage in proptest::collection::vec(any::<u8>(), 0..1024), pipeline in proptest::collection::vec(any::<u8>(), 0..512)) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.yaml"), &pipeline).unwrap();
        std::fs::write(dir.path().join("a.md"), &stage).unwrap();
        prop_assert!(load_pipeline(dir.path()).is_err());
        std::fs::write(dir.path().join("pipeline.yaml"), "id: demo\nentry: a\nstages:\n  a: a.md\n").unwrap();
        let _ = load_pipeline(dir.path());
    }
}
