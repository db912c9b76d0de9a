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

/// A bundled pipeline's folder, `stages/<name>`.
pub fn stages(name: &str) -> String {
    format!("{}/stages/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A finished command's exit status and both its streams, for a failed
/// assertion's message.
pub fn text(out: &std::process::Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The audit log, as JSON lines, of the only run under `<runs>/runs`.
pub fn audit_text(runs: &Path) -> String {
    let run = std::fs::read_dir(runs.join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    troupe::auditlog::read_text(&run.path().join(troupe::auditlog::FILE)).unwrap()
}

/// [`audit_text`]'s events.
pub fn audit(runs: &Path) -> Vec<serde_json::Value> {
    audit_text(runs)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

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
