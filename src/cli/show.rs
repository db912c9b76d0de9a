//! `troupe show`: the pipeline graph as text or JSON, or one stage in full.

use std::fmt::Write as _;
use std::path::Path;

use super::Exit;
use super::validate::{print_diagnostics, reject};
use crate::definition::tool_manifest::stage_manifest_with;
use crate::definition::{
    Backoff, Next, Pipeline, Siblings, Stage, StageDefinition, StageKind,
    duration::format_duration, load_pipeline,
};
use crate::error::ValidationCode;

pub fn run(path: &Path, stage: Option<&str>, json: bool, connect: Option<&Path>) -> Exit {
    let pipeline = match load_pipeline(path) {
        Ok(p) => p,
        Err(diags) => {
            print_diagnostics(path, &diags, json);
            return Exit::Invalid;
        }
    };
    let mut pool = None;
    // The servers' stderr, for the tail a start error quotes.
    let logs = tempfile::tempdir().ok();
    if let (Some(root), Some(_)) = (connect, stage) {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_owned());
        let shell = super::sandbox::shell_sandbox(false, &[], &root);
        let log_dir = logs.as_ref().map(tempfile::TempDir::path);
        match super::mcp::start_servers(&pipeline, &root, shell.sandbox.clone(), log_dir, false) {
            Ok(p) => pool = p,
            Err(e) => return super::mcp::mcp_failed(&e, json),
        }
    }
    let manifest = |def: &crate::definition::StageDefinition| {
        let mcp = pool
            .as_ref()
            .map(|p| p.specs(&def.allowed_tools))
            .unwrap_or_default();
        stage_manifest_with(def, mcp)
    };
    match stage {
        None if json => print_json(&pipeline),
        None => tell!(@raw "{}", graph_text(&pipeline)),
        Some(id) => {
            let Some(stage) = pipeline.stage(id) else {
                let ids: Vec<&str> = pipeline.stages.iter().map(|s| s.id.as_str()).collect();
                return reject(
                    path,
                    ValidationCode::UnknownStage,
                    format!(
                        "no stage `{id}` in {} (stages: {})",
                        pipeline.id,
                        ids.join(", ")
                    ),
                    json,
                );
            };
            if json {
                print_json(&stage_json(stage, &manifest));
            } else {
                tell!(@raw "{}", stage_text(stage, &manifest));
            }
        }
    }
    Exit::Ok
}

/// Prints the pipeline's graph as Mermaid (`mermaid`) or Graphviz DOT.
pub fn graph(path: &Path, mermaid: bool) -> Exit {
    match load_pipeline(path) {
        Ok(p) => {
            if mermaid {
                tell!(@raw "{}", crate::definition::graph::mermaid(&p));
            } else {
                tell!(@raw "{}", crate::definition::graph::dot(&p));
            }
            Exit::Ok
        }
        Err(diags) => {
            print_diagnostics(path, &diags, false);
            Exit::Invalid
        }
    }
}

fn print_json<T: serde::Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => tell!("{s}"),
        Err(e) => say!("error: cannot serialize: {e}"),
    }
}

type Manifest<'a> =
    dyn Fn(&crate::definition::StageDefinition) -> Vec<crate::definition::ToolSpec> + 'a;

fn stage_json(stage: &Stage, manifest: &Manifest<'_>) -> serde_json::Value {
    let mut value = serde_json::to_value(stage).unwrap_or_default();
    if let (StageKind::Llm(def), Some(obj)) = (&stage.kind, value.as_object_mut()) {
        // As the model is shown it (OpenAI function tools).
        let tools: Vec<serde_json::Value> = manifest(def)
            .iter()
            .map(crate::provider::openai::function_tool)
            .collect();
        obj.insert("toolManifest".into(), tools.into());
    }
    value
}

