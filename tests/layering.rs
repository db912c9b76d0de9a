//! The crate's layering, checked on its source: no module imports a layer
//! above its own, and no two files import each other.
//!
//! The rules, kept simple on purpose:
//! - Layers, lowest first: `error`, `environ`, `auditlog`, `allocator`;
//!   `definition`; `provider`, `tools`; `runtime`; `store`, `report`,
//!   `bench`, `distributed`, `control`, `telemetry`; `cli` ([`LAYERS`]).
//!   A file under `src/<module>` may name `crate::<other>` only when
//!   `<other>` is in the same layer or one below. A new top-level module
//!   must be given a layer here before this test passes.
//! - "A imports B" when A names a path into B: `crate::…` anywhere in A
//!   (its unit tests included), `super::…` above A's `#[cfg(test)]` (in a
//!   test module, `super` is A itself). A path belongs to the file that
//!   declares the longest prefix of it; a name a folder's root file only
//!   re-exports (`pub use child::Name`) belongs to the child that defines
//!   it. Comments and string literals are ignored.
//! - Two different files must not import each other.
//!
//! The checker runs on `src/` read at test time, and on small made-up
//! trees that break each rule, so it is known to fail when it should.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first. A module may import its own layer and those
/// below it, never one above.
const LAYERS: [&[&str]; 6] = [
    &["error", "environ", "auditlog", "allocator"],
    &["definition"],
    &["provider", "tools"],
    &["runtime"],
    &[
        "store",
        "report",
        "bench",
        "distributed",
        "control",
        "telemetry",
    ],
    &["cli"],
];

#[test]
fn no_module_imports_a_layer_above_it_and_no_two_files_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_tree(&src, &src, &mut files);
    assert!(files.len() > 50, "read only {} files", files.len());
    let problems = check(&files);
    assert!(
        problems.is_empty(),
        "layering broken:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn an_upward_import_is_reported() {
    let problems = check(&tree(&[
        ("provider.rs", "pub mod scripted;"),
        (
            "provider/scripted.rs",
            "use crate::runtime::context::StageContext;",
        ),
        ("runtime.rs", "pub mod context;"),
        ("runtime/context.rs", "pub struct StageContext;"),
        (
            "definition.rs",
            "fn f() -> crate::tools::ToolSpec { todo!() }",
        ),
        ("tools.rs", "pub struct ToolSpec;"),
        (
            "error.rs",
            "// crate::cli in a comment is fine\nconst A: &str = \"crate::cli\";",
        ),
    ]));
    assert_eq!(
        problems,
        [
            "src/definition.rs imports crate::tools (layer `provider, tools` is above `definition`)",
            "src/provider/scripted.rs imports crate::runtime (layer `runtime` is above `provider, tools`)",
        ]
    );
}

#[test]
fn two_files_importing_each_other_are_reported_through_re_exports() {
    let problems = check(&tree(&[
        ("runtime.rs", "pub mod stage;\npub mod actor;"),
        ("runtime/stage.rs", "mod run;\npub use run::StageRun;"),
        (
            "runtime/stage/run.rs",
            "use crate::runtime::actor::Owner;\npub struct StageRun;",
        ),
        (
            "runtime/actor.rs",
            "use super::stage::StageRun;\npub struct Owner;",
        ),
        ("tools.rs", "pub mod a;\npub mod b;\npub mod c;"),
        (
            "tools/a.rs",
            "pub struct A;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}",
        ),
        ("tools/b.rs", "use super::{a::A, c};"),
        // In a test module of any visibility, `super` is the file itself.
        (
            "tools/c.rs",
            "pub struct C;\n#[cfg(test)]\npub(super) mod tests {\n    use super::b::B;\n}",
        ),
    ]));
    assert_eq!(
        problems,
        ["src/runtime/actor.rs and src/runtime/stage/run.rs import each other"]
    );
}

// ---------------------------------------------------------------- the checker

/// One source file: its module path (`src/a/b.rs` is `["a", "b"]`) and
/// its code with comments and string literals blanked out.
#[derive(Debug)]
struct File {
    module: Vec<String>,
    code: String,
}

impl File {
    fn path(&self) -> String {
        format!("src/{}.rs", self.module.join("/"))
    }

    /// The code above its test module (`#[cfg(test)] mod …`), where
    /// `super` is the parent module.
    fn code_before_tests(&self) -> &str {
        let test_module = self.code.match_indices("#[cfg(test)]").find(|(i, m)| {
            let after = self.code[i + m.len()..].trim_start();
            // Whatever its visibility: `pub(super) mod tests` lends a
            // helper to the parent's other children.
            let after = match after.strip_prefix("pub") {
                Some(rest) if rest.starts_with('(') => {
                    rest.split_once(')').map_or(rest, |(_, r)| r).trim_start()
                }
                Some(rest) => rest.trim_start(),
                None => after,
            };
            after.starts_with("mod ")
        });
        test_module.map_or(&self.code, |(i, _)| &self.code[..i])
    }
}

