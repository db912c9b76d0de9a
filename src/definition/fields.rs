//! Typed reads of YAML fields that record a located diagnostic instead of
//! failing, so one pass over a file reports every problem in it.

use std::path::{Path, PathBuf};

use super::yaml::{Node, Value};
use crate::error::{Diagnostic, Pos, ValidationCode};

/// Reads fields of one file, collecting diagnostics.
#[derive(Debug)]
pub struct FieldReader<'d> {
    pub file: PathBuf,
    /// Lines before the YAML document in the file (frontmatter starts at 2).
    pub line_offset: u64,
    /// The code used for shape errors (wrong type, missing field).
    pub code: ValidationCode,
    pub diags: &'d mut Vec<Diagnostic>,
}

impl<'d> FieldReader<'d> {
    pub fn new(
        file: &Path,
        line_offset: u64,
        code: ValidationCode,
        diags: &'d mut Vec<Diagnostic>,
    ) -> Self {
        Self {
            file: file.to_owned(),
            line_offset,
            code,
            diags,
        }
    }

    pub fn pos(&self, pos: Pos) -> Pos {
        pos.offset_lines(self.line_offset)
    }

    /// Records a diagnostic located in this file.
    pub fn report(
        &mut self,
        code: ValidationCode,
        pos: Pos,
        field: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        let pos = self.pos(pos);
        self.report_abs(code, pos, field, message, hint);
    }

    /// Records a diagnostic at a position already absolute in the file.
    pub fn report_abs(
        &mut self,
        code: ValidationCode,
        pos: Pos,
        field: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        let mut d = Diagnostic::new(code, message).file(&self.file).at(pos);
        if !field.is_empty() {
            d = d.field(field);
        }
        let hint = hint.into();
        if !hint.is_empty() {
            d = d.hint(hint);
        }
        self.diags.push(d);
    }

    /// A shape error with the reader's default code.
    pub fn shape(
        &mut self,
        pos: Pos,
        field: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        let code = self.code;
        self.report(code, pos, field, message, hint);
    }

    /// A required key of `map`; reports `missing required field` when absent.
    pub fn required<'n>(&mut self, map: &'n Node, key: &str, hint: &str) -> Option<&'n Node> {
        self.required_at(map, key, key, hint)
    }

    /// [`FieldReader::required`], reported under the full `field` path
    /// (e.g. `hooks[2].at`).
    pub fn required_at<'n>(
        &mut self,
        map: &'n Node,
        key: &str,
        field: &str,
        hint: &str,
    ) -> Option<&'n Node> {
        match map.get(key) {
            Some(Node {
                value: Value::Null,
                pos,
            }) => {
                self.shape(
                    *pos,
                    field,
                    format!("required field `{key}` is empty"),
                    hint,
                );
                None
            }
            Some(node) => Some(node),
            None => {
                self.shape(
                    map.pos,
                    field,
                    format!("missing required field `{key}`"),
                    hint,
                );
                None
            }
        }
    }

    /// An optional key: absent or explicit null both read as `None`.
    pub fn optional<'n>(&mut self, map: &'n Node, key: &str) -> Option<&'n Node> {
        map.get(key).filter(|n| n.value != Value::Null)
    }

    pub fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            other => {
                self.shape(
                    node.pos,
                    field,
                    format!("`{field}` must be a string, found {}", other.kind()),
                    "",
                );
                None
            }
        }
    }

    /// An integer in `min..=max`.
    pub fn int(&mut self, node: &Node, field: &str, min: i64, max: i64) -> Option<i64> {
        match &node.value {
            Value::Int(i) if (min..=max).contains(i) => Some(*i),
            Value::Int(i) => {
                self.shape(
                    node.pos,
                    field,
                    format!("`{field}` must be between {min} and {max}, found {i}"),
                    "",
                );
                None
            }
            other => {
                self.shape(
                    node.pos,
                    field,
                    format!("`{field}` must be an integer, found {}", other.kind()),
                    "",
                );
                None
            }
        }
    }

    pub fn bool(&mut self, node: &Node, field: &str) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            other => {
                self.shape(
                    node.pos,
                    field,
                    format!("`{field}` must be true or false, found {}", other.kind()),
                    "",
                );
                None
            }
        }
    }

    /// A list of strings with their positions.
    pub fn string_list(&mut self, node: &Node, field: &str) -> Option<Vec<(String, Pos)>> {
        let Some(items) = node.as_seq() else {
            self.shape(
                node.pos,
                field,
                format!("`{field}` must be a list, found {}", node.value.kind()),
                "",
            );
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match &item.value {
                Value::Str(s) => out.push((s.clone(), item.pos)),
                other => {
                    ok = false;
                    self.shape(
                        item.pos,
                        &format!("{field}[{i}]"),
                        format!("`{field}[{i}]` must be a string, found {}", other.kind()),
                        "",
                    );
                }
            }
        }
        ok.then_some(out)
    }

    pub fn map<'n>(
        &mut self,
        node: &'n Node,
        field: &str,
    ) -> Option<&'n [(super::yaml::Key, Node)]> {
        match node.as_map() {
            Some(m) => Some(m),
            None => {
                self.shape(
                    node.pos,
                    field,
                    format!("`{field}` must be a mapping, found {}", node.value.kind()),
                    "",
                );
                None
            }
        }
    }
}

