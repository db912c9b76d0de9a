//! Fuzzes `pipeline.yaml` loading and validation: the input's first byte
//! picks a pipeline folder (its stage files are read from disk), the rest
//! is the pipeline.yaml text.
#![no_main]

use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use troupe::definition::load_pipeline_text;

/// Folders whose stage files the fuzzed pipeline.yaml can reference.
const FOLDERS: [&str; 5] = [
    "stages/code-review",
    "stages/fanout",
    "stages/ralph",
    "stages/triage",
    "tests/fixtures/three-errors",
];

fn folder(pick: u8) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join(FOLDERS[usize::from(pick) % FOLDERS.len()])
}

fuzz_target!(|bytes: &[u8]| {
    let Some((&pick, rest)) = bytes.split_first() else {
        return;
    };
    let dir = folder(pick);
    let text = String::from_utf8_lossy(rest);
    match load_pipeline_text(
        &dir,
        &dir.join("pipeline.yaml"),
        &text,
        &troupe::definition::is_builtin,
    ) {
        Ok(pipeline) => {
            assert!(pipeline.stage(&pipeline.entry).is_some());
        }
        Err(diags) => assert!(!diags.0.is_empty()),
    }
});
