//! Text made safe for XML and HTML: markup characters as entities, and the
//! characters XML 1.0 forbids replaced, so any stage id, pipeline name or
//! reason from a log yields a well-formed document.

/// Appends `text` escaped for an XML/HTML text node or a quoted attribute.
pub fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Tabs and line ends are allowed; other controls are not.
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
}

/// `text` escaped (see [`push_escaped`]).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    push_escaped(&mut out, text);
    out
}

/// `text` cut to at most `max` characters, with `…` when cut.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::{escape, shorten};

    #[test]
    fn markup_and_forbidden_characters_are_escaped() {
        assert_eq!(escape(r#"a<b&c"d'e>f"#), "a&lt;b&amp;c&quot;d&#39;e&gt;f");
        assert_eq!(escape("bell\u{7}tab\t"), "bell\u{FFFD}tab\t");
    }

    #[test]
    fn shorten_counts_characters_not_bytes() {
        assert_eq!(shorten("ééééé", 5), "ééééé");
        assert_eq!(shorten("éééééé", 5), "éééé…");
    }
}
