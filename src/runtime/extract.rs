//! `extract_json`: pull JSON out of model text — raw JSON, fenced blocks, or
//! objects/arrays embedded in prose. Several blocks become an array.

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

/// Every balanced `{...}` / `[...]` span that parses as JSON, left to right,
/// skipping spans inside ones already taken.
fn scan_balanced(text: &str) -> Vec<Value> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let Some(mut brackets) = Brackets::new(bytes) else {
        return out;
    };
    let mut i = 0;
    while i < bytes.len() {
        if (bytes[i] == b'{' || bytes[i] == b'[')
            && let Some(end) = brackets.closing(i)
            && !brackets.too_deep(i)
            && let Ok(v) = serde_json::from_str::<Value>(&text[i..=end])
        {
            out.push(v);
            i = end + 1;
            continue;
        }
        i += 1;
    }
    out
}

/// Where a walk is in the string syntax before it reads a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    Outside = 0,
    InString = 1,
    /// In a string, right after a backslash.
    Escaped = 2,
}

/// Unset / none, in the index tables below.
const NONE: u32 = u32::MAX;
/// In `closing`: the bracket is never closed.
const NEVER: u32 = u32::MAX - 1;
/// In `passed`: the walk had no bracket open yet (this was its start).
const EMPTY: u32 = u32::MAX - 1;

/// In `height`: not known (the span was closed by a merged walk).
const UNKNOWN: u8 = u8::MAX;
/// serde_json refuses a 128th level of nesting, so a span nested that deep
/// cannot parse and is skipped: each failed parse builds up to 128 nested
/// values first, which made deep hostile nesting cost ~10 µs per bracket.
const SERDE_DEPTH: u8 = 128;

/// Finds the bracket closing an opening one. A walk starts outside a string
/// at its bracket (so a stray quote in the prose before it does not hide
/// it) and counts brackets outside strings. Walking from every bracket
/// anew was quadratic (1 MiB of `{` took over an hour); here every
/// (position, string state) is read by one walk only: a walk that reaches
/// one an earlier walk passed reads the rest as that walk did, so it takes
/// its closing brackets from the earlier walk's open ones, innermost first.
/// Linear time; 21 bytes of tables per byte of text.
struct Brackets<'t> {
    bytes: &'t [u8],
    /// Per opening bracket: the index closing it, NEVER, or NONE (unknown).
    closing: Vec<u32>,
    /// Per opening bracket: the bracket open below it in the walk that
    /// pushed it (NONE for that walk's start).
    below: Vec<u32>,
    /// Per (position, state): the innermost bracket open in the first walk
    /// that passed there, EMPTY at that walk's start, NONE if none passed.
    passed: Vec<u32>,
    /// Per closed bracket: the levels of nesting of its span (itself is 1),
    /// capped below UNKNOWN.
    height: Vec<u8>,
}

impl<'t> Brackets<'t> {
    /// `None` for a text of 4 GiB or more (the tables hold u32 indexes).
    fn new(bytes: &'t [u8]) -> Option<Self> {
        u32::try_from(bytes.len()).ok().filter(|&n| n < EMPTY)?;
        Some(Self {
            bytes,
            closing: vec![NONE; bytes.len()],
            below: vec![NONE; bytes.len()],
            passed: vec![NONE; 3 * bytes.len()],
            height: vec![UNKNOWN; bytes.len()],
        })
    }

    /// Whether the closed span at `start` is nested deeper than serde_json
    /// parses.
    fn too_deep(&self, start: usize) -> bool {
        let h = self.height[start];
        h != UNKNOWN && h >= SERDE_DEPTH
    }

    /// Index of the bracket closing the one at `start`.
    fn closing(&mut self, start: usize) -> Option<usize> {
        if self.closing[start] == NONE {
            self.walk(start);
        }
        match self.closing[start] {
            NEVER | NONE => None,
            end => Some(end as usize),
        }
    }

