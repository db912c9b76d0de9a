//! `troupe new` and the graph exports, through the binary: every template
//! is written into a fresh folder, validates with the folder's name as its
//! id, and runs offline; a non-empty folder or an unknown template is
//! refused; `show --mermaid|--dot` draws every stage and every edge of the
//! Next table.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;

use std::process::{Command, Output};

fn troupe(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn every_template_validates_and_runs_offline() {
    let base = tempfile::tempdir().unwrap();
    for template in [
        "empty",
        "fanout",
        "code-review",
        "triage",
        "ralph",
        "mcp-survey",
    ] {
        let name = format!("my-{template}");
        let out = troupe(&["new", &name, "--from", template], base.path());
        assert_eq!(out.status.code(), Some(0), "{template}: {}", said(&out));
        // The next step it prints runs as printed, with its `…` filled in.
        let printed = String::from_utf8(out.stdout).unwrap();
        let next = printed
            .lines()
            .find_map(|l| l.strip_prefix("next: "))
            .unwrap_or_else(|| panic!("{template}: {printed}"));
        let (_, run) = next.rsplit_once("&& troupe ").unwrap();
        let run: Vec<String> = run
            .split_whitespace()
            .map(|w| w.replace("\"…\"", "try it").replace('…', "x"))
            .collect();
        let out = troupe(&["validate", &name, "--json"], base.path());
        assert_eq!(out.status.code(), Some(0), "{template}: {}", said(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["id"], name, "the folder's name is the id");
        if template == "mcp-survey" {
            continue; // its server comes from npx: tests/mcp.rs runs it
        }
        let mut args: Vec<&str> = run.iter().map(String::as_str).collect();
        args.push("--headless");
        let out = troupe(&args, base.path());
        assert_eq!(
            out.status.code(),
            Some(0),
            "{template}: {args:?}: {}",
            said(&out)
        );
    }
}

#[test]
fn new_refuses_a_folder_with_files_and_an_unknown_template() {
    let base = tempfile::tempdir().unwrap();
    std::fs::create_dir(base.path().join("full")).unwrap();
    std::fs::write(base.path().join("full/keep.txt"), "mine").unwrap();
    let out = troupe(&["new", "full"], base.path());
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains("is not empty"), "{}", said(&out));
    assert_eq!(
        std::fs::read_to_string(base.path().join("full/keep.txt")).unwrap(),
        "mine"
    );
    let out = troupe(&["new", "fresh", "--from", "nope"], base.path());
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("templates: empty, fanout"),
        "{}",
        said(&out)
    );
    assert!(!base.path().join("fresh").exists());
}

/// A folder name that is not kebab-case gives its kebab-case as the id,
/// said; the printed next step quotes a path a shell would split.
#[test]
fn a_folder_name_that_is_not_kebab_case_is_made_one_and_said() {
    let base = tempfile::tempdir().unwrap();
    for (name, id) in [("Bad Name", "bad-name"), ("My_Pipe", "my-pipe")] {
        let out = troupe(&["new", name], base.path());
        assert_eq!(out.status.code(), Some(0), "{name}: {}", said(&out));
        assert!(
            said(&out).contains(&format!("the pipeline's id is `{id}`")),
            "{}",
            said(&out)
        );
        let yaml = std::fs::read_to_string(base.path().join(name).join("pipeline.yaml")).unwrap();
        assert!(yaml.contains(&format!("id: {id}\n")), "{yaml}");
        let out = troupe(&["validate", name], base.path());
        assert_eq!(out.status.code(), Some(0), "{name}: {}", said(&out));
    }
    let out = troupe(&["new", "two words"], base.path());
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(printed.contains("troupe validate 'two words'"), "{printed}");
}

#[test]
fn the_graph_exports_draw_every_stage_and_edge() {
    let root = common::project::bundled("code-review");
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mermaid = troupe(&["show", root.to_str().unwrap(), "--mermaid"], here);
    assert_eq!(mermaid.status.code(), Some(0), "{}", said(&mermaid));
    let text = String::from_utf8_lossy(&mermaid.stdout);
    assert!(text.starts_with("flowchart TD\n"));
    for stage in ["plan", "execute", "test", "lint", "review", "report"] {
        assert!(text.contains(&format!("n_{stage}[")), "{stage}: {text}");
    }
    // start→plan, plan→execute, two parallel, two joins, review→report, report→end.
    assert_eq!(text.matches("-->").count(), 8, "{text}");
    assert_eq!(text.matches("|\"join\"|").count(), 2, "{text}");

    let dot = troupe(
        &[
            "show",
            common::project::bundled("triage").to_str().unwrap(),
            "--dot",
        ],
        here,
    );
    assert_eq!(dot.status.code(), Some(0), "{}", said(&dot));
    let text = String::from_utf8_lossy(&dot.stdout);
    assert!(text.starts_with("digraph \"triage\" {") && text.trim_end().ends_with('}'));
    for line in text.lines().skip(1).filter(|l| l.trim() != "}") {
        assert!(line.trim_end().ends_with(';'), "{line}");
    }
    // The switch is a diamond with an edge per case.
    assert!(text.contains("shape=diamond"), "{text}");
    // A stage id can't be combined with a graph format.
    let out = troupe(&["show", root.to_str().unwrap(), "plan", "--mermaid"], here);
    assert_eq!(out.status.code(), Some(2));
}
