//! Shared helpers for integration tests: build pipeline folders in a temp dir.

#![allow(dead_code)]

pub mod openai_rules;
pub mod otlp;
pub mod project;
pub mod requests;
pub mod run;
pub mod serve;

use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// A loopback port nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A valid LLM stage file for `id`, with `extra` appended to the frontmatter
/// and `body` as the prompt.
pub fn stage_md(id: &str, extra: &str, body: &str) -> String {
    format!(
        "---\nid: {id}\nname: Stage {id}\nallowedTools: [Read]\ncompletionTool: submit_{u}\ncompletionSchema:\n  type: object\n  required: [summary]\n  properties:\n    summary: {{ type: string }}\nretryPolicy:\n  maxAttempts: 1\n  backoff: none\nturnCap: 5\nresolutionPolicy: fail\n{extra}---\n{body}\n",
        u = id.replace('-', "_")
    )
}

/// A pipeline folder in a temp dir.
pub struct Fixture {
    pub dir: TempDir,
}

impl Fixture {
    /// `pipeline.yaml` plus exactly the given files (a stage file not
    /// given is missing).
    pub fn new(pipeline_yaml: &str, files: &[(&str, &str)]) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline_yaml).expect("write pipeline");
        for (name, content) in files {
            let path = dir.path().join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            std::fs::write(path, content).expect("write file");
        }
        Fixture { dir }
    }

    /// A linear `a → b` pipeline with valid stage files, then `files`
    /// overriding any of them.
    pub fn linear(files: &[(&str, &str)]) -> Fixture {
        let yaml = "id: demo\nentry: a\nctx:\n  task: { required: true }\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: b\n  b: end\n";
        let a = stage_md("a", "", "Task: {{ctx.task}}");
        let b = stage_md("b", "", "Prior: {{ctx.upstream[0].parsed.summary}}");
        let mut all: Vec<(&str, &str)> = vec![("a.md", &a), ("b.md", &b)];
        for f in files {
            all.retain(|(n, _)| n != &f.0);
            all.push(*f);
        }
        Fixture::new(yaml, &all)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
