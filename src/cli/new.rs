//! `troupe new <dir> [--from TEMPLATE]`: a pipeline of one's own in a
//! minute — the bundled pipelines (embedded in the binary) or a commented
//! one-stage skeleton, written into a new or empty folder, with the
//! folder's name as the pipeline's id when it is one. Every template
//! validates and runs offline (its `script.yaml`).

use std::path::Path;

use super::Exit;

/// A template: its name, what it shows, and its files.
struct Template {
    name: &'static str,
    about: &'static str,
    files: &'static [(&'static str, &'static str)],
}

macro_rules! bundled {
    ($dir:literal: $($file:literal),+ $(,)?) => {
        &[$(($file, include_str!(concat!("../../stages/", $dir, "/", $file)))),+]
    };
}

const EMPTY_PIPELINE: &str = r##"# A pipeline: an entry stage, a table of stages, and the Next() table.
# `troupe validate .` checks it; `troupe show . --mermaid` draws it;
# `troupe run . --task "…"` runs it offline from script.yaml (add --base-url
# for a model).
id: my-pipeline
name: My pipeline
entry: draft
ctx:
  task: { required: true, description: "What to do (`--task`)" }
stages:
  draft: draft.md            # an LLM stage: its contract and prompt live in the file
  report:                    # a deterministic step: no model
    kind: print
    content: "# Draft\n{{ctx.upstream[0].parsed.summary}}\n"
next:
  draft: report
  report: end
"##;

const EMPTY_STAGE: &str = r#"---
id: draft
name: Draft
# Tools this stage may call without asking (Read, Grep, Glob, Edit, Write,
# Bash, Echo, or <server>__<tool> of an MCP server); any other call needs
# an approval.
allowedTools: [Read, Grep]
# The model finishes by calling this tool with a payload of this schema.
completionTool: submit_draft
completionSchema:
  type: object
  required: [summary]
  properties:
    summary: { type: string }
retryPolicy:
  maxAttempts: 2
  backoff: { fixed: 1s }
turnCap: 10
resolutionPolicy: fail
---
Work on this task: {{ctx.task}}

Read what you need, then call `submit_draft` with a one-paragraph `summary`.
"#;

const EMPTY_SCRIPT: &str = r#"# Offline model turns for `troupe run . --task "..."` (the scripted provider).
stages:
  draft:
    - tool: Grep
      args: { pattern: "TODO" }
    - complete: { summary: "A first draft of: {{ctx.task}}" }
"#;

const TEMPLATES: &[Template] = &[
    Template {
        name: "empty",
        about: "one LLM stage and a print step, every field commented",
        files: &[
            ("pipeline.yaml", EMPTY_PIPELINE),
            ("draft.md", EMPTY_STAGE),
            ("script.yaml", EMPTY_SCRIPT),
        ],
    },
    Template {
        name: "fanout",
        about: "plan -> map of a two-turn worker -> reduce (the benchmark shape)",
        files: bundled!("fanout": "pipeline.yaml", "plan.md", "worker.md", "reduce.md", "script.yaml"),
    },
    Template {
        name: "code-review",
        about: "plan -> execute -> parallel [test, lint] -> join review -> print",
        files: bundled!("code-review": "pipeline.yaml", "plan.md", "execute.md", "test.md", "lint.md", "review.md", "script.yaml"),
    },
    Template {
        name: "triage",
        about: "classify -> extract_json -> switch -> print per branch",
        files: bundled!("triage": "pipeline.yaml", "classify.md", "script.yaml"),
    },
    Template {
        name: "ralph",
        about: "six stages with a fan-out and a join in the middle",
        files: bundled!("ralph": "pipeline.yaml", "discovery.md", "decompose.md", "build-a.md", "build-b.md", "join-review.md", "complete.md", "script.yaml"),
    },
    Template {
        name: "mcp-survey",
        about: "MCP filesystem server: a tool step, a transform, a map fan-out (needs npx)",
        files: bundled!("mcp-survey": "pipeline.yaml", "summarise.md", "report.md", "script.yaml"),
    },
];

