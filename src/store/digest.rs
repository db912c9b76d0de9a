//! A pipeline's content digest: SHA-256 over `pipeline.yaml` and every
//! stage file it names, so a resumed run can tell whether the pipeline
//! changed since it started. The scripted provider's `script.yaml` is not
//! part of the pipeline and is left out.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::definition::{Pipeline, StageKind};

/// `sha256:<hex>` of the pipeline's files, or why one cannot be read.
pub fn pipeline_digest(pipeline: &Pipeline) -> Result<String, String> {
    let mut files: Vec<(String, std::path::PathBuf)> = vec![(
        "pipeline.yaml".to_owned(),
        pipeline.dir.join("pipeline.yaml"),
    )];
    for stage in &pipeline.stages {
        if let StageKind::Llm(def) = &stage.kind {
            let rel = def
                .file
                .strip_prefix(&pipeline.dir)
                .unwrap_or(&def.file)
                .to_string_lossy()
                .into_owned();
            files.push((rel, def.file.clone()));
        }
    }
    files.sort();
    files.dedup();
    let mut hash = Sha256::new();
    for (rel, path) in &files {
        let bytes = read(path)?;
        hash.update(rel.as_bytes());
        hash.update([0]);
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    let digest = hash.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}