    /// Walks from the bracket at `start` until it is closed or the text
    /// ends, recording the closing index of every bracket it opened. (`as
    /// u32`: `new` checked that every index fits.)
    fn walk(&mut self, start: usize) {
        let mut open: Vec<u32> = Vec::new();
        // Per open bracket: the greatest height closed directly inside it.
        let mut inner: Vec<u8> = Vec::new();
        let mut lex = Lex::Outside;
        let mut pos = start;
        'walk: while pos < self.bytes.len() {
            let slot = 3 * pos + lex as usize;
            let mut theirs = self.passed[slot];
            if theirs == EMPTY {
                // An earlier walk started at this bracket: its span is
                // balanced, so go on after it (or never close).
                match self.closing[pos] {
                    NEVER => break,
                    end => {
                        close_inside(&mut inner, self.height[pos]);
                        pos = end as usize + 1;
                        lex = Lex::Outside;
                        continue;
                    }
                }
            }
            if theirs != NONE {
                // The text ahead reads as it did for an earlier walk: the
                // brackets open in it close, innermost first, where ours do.
                loop {
                    let end = self.closing[theirs as usize];
                    if end == NEVER {
                        break 'walk;
                    }
                    let Some(mine) = open.pop() else { return };
                    inner.pop();
                    self.closing[mine as usize] = end;
                    // Its span's nesting lies partly in the other walk.
                    close_inside(&mut inner, UNKNOWN);
                    if open.is_empty() {
                        return;
                    }
                    theirs = self.below[theirs as usize];
                    if theirs == NONE {
                        // That walk ended at `end`: walk on from there.
                        pos = end as usize + 1;
                        lex = Lex::Outside;
                        continue 'walk;
                    }
                }
            }
            self.passed[slot] = open.last().copied().unwrap_or(EMPTY);
            let b = self.bytes[pos];
            lex = match (lex, b) {
                (Lex::Escaped, _) => Lex::InString,
                (Lex::InString, b'\\') => Lex::Escaped,
                (Lex::InString, b'"') => Lex::Outside,
                (Lex::InString, _) => Lex::InString,
                (Lex::Outside, b'"') => Lex::InString,
                (Lex::Outside, b'{' | b'[') => {
                    self.below[pos] = open.last().copied().unwrap_or(NONE);
                    open.push(pos as u32);
                    inner.push(0);
                    Lex::Outside
                }
                (Lex::Outside, b'}' | b']') => {
                    let Some(opened) = open.pop() else { return };
                    self.closing[opened as usize] = pos as u32;
                    let height = match inner.pop() {
                        Some(UNKNOWN) | None => UNKNOWN,
                        Some(h) => (h + 1).min(UNKNOWN - 1),
                    };
                    self.height[opened as usize] = height;
                    close_inside(&mut inner, height);
                    if open.is_empty() {
                        return;
                    }
                    Lex::Outside
                }
                (Lex::Outside, _) => Lex::Outside,
            };
            pos += 1;
        }
        for mine in open {
            self.closing[mine as usize] = NEVER;
        }
    }
}

/// Records a span of `height` closed inside the innermost open bracket.
fn close_inside(inner: &mut [u8], height: u8) {
    if let Some(top) = inner.last_mut() {
        *top = match (*top, height) {
            (UNKNOWN, _) | (_, UNKNOWN) => UNKNOWN,
            (a, b) => a.max(b),
        };
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
    fn spans_nested_past_serde_json_depth_are_skipped_not_misread() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let parsed = |n: usize| serde_json::from_str::<Value>(&deep(n)).ok();
        assert!(parsed(127).is_some() && parsed(128).is_none());
        // 128 levels: the outer span cannot parse, the 127 inside it can.
        assert_eq!(extract_json(&format!("x {} y", deep(128))), parsed(127));
        assert_eq!(extract_json(&format!("x {} y", deep(127))), parsed(127));
    }

    #[test]
    fn nothing_found() {
        assert_eq!(extract_json("no json { here"), None);
        assert_eq!(extract_json(""), None);
    }
}