/// The pipeline as a readable graph.
pub fn graph_text(p: &Pipeline) -> String {
    let mut out = String::new();
    let cap = p.parallel_cap.map_or_else(
        || format!("{} (default)", p.effective_cap(None)),
        |c| c.to_string(),
    );
    let visits = p.max_visits.map_or_else(
        || format!("{} (default)", p.effective_max_visits()),
        |v| v.to_string(),
    );
    let _ = writeln!(out, "pipeline {} — {}", p.id, p.name);
    let _ = writeln!(out, "  folder      {}", p.dir.display());
    let _ = writeln!(out, "  entry       {}", p.entry);
    let _ = writeln!(out, "  parallelCap {cap}");
    let _ = writeln!(out, "  maxVisits   {visits}");
    if !p.ctx.is_empty() {
        let _ = writeln!(out, "\nctx:");
        for f in &p.ctx {
            let mut notes = Vec::new();
            if f.required {
                notes.push("required".to_owned());
            }
            if let Some(d) = &f.default {
                notes.push(format!("default {d}"));
            }
            let _ = writeln!(out, "  {:<14} {}", f.name, notes.join(", "));
        }
    }
    let width = p
        .stages
        .iter()
        .map(|s| s.id.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(out, "\nstages:");
    for s in &p.stages {
        let _ = writeln!(out, "  {:<width$}  {}", s.id, stage_summary(s));
    }
    let _ = writeln!(out, "\nnext:");
    for s in &p.stages {
        let arrow = match (&s.kind, p.next_of(&s.id)) {
            (
                StageKind::IfElse {
                    then, otherwise, ..
                },
                _,
            ) => format!("if → {then}, else → {otherwise}"),
            (StageKind::Switch { cases, default, .. }, _) => {
                let mut parts: Vec<String> =
                    cases.iter().map(|(v, t)| format!("{v} → {t}")).collect();
                if let Some(d) = default {
                    parts.push(format!("default → {d}"));
                }
                format!("switch: {}", parts.join(", "))
            }
            (_, None) if is_sibling(p, &s.id) => "(parallel sibling: back to its group)".to_owned(),
            (_, None | Some(Next::End)) => "end".to_owned(),
            (_, Some(Next::Stage(t))) => t.clone(),
            (_, Some(Next::Parallel(plan))) => {
                let siblings = match &plan.siblings {
                    Siblings::Static(ids) => format!("parallel [{}]", ids.join(", ")),
                    Siblings::Map { stage, over } => {
                        format!("map {stage} over `{}`", over.source())
                    }
                };
                let join = plan
                    .join
                    .as_ref()
                    .map_or_else(|| "no join".to_owned(), |j| format!("join {j}"));
                let cap = match plan.cap {
                    Some(c) if c < p.effective_cap(None) => format!("cap {c}"),
                    Some(c) => format!(
                        "cap {} (asks {c}; the run's cap bounds it)",
                        p.effective_cap(None)
                    ),
                    None => format!("cap {}", p.effective_cap(None)),
                };
                format!("{siblings} ({cap}) → {join}")
            }
        };
        let _ = writeln!(out, "  {:<width$}  → {arrow}", s.id);
    }
    if !p.asserts.is_empty() || !p.gates.is_empty() {
        let _ = writeln!(out, "\nchecks:");
        for (stage, exprs) in &p.asserts {
            for e in exprs {
                let _ = writeln!(out, "  assert {stage}: {}", e.source());
            }
        }
        for (stage, gate) in &p.gates {
            let _ = writeln!(
                out,
                "  gate   {stage}: when {} otherwise {:?}",
                gate.when.source(),
                gate.otherwise
            );
        }
    }
    out
}

/// True when `id` runs as a sibling of some parallel group.
fn is_sibling(p: &Pipeline, id: &str) -> bool {
    p.next.values().any(|n| match n {
        Next::Parallel(plan) => plan.siblings.stages().iter().any(|s| s == id),
        _ => false,
    })
}

fn stage_summary(s: &Stage) -> String {
    match &s.kind {
        StageKind::Llm(d) => {
            let file = d
                .file
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
            format!(
                "llm {file}: tools [{}] → {}, turnCap {}",
                d.allowed_tools.join(", "),
                d.completion_tool,
                d.turn_cap
            )
        }
        StageKind::ExtractJson { from } => format!("extract_json from `{}`", from.source()),
        StageKind::Print { .. } => "print".to_owned(),
        StageKind::IfElse { condition, .. } => format!("if_else `{}`", condition.source()),
        StageKind::Switch { on, .. } => format!("switch on `{}`", on.source()),
        StageKind::Tool { tool, .. } => format!("tool {tool}"),
        StageKind::Human { .. } => "human (asks a person)".to_owned(),
        StageKind::Transform { set } => format!(
            "transform → {}",
            set.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn backoff_text(b: &Backoff) -> String {
    match b {
        Backoff::None => "none".to_owned(),
        Backoff::Fixed(d) => format!("fixed {}", format_duration(*d)),
        Backoff::Exponential { initial, max } => format!(
            "exponential {} … {}",
            format_duration(*initial),
            format_duration(*max)
        ),
    }
}

/// One stage in full.
pub fn stage_text(stage: &Stage, manifest: &Manifest<'_>) -> String {
    let mut out = String::new();
    match &stage.kind {
        StageKind::Llm(d) => llm_stage_text(d, manifest, &mut out),
        other => {
            let _ = writeln!(out, "stage {} ({})", stage.id, other.kind_name());
            let json = serde_json::to_string_pretty(other).unwrap_or_default();
            let _ = writeln!(out, "{json}");
        }
    }
    out
}

fn llm_stage_text(d: &StageDefinition, manifest: &Manifest<'_>, out: &mut String) {
    let _ = writeln!(out, "stage {} — {}", d.id, d.name);
    let _ = writeln!(out, "  file              {}", d.file.display());
    if let Some(desc) = &d.description {
        let _ = writeln!(out, "  description       {desc}");
    }
    let _ = writeln!(out, "  allowedTools      [{}]", d.allowed_tools.join(", "));
    let _ = writeln!(out, "  completionTool    {}", d.completion_tool);
    let _ = writeln!(
        out,
        "  retryPolicy       maxAttempts {}, backoff {}",
        d.retry_policy.max_attempts,
        backoff_text(&d.retry_policy.backoff)
    );
    let _ = writeln!(out, "  turnCap           {}", d.turn_cap);
    let _ = writeln!(
        out,
        "  resolutionPolicy  {}",
        serde_json::to_value(d.resolution_policy)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    );
    if !d.tags.is_empty() {
        let _ = writeln!(out, "  tags              [{}]", d.tags.join(", "));
    }
    let _ = writeln!(
        out,
        "  completionSchema  {}",
        d.completion_schema.document()
    );
    if let Some(s) = &d.inputs_schema {
        let _ = writeln!(out, "  inputsSchema      {}", s.document());
    }
    let _ = writeln!(out, "\ntool manifest (what the model sees):");
    let tools = manifest(d);
    if d.allowed_tools.iter().any(|t| t.contains("__"))
        && !tools.iter().any(|t| t.name.contains("__"))
    {
        let _ = writeln!(
            out,
            "  (MCP tools are listed with --connect, which starts the servers)"
        );
    }
    for t in tools {
        let marker = if *t.name == *d.completion_tool {
            "  (completion channel)"
        } else {
            ""
        };
        let _ = writeln!(out, "  - {}{marker}", t.name);
        let _ = writeln!(out, "      {}", t.description);
        let _ = writeln!(out, "      parameters: {}", t.parameters);
    }
    let _ = writeln!(out, "\nbody (system prompt template):");
    for line in d.body.source().lines() {
        let _ = writeln!(out, "  | {line}");
    }
}
