//! The docs teach commands that work: every `troupe …` line of a `sh`
//! block in README.md and docs/*.md parses with the real CLI definition
//! (flags, values, conflicts), and every relative link points at a file
//! that exists.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use clap::Parser;

fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![
        root.join("README.md"),
        root.join("SECURITY.md"),
        root.join("ARCHITECTURE.md"),
        root.join("BENCHMARKS.md"),
        root.join("stages/README.md"),
    ];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
}

/// Shell words of `line` up to a comment, pipe, `&&`, `;`, redirection or
/// background `&` outside quotes.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    in_word = true;
                }
                '#' if !in_word => break,
                '|' | ';' | '>' | '&' | '<' => break,
                ' ' | '\t' => {
                    if in_word {
                        out.push(std::mem::take(&mut word));
                        in_word = false;
                    }
                }
                _ => {
                    word.push(c);
                    in_word = true;
                }
            },
        }
        i += 1;
    }
    if in_word {
        out.push(word);
    }
    out
}

/// Every `troupe` command line in the `sh` blocks of `text`.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_sh = matches!(trimmed, "```sh" | "```bash" | "```shell");
            continue;
        }
        if !in_sh {
            continue;
        }
        if let Some(cont) = trimmed.strip_suffix('\\') {
            pending.push_str(cont);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let full = std::mem::take(&mut pending);
        let full = full.trim();
        let cmd = full
            .strip_prefix("cargo run -q -- ")
            .map(|rest| format!("troupe {rest}"))
            .or_else(|| full.starts_with("troupe ").then(|| full.to_owned()));
        if let Some(cmd) = cmd {
            out.push(cmd);
        }
    }
    out
}

#[test]
fn every_command_the_docs_show_parses() {
    let mut checked = 0;
    let mut problems = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for cmd in commands(&text) {
            let args = words(&cmd);
            checked += 1;
            if let Err(e) = troupe::cli::Cli::try_parse_from(&args) {
                let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                problems.push(format!("{}: `{cmd}`: {first}", file.display()));
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} commands found: is the extraction broken?"
    );
    assert!(
        problems.is_empty(),
        "commands in the docs that do not parse:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_command_with_a_wrong_flag_would_be_caught() {
    let args = words("troupe run stages/fanout --no-such-flag # a comment");
    assert_eq!(args, ["troupe", "run", "stages/fanout", "--no-such-flag"]);
    assert!(troupe::cli::Cli::try_parse_from(&args).is_err());
    assert_eq!(
        words(r#"troupe approve "$RUN" 'a/b#c' | tee x"#),
        ["troupe", "approve", "$RUN", "a/b#c"]
    );
}

#[test]
fn every_relative_link_in_the_docs_points_at_a_file() {
    let mut broken = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains("://") || path.contains(' ') {
                continue;
            }
            if !dir.join(path).exists() {
                broken.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
