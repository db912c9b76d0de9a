//! A pipeline as a graph for people: Mermaid (for a README) or Graphviz
//! DOT. Nodes are the stages (with their kind), plus start and end; edges
//! are the Next table: plain successors, router branches (with the value
//! that picks them), fan-outs (with their cap and, for `map`, the list),
//! and joins.

use super::model::{Next, Pipeline, Siblings, StageKind};

/// One edge: from, to, label.
pub type Edge = (String, String, String);

/// The start node's id in [`edges`].
pub const START: &str = "__start__";
/// The end node's id in [`edges`].
pub const END: &str = "__end__";

/// A stage's label: its id, then its kind (an LLM stage's allowed tools).
pub fn kind_label(p: &Pipeline, id: &str) -> String {
    match p.stage(id).map(|s| &s.kind) {
        Some(StageKind::Llm(def)) => {
            if def.allowed_tools.is_empty() {
                format!("{id}\nllm")
            } else {
                format!("{id}\nllm: {}", def.allowed_tools.join(", "))
            }
        }
        Some(StageKind::Tool { tool, .. }) => format!("{id}\ntool: {tool}"),
        Some(other) => format!("{id}\n{}", other.kind_name()),
        None => id.to_owned(),
    }
}

/// The graph's edges, start and end included.
pub fn edges(p: &Pipeline) -> Vec<Edge> {
    let mut out: Vec<Edge> = vec![(START.to_owned(), p.entry.clone(), String::new())];
    for stage in &p.stages {
        let id = &stage.id;
        match &stage.kind {
            StageKind::IfElse {
                then, otherwise, ..
            } => {
                out.push((id.clone(), then.clone(), "true".to_owned()));
                out.push((id.clone(), otherwise.clone(), "false".to_owned()));
            }
            StageKind::Switch { cases, default, .. } => {
                for (value, target) in cases {
                    out.push((id.clone(), target.clone(), value.clone()));
                }
                if let Some(d) = default {
                    out.push((id.clone(), d.clone(), "default".to_owned()));
                }
            }
            _ => {}
        }
        match p.next_of(id) {
            Some(Next::End) => out.push((id.clone(), END.to_owned(), String::new())),
            Some(Next::Stage(next)) => out.push((id.clone(), next.clone(), String::new())),
            Some(Next::Parallel(plan)) => {
                let cap = plan.cap.map(|c| format!(", cap {c}")).unwrap_or_default();
                let siblings: Vec<String> = match &plan.siblings {
                    Siblings::Static(list) => {
                        for s in list {
                            out.push((id.clone(), s.clone(), format!("parallel{cap}")));
                        }
                        list.clone()
                    }
                    Siblings::Map { stage, over } => {
                        out.push((
                            id.clone(),
                            stage.clone(),
                            format!("map over {}{cap}", over.source()),
                        ));
                        vec![stage.clone()]
                    }
                };
                if let Some(join) = &plan.join {
                    for s in &siblings {
                        out.push((s.clone(), join.clone(), "join".to_owned()));
                    }
                }
            }
            None => {}
        }
    }
    out
}

fn node_id(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("n_{safe}")
}

fn mermaid_text(text: &str) -> String {
    text.replace('"', "#quot;").replace('\n', "<br/>")
}

/// The pipeline as a Mermaid flowchart.
pub fn mermaid(p: &Pipeline) -> String {
    let mut out = String::from("flowchart TD\n");
    out.push_str(&format!("    {}([start])\n", node_id(START)));
    for stage in &p.stages {
        let label = mermaid_text(&kind_label(p, &stage.id));
        let shape = if stage.kind.is_router() {
            format!("{{\"{label}\"}}")
        } else {
            format!("[\"{label}\"]")
        };
        out.push_str(&format!("    {}{shape}\n", node_id(&stage.id)));
    }
    out.push_str(&format!("    {}([end])\n", node_id(END)));
    for (from, to, label) in edges(p) {
        if label.is_empty() {
            out.push_str(&format!("    {} --> {}\n", node_id(&from), node_id(&to)));
        } else {
            out.push_str(&format!(
                "    {} -->|\"{}\"| {}\n",
                node_id(&from),
                mermaid_text(&label),
                node_id(&to)
            ));
        }
    }
    out
}

fn dot_text(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The pipeline as a Graphviz digraph.
pub fn dot(p: &Pipeline) -> String {
    let mut out = format!("digraph \"{}\" {{\n    rankdir=TB;\n", dot_text(&p.id));
    out.push_str(&format!(
        "    \"{START}\" [label=\"start\", shape=circle];\n"
    ));
    out.push_str(&format!(
        "    \"{END}\" [label=\"end\", shape=doublecircle];\n"
    ));
    for stage in &p.stages {
        let shape = if stage.kind.is_router() {
            "diamond"
        } else {
            "box"
        };
        out.push_str(&format!(
            "    \"{}\" [label=\"{}\", shape={shape}];\n",
            dot_text(&stage.id),
            dot_text(&kind_label(p, &stage.id))
        ));
    }
    for (from, to, label) in edges(p) {
        let attrs = if label.is_empty() {
            String::new()
        } else {
            format!(" [label=\"{}\"]", dot_text(&label))
        };
        out.push_str(&format!(
            "    \"{}\" -> \"{}\"{attrs};\n",
            dot_text(&from),
            dot_text(&to)
        ));
    }
    out.push_str("}\n");
    out
}