/// Every problem in `files`, one line each, sorted.
fn check(files: &[File]) -> Vec<String> {
    let by_module: BTreeMap<&[String], &File> =
        files.iter().map(|f| (f.module.as_slice(), f)).collect();
    let mut problems = BTreeSet::new();
    let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
    for file in files {
        let Some(own) = layer_of(&file.module[0]) else {
            problems.insert(format!(
                "src/{} is in no layer: add it to LAYERS in tests/layering.rs",
                file.module[0]
            ));
            continue;
        };
        for path in imports(file) {
            let Some(top) = path.first() else { continue };
            match layer_of(top) {
                Some(theirs) if theirs > own => {
                    problems.insert(format!(
                        "{} imports crate::{top} (layer `{}` is above `{}`)",
                        file.path(),
                        LAYERS[theirs].join(", "),
                        LAYERS[own].join(", ")
                    ));
                }
                _ => {}
            }
            if let Some(target) = resolve(&by_module, &path, 0)
                && target.module != file.module
            {
                edges.insert((file.path(), target.path()));
            }
        }
    }
    for (a, b) in &edges {
        if a < b && edges.contains(&(b.clone(), a.clone())) {
            problems.insert(format!("{a} and {b} import each other"));
        }
    }
    problems.into_iter().collect()
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The crate paths `file` names, each from the crate root (`super`
/// resolved against the file's module).
fn imports(file: &File) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (root, code) in [("crate", &*file.code), ("super", file.code_before_tests())] {
        for start in starts_of(code, root) {
            let base = if root == "crate" {
                Vec::new()
            } else {
                file.module[..file.module.len() - 1].to_vec()
            };
            for path in use_tree(&code[start + root.len()..], base) {
                out.push(path.0);
            }
        }
    }
    out
}

/// Where `word` starts as a whole word followed by `::`.
fn starts_of<'c>(code: &'c str, word: &'c str) -> impl Iterator<Item = usize> + 'c {
    code.match_indices(word).filter_map(move |(i, _)| {
        let before = code[..i].chars().next_back();
        let ident = |c: char| c.is_alphanumeric() || c == '_';
        (before.is_none_or(|c| !ident(c)) && code[i + word.len()..].starts_with("::")).then_some(i)
    })
}

/// The paths of a use tree or a path in code, starting at `rest` (just
/// after `crate`, `super` or a group's item), each with the name it binds
/// (its last segment or its `as` alias).
fn use_tree(rest: &str, mut base: Vec<String>) -> Vec<(Vec<String>, String)> {
    let mut s = rest;
    while let Some(after) = s.trim_start().strip_prefix("::") {
        let after = after.trim_start();
        if after.starts_with("super") && !ident_char(after, 5) {
            base.pop();
            s = &after[5..];
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let mut out = Vec::new();
            for item in split_group(group) {
                let item = item.trim();
                if item == "self" {
                    let name = base.last().cloned().unwrap_or_default();
                    out.push((base.clone(), name));
                } else if !item.is_empty() && item != "*" {
                    out.extend(use_tree(&format!("::{item}"), base.clone()));
                }
            }
            return out;
        }
        let len = after
            .char_indices()
            .find(|&(_, c)| !(c.is_alphanumeric() || c == '_'))
            .map_or(after.len(), |(i, _)| i);
        if len == 0 {
            break;
        }
        base.push(after[..len].to_owned());
        s = &after[len..];
    }
    let s = s.trim_start();
    let name = match s.strip_prefix("as ") {
        Some(alias) => alias
            .trim_start()
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .next()
            .unwrap_or("")
            .to_owned(),
        None => base.last().cloned().unwrap_or_default(),
    };
    vec![(base, name)]
}

fn ident_char(s: &str, at: usize) -> bool {
    s[at..]
        .chars()
        .next()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The top-level items of a `{…}` group (its text after the `{`).
fn split_group(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut from) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[from..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// The file `path` (from the crate root) names: the one declaring its
/// longest prefix, or, for a name a folder's root only re-exports, the
/// file that defines it.
fn resolve<'f>(
    by_module: &BTreeMap<&[String], &'f File>,
    path: &[String],
    depth: usize,
) -> Option<&'f File> {
    let len = (1..=path.len())
        .rev()
        .find(|&n| by_module.contains_key(&path[..n]))?;
    let file = by_module[&path[..len]];
    let Some(name) = path.get(len) else {
        return Some(file);
    };
    if depth > 8 {
        return Some(file);
    }
    for (target, bound) in re_exports(file) {
        if target.last().is_some_and(|t| t == "*") {
            let child = &target[..target.len() - 1];
            if let Some(defining) = by_module.get(child)
                && declares(defining, name)
            {
                return Some(defining);
            }
        } else if bound == *name {
            let mut rest = target.clone();
            rest.extend(path[len + 1..].iter().cloned());
            return resolve(by_module, &rest, depth + 1).or(Some(file));
        }
    }
    Some(file)
}

/// `pub use` items of `file`: the full target path of each and the name
/// it binds (a glob's target ends in `*`).
fn re_exports(file: &File) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    for (i, _) in file.code.match_indices("pub use ") {
        let text = &file.code[i + "pub use ".len()..];
        let end = text.find(';').unwrap_or(text.len());
        let text = text[..end].trim();
        let (base, tree) = if let Some(t) = text.strip_prefix("crate") {
            (Vec::new(), t.to_owned())
        } else if let Some(t) = text.strip_prefix("super") {
            (file.module[..file.module.len() - 1].to_vec(), t.to_owned())
        } else {
            (
                file.module.clone(),
                format!("::{}", text.trim_start_matches("self::")),
            )
        };
        if let Some(glob) = tree.strip_suffix("::*") {
            for (path, _) in use_tree(glob, base) {
                let mut path = path;
                path.push("*".to_owned());
                out.push((path, String::new()));
            }
        } else {
            out.extend(use_tree(&tree, base));
        }
    }
    out
}

