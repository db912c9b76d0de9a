//! `extract_json`: pull JSON out of model text — raw JSON, fenced blocks, or
//! objects/arrays embedded in prose. Several blocks become an array.

use std::collections::HashMap;

use serde_json::Value;

/// Every JSON value found in `text`, or `None` when there is none.
pub fn extract_json(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed)
        && (v.is_object() || v.is_array())
    {
        return Some(v);
    }
    let mut found = Vec::new();
    let mut rest = text;
    // Fenced blocks first: ```json ... ``` or ``` ... ```.
    let mut outside = String::new();
    while let Some(start) = rest.find("```") {
        outside.push_str(&rest[..start]);
        let after = &rest[start + 3..];
        let body_start = after.find('\n').map_or(after.len(), |n| n + 1);
        let Some(end) = after[body_start..].find("```") else {
            outside.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let body = &after[body_start..body_start + end];
        if let Ok(v) = serde_json::from_str::<Value>(body.trim()) {
            found.push(v);
        }
        rest = &after[body_start + end + 3..];
    }
    outside.push_str(rest);
    // Then balanced {...} / [...] spans in the remaining prose.
    found.extend(scan_balanced(&outside));
    match found.len() {
        0 => None,
        1 => found.pop(),
        _ => Some(Value::Array(found)),
    }
}

/// Work budget of the span scan, in bytes examined (brackets walked plus
/// spans handed to the JSON parser) per byte of text. Prose with a few JSON
/// blocks uses about 2; serde_json's nesting limit (128) keeps even deep
/// spans that fail to parse near 130. Past the budget the scan stops with
/// what it found: hostile text costs time linear in its length, never
/// quadratic (1 MiB of `{` took over an hour before).
const WORK_PER_BYTE: usize = 256;

fn scan_balanced(text: &str) -> Vec<Value> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut brackets = Brackets {
        bytes,
        closing: HashMap::new(),
        budget: WORK_PER_BYTE.saturating_mul(bytes.len()),
    };
    let mut i = 0;
    while i < bytes.len() && brackets.budget > 0 {
        if (bytes[i] == b'{' || bytes[i] == b'[')
            && let Some(end) = brackets.closing(i)
        {
            brackets.budget = brackets.budget.saturating_sub(end + 1 - i);
            if let Ok(v) = serde_json::from_str::<Value>(&text[i..=end]) {
                out.push(v);
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// Finds the bracket closing an opening one, honouring strings, and
/// remembers every pair it walks past.
struct Brackets<'t> {
    bytes: &'t [u8],
    /// Closing index (or none) of each opening bracket a walk has passed
    /// outside a string. A walk outside a string at a bracket reads the
    /// rest of the text exactly as a walk starting there would, so its
    /// answer is that walk's: no bracket is walked from twice, and a run of
    /// thousands of unclosed `{` costs one walk, not one each.
    closing: HashMap<usize, Option<usize>>,
    /// Work left, in bytes.
    budget: usize,
}

impl Brackets<'_> {
    /// Index of the bracket closing the one at `start`.
    fn closing(&mut self, start: usize) -> Option<usize> {
        if let Some(&known) = self.closing.get(&start) {
            return known;
        }
        let mut open = Vec::new();
        let mut in_string = false;
        let mut escaped = false;
        for (i, &b) in self.bytes.iter().enumerate().skip(start) {
            if in_string {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => open.push(i),
                b'}' | b']' => {
                    // `start` is pushed first and the walk ends when it is
                    // closed, so `open` is never empty here.
                    let Some(opened) = open.pop() else { break };
                    self.closing.insert(opened, Some(i));
                    if open.is_empty() {
                        self.budget = self.budget.saturating_sub(i + 1 - start);
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        self.budget = self.budget.saturating_sub(self.bytes.len() - start);
        for opened in open {
            self.closing.insert(opened, None);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn raw_json() {
        assert_eq!(extract_json(" {\"a\": 1} "), Some(json!({"a": 1})));
    }

    #[test]
    fn fence_and_a_second_raw_object_make_an_array() {
        let text = "Here:\n```json\n{\"score\": 8}\n```\nand also {\"category\": \"bug\"} done";
        assert_eq!(
            extract_json(text),
            Some(json!([{"score": 8}, {"category": "bug"}]))
        );
    }

    #[test]
    fn braces_inside_strings_do_not_confuse_the_scan() {
        assert_eq!(
            extract_json("x {\"a\": \"}{\"} y"),
            Some(json!({"a": "}{"}))
        );
    }

    #[test]
    fn nothing_found() {
        assert_eq!(extract_json("no json { here"), None);
        assert_eq!(extract_json(""), None);
    }
}
