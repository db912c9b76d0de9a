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

fn scan_balanced(text: &str) -> Vec<Value> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if (bytes[i] == b'{' || bytes[i] == b'[')
            && let Some(end) = matching_end(bytes, i)
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

/// Index of the bracket closing the one at `start`, honouring strings.
fn matching_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
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
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
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