/// Whether `file` defines an item called `name`.
fn declares(file: &File, name: &str) -> bool {
    [
        "struct", "enum", "fn", "trait", "type", "const", "static", "mod",
    ]
    .iter()
    .any(|kw| {
        let needle = format!("{kw} {name}");
        file.code.match_indices(&needle).any(|(i, _)| {
            !ident_char(&file.code, i + needle.len())
                && file.code[..i]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !c.is_alphanumeric() && c != '_')
        })
    })
}

// ---------------------------------------------------------------- reading

fn read_tree(src: &Path, dir: &Path, out: &mut Vec<File>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_tree(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).expect("under src").to_string_lossy();
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            out.extend(file(&rel, &text));
        }
    }
}

/// The file at `rel` (relative to `src/`, `/`-separated); `None` for the
/// crate roots, which only declare the modules.
fn file(rel: &str, text: &str) -> Option<File> {
    let rel = rel.replace('\\', "/");
    let stem = rel.strip_suffix(".rs")?;
    let mut module: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if module.last().is_some_and(|m| m == "mod") {
        module.pop();
    }
    if module.is_empty() || module == ["lib"] || module == ["main"] {
        return None;
    }
    Some(File {
        module,
        code: strip_comments_and_strings(text),
    })
}

fn tree(files: &[(&str, &str)]) -> Vec<File> {
    files.iter().filter_map(|(p, t)| file(p, t)).collect()
}

/// `text` with line comments and the contents of string and character
/// literals replaced by spaces (so `"crate::x"` names nothing), lines kept.
fn strip_comments_and_strings(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut in_string = false;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            match c {
                '\\' => {
                    out.push_str("  ");
                    i += 2;
                    continue;
                }
                '"' => {
                    in_string = false;
                    out.push('"');
                }
                '\n' => out.push('\n'),
                _ => out.push(' '),
            }
            i += 1;
            continue;
        }
        match c {
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '"' => {
                in_string = true;
                out.push('"');
            }
            // A raw string (`r"…"`, `r#"…"#`): no escapes, ends at the
            // quote followed by as many `#` as it opened with.
            'r' if !chars[..i]
                .last()
                .is_some_and(|&c| c.is_alphanumeric() || c == '_')
                && matches!(chars.get(i + 1), Some('"' | '#')) =>
            {
                let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                if chars.get(i + 1 + hashes) != Some(&'"') {
                    out.push(c);
                    i += 1;
                    continue;
                }
                let closes = |j: usize| {
                    chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#'))
                };
                let end = (i + 2 + hashes..chars.len())
                    .find(|&j| closes(j))
                    .map_or(chars.len(), |j| j + 1 + hashes);
                for &ch in &chars[i..end] {
                    out.push(if ch == '\n' { '\n' } else { ' ' });
                }
                i = end;
                continue;
            }
            // A character literal ('"', '\'', '\n'); a lifetime has no
            // closing quote right after its first character.
            '\'' if chars.get(i + 1) == Some(&'\\') => {
                let close = chars
                    .get(i + 3..)
                    .and_then(|r| r.iter().position(|&c| c == '\''));
                let skip = close.map_or(1, |n| n + 4);
                out.push_str(&" ".repeat(skip));
                i += skip;
                continue;
            }
            '\'' if chars.get(i + 2) == Some(&'\'') => {
                out.push_str("   ");
                i += 3;
                continue;
            }
            _ => out.push(c),
        }
        i += 1;
    }
    out
}
