//! A `tools/call` result as the model reads it: text content as text,
//! images, audio and embedded resources as typed placeholders with their
//! mime type and size (never silently dropped), structured content as JSON
//! when there is no text, `isError` as a tool error; capped in size.

use serde_json::Value;

use crate::tools::ToolError;

/// Bytes of a result the model gets at most; the rest is cut with a note.
pub const MAX_RESULT_BYTES: usize = 256 * 1024;

/// Bytes of structured content kept (a tool step's `parsed`, which the
/// store keeps and later prompts may quote) at most; larger is left out
/// with a note, the text (itself capped) kept.
pub const MAX_STRUCTURED_BYTES: usize = 1024 * 1024;

/// What a call gave: the text for the model and the structured result (a
/// tool step's `parsed`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub text: String,
    pub structured: Option<Value>,
}

/// Renders a result (its JSON, the wire form), or the tool's own error.
#[cfg(test)]
pub fn render_json(server: &str, tool: &str, result: &Value) -> Result<ToolOutput, ToolError> {
    render_redacted(server, tool, result, &|text| text)
}

/// [`render_json`], with `redact` applied to the text before it is cut
/// to its bound: a secret across the cut would otherwise leave its first
/// part behind, where no redaction after the cut can recognise it.
pub fn render_redacted(
    server: &str,
    tool: &str,
    result: &Value,
    redact: &dyn Fn(String) -> String,
) -> Result<ToolOutput, ToolError> {
    let mut parts: Vec<String> = Vec::new();
    for block in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        parts.push(block_text(block));
    }
    let mut structured = result.get("structuredContent").cloned();
    let text = if parts.is_empty() {
        structured
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
    } else {
        parts.join("\n")
    };
    let mut text = redact(text);

    if text.len() > MAX_RESULT_BYTES {
        let cut = char_floor(&text, MAX_RESULT_BYTES);
        let more = text.len() - cut;
        text.truncate(cut);
        text.push_str(&format!(
            "\n[… {more} more bytes cut: the result was over {MAX_RESULT_BYTES} bytes]"
        ));
    }
    let structured_bytes = structured.as_ref().map_or(0, |v| v.to_string().len());
    if structured_bytes > MAX_STRUCTURED_BYTES {
        structured = None;
        text.push_str(&format!(
            "\n[structured content of {structured_bytes} bytes left out: over {MAX_STRUCTURED_BYTES} bytes]"
        ));
    }
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        return Err(ToolError::terminal(
            "ToolReportedError",
            format!("`{server}__{tool}` reported an error: {text}"),
        ));
    }
    Ok(ToolOutput { text, structured })
}

/// The largest char boundary of `s` at or below `at`.
pub(super) fn char_floor(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn block_text(block: &Value) -> String {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("?");
    let mime = |v: &Value| {
        v.get("mimeType")
            .and_then(Value::as_str)
            .unwrap_or("application/octet-stream")
            .to_owned()
    };
    // base64: three bytes for every four characters.
    let b64_len = |s: Option<&str>| s.map_or(0, |s| s.trim_end_matches('=').len() * 3 / 4);
    match kind {
        "text" => block
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        "image" | "audio" => format!(
            "[{kind}: {}, {} bytes, not shown]",
            mime(block),
            b64_len(block.get("data").and_then(Value::as_str))
        ),
        "resource" => {
            let r = block.get("resource").cloned().unwrap_or(Value::Null);
            let uri = r.get("uri").and_then(Value::as_str).unwrap_or("?");
            let size = match (r.get("text").and_then(Value::as_str), r.get("blob")) {
                (Some(t), _) => t.len(),
                (None, Some(b)) => b64_len(b.as_str()),
                _ => 0,
            };
            format!("[resource: {uri}, {}, {size} bytes, not shown]", mime(&r))
        }
        "resource_link" => format!(
            "[resource link: {}]",
            block.get("uri").and_then(Value::as_str).unwrap_or("?")
        ),
        other => format!("[{other} content, not shown]"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn a_secret_across_the_cut_of_a_long_result_is_redacted_whole() {
        let secret = "ghp_TOPSECRET42";
        let text = format!("{}{secret}", "x".repeat(MAX_RESULT_BYTES - 4));
        let out = render_redacted(
            "s",
            "t",
            &json!({"content": [{"type": "text", "text": text}]}),
            &|t| t.replace(secret, "[redacted]"),
        )
        .unwrap();
        assert!(
            !out.text.contains("ghp_"),
            "the secret's first part is left"
        );
        assert!(out.text.ends_with("bytes]"), "still cut to its bound");
    }

    #[test]
    fn text_images_and_resources_are_shown_or_named_and_is_error_fails() {
        let ok = render_json(
            "s",
            "t",
            &json!({"content": [
                {"type": "text", "text": "hello"},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a", "mimeType": "text/plain", "text": "abc"}}
            ]}),
        )
        .unwrap();
        assert_eq!(
            ok.text,
            "hello\n[image: image/png, 3 bytes, not shown]\n[resource: file:///a, text/plain, 3 bytes, not shown]"
        );
        let big = "x".repeat(MAX_STRUCTURED_BYTES);
        let left_out = render_json(
            "s",
            "t",
            &json!({"content": [{"type": "text", "text": "ok"}], "structuredContent": {"a": big}}),
        )
        .unwrap();
        assert_eq!(left_out.structured, None);
        assert!(
            left_out.text.starts_with("ok\n[structured content of"),
            "{}",
            &left_out.text[..80]
        );
        let structured = render_json(
            "s",
            "t",
            &json!({"content": [], "structuredContent": {"a": 1}}),
        )
        .unwrap();
        assert_eq!(structured.text, r#"{"a":1}"#);
        assert_eq!(structured.structured, Some(json!({"a": 1})));
        let err = render_json(
            "s",
            "t",
            &json!({"content": [{"type": "text", "text": "no"}], "isError": true}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("reported an error: no"), "{err}");
    }

    #[test]
    fn a_huge_result_is_cut_with_a_note() {
        let big = "x".repeat(MAX_RESULT_BYTES + 10);
        let out = render_json(
            "s",
            "t",
            &json!({"content": [{"type": "text", "text": big}]}),
        )
        .unwrap();
        assert!(out.text.len() < MAX_RESULT_BYTES + 200);
        assert!(
            out.text.ends_with("bytes]"),
            "{}",
            &out.text[out.text.len() - 80..]
        );
    }
}