/// The templates `--from` takes, with what each shows.
pub fn templates_help() -> String {
    let mut out = String::from("Templates:\n");
    for t in TEMPLATES {
        out.push_str(&format!("  {:<12} {}\n", t.name, t.about));
    }
    out
}

/// Writes template `from` into `dir`.
pub fn run(dir: &Path, from: &str) -> Exit {
    let Some(template) = TEMPLATES.iter().find(|t| t.name == from) else {
        let names: Vec<&str> = TEMPLATES.iter().map(|t| t.name).collect();
        say!(
            "error: Validation/InputInvalid: no template `{from}` (templates: {})",
            names.join(", ")
        );
        return Exit::Invalid;
    };
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                say!(
                    "error: Validation/InputInvalid: {} is not empty; `troupe new` writes only into a new or empty folder",
                    dir.display()
                );
                return Exit::Invalid;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Err(e) = std::fs::create_dir_all(dir) {
                say!(
                    "error: Validation/InputInvalid: cannot make {}: {e}",
                    dir.display()
                );
                return Exit::Invalid;
            }
        }
        Err(e) => {
            say!(
                "error: Validation/InputInvalid: cannot read {}: {e}",
                dir.display()
            );
            return Exit::Invalid;
        }
    }
    // The folder's name becomes the pipeline's id, in kebab-case (said
    // when that is not the name as given).
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let id = Some(kebab(&name)).filter(|k| crate::definition::fields::is_kebab(k));
    match &id {
        Some(id) if *id != name => {
            say!("note: the pipeline's id is `{id}`, its folder's name in kebab-case")
        }
        None => say!(
            "note: `{name}` has no letters or digits to make an id of; the pipeline keeps the template's (edit `id:` in pipeline.yaml)"
        ),
        Some(_) => {}
    }
    for (name, text) in template.files {
        let text = match (&id, *name) {
            (Some(id), "pipeline.yaml") => rename_id(text, id),
            _ => (*text).to_owned(),
        };
        if let Err(e) = std::fs::write(dir.join(name), text) {
            say!(
                "error: Validation/InputInvalid: cannot write {}: {e}",
                dir.join(name).display()
            );
            return Exit::Invalid;
        }
    }
    tell!(
        "wrote {} ({}): {} files",
        dir.display(),
        template.name,
        template.files.len()
    );
    tell!(
        "next: troupe validate {0} && troupe show {0} --mermaid && troupe run {0}{1}",
        shell_word(&dir.display().to_string()),
        required_ctx(dir)
    );
    Exit::Ok
}

/// The flags a run of the pipeline in `dir` needs for its required ctx
/// fields without a default (` --task "…"` or ` --ctx name=…`), so that
/// the command printed as the next step runs as printed.
fn required_ctx(dir: &Path) -> String {
    let Ok(pipeline) = crate::definition::load_pipeline(dir) else {
        return String::new();
    };
    pipeline
        .ctx
        .iter()
        .filter(|f| f.required && f.default.is_none())
        .map(|f| {
            if f.name == "task" {
                " --task \"…\"".to_owned()
            } else {
                format!(" --ctx {}=…", f.name)
            }
        })
        .collect()
}

/// `name` in kebab-case: lower-case letters and digits, every other run
/// of characters one `-` (`My_Pipe` → `my-pipe`); empty when it has no
/// letter or digit; at most 64 characters.
fn kebab(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    // An id is at most 64 characters.
    out.truncate(64);
    out.trim_end_matches('-').to_owned()
}

/// `word` as a shell reads it back as one word: as it is when it holds
/// nothing a shell treats specially, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@%,=".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// `text` with its top-level `id:` line set to `id`.
fn rename_id(text: &str, id: &str) -> String {
    let mut done = false;
    text.lines()
        .map(|line| {
            if !done && line.starts_with("id:") {
                done = true;
                format!("id: {id}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}