impl FieldReader<'_> {
    /// Refuses every key of the mapping `node` that is not in `known`, each
    /// with a located `Validation/UnknownKey` and, when a known key is
    /// close, a "did you mean". A key troupe does not read must not be
    /// silently ignored: `cap: 2` in the wrong place would look like a cap.
    /// `field` is the mapping's path (`""` at the root).
    pub fn known_keys(&mut self, node: &Node, field: &str, known: &[&str]) {
        let Some(entries) = node.as_map() else {
            return;
        };
        for (key, _) in entries {
            if !known.contains(&key.name.as_str()) {
                self.unknown_key(key, field, known);
            }
        }
    }

    /// Refuses one key of the mapping at `field` (see [`Self::known_keys`]).
    pub fn unknown_key(&mut self, key: &super::yaml::Key, field: &str, known: &[&str]) {
        let (path, place) = if field.is_empty() {
            (key.name.clone(), "pipeline.yaml's top level".to_owned())
        } else {
            (format!("{field}.{}", key.name), format!("`{field}`"))
        };
        let takes = format!("{place} takes {}", known.join(", "));
        let hint = match did_you_mean(&key.name, known) {
            Some(close) => format!("did you mean `{close}`? {takes}"),
            None => takes,
        };
        self.report(
            ValidationCode::UnknownKey,
            key.pos,
            &path,
            format!("unknown key `{}` in {place}", key.name),
            hint,
        );
    }
}

/// The known name closest to `name` (case-insensitive edit distance of at
/// most a third of its length, at least 1), if any.
pub fn did_you_mean<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = name.to_ascii_lowercase();
    let limit = (lower.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance with adjacent transpositions (optimal string
/// alignment), over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Rows i-2, i-1 and i of the distance table.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// kebab-case: lowercase ASCII letters and digits in dash-separated words.
pub fn is_kebab(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.split('-').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// A name usable as a tool/function name by model APIs.
pub fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kebab_ids() {
        for ok in ["plan", "build-a", "a1-b2", "x"] {
            assert!(is_kebab(ok), "{ok}");
        }
        for bad in ["", "Plan", "build_a", "-a", "a-", "a--b", "a b", "é"] {
            assert!(!is_kebab(bad), "{bad}");
        }
    }

    #[test]
    fn did_you_mean_finds_typos_and_case_slips_only() {
        let keys = ["parallelCap", "maxVisits", "stages", "next"];
        assert_eq!(did_you_mean("parallelcap", &keys), Some("parallelCap"));
        assert_eq!(did_you_mean("maxVisit", &keys), Some("maxVisits"));
        assert_eq!(did_you_mean("stgaes", &keys), Some("stages"));
        assert_eq!(did_you_mean("cap", &keys), None);
        assert_eq!(did_you_mean("nxt", &keys), Some("next"));
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("ab", "ba"), 1);
    }

    #[test]
    fn tool_names() {
        assert!(is_tool_name("submit_plan"));
        assert!(!is_tool_name("submit plan"));
        assert!(!is_tool_name(""));
    }
}
