//! The text of an audit line: JSON written straight into bytes, shared by
//! the runtime's event encoder (`Event::write_json`) and the log's reader,
//! which writes the same line from a binary record ([`super::records`]).
//! One writer for both is what makes `troupe runs export` give back, byte
//! for byte, the line the event would have been.

use super::clock::{RFC3339_LEN, rfc3339_micros_into};

/// A string a line holds: text to write as a JSON string, or one written
/// so already.
pub(crate) trait JsonStr: Copy {
    fn write_to(self, out: &mut Vec<u8>);
}

impl JsonStr for &str {
    fn write_to(self, out: &mut Vec<u8>) {
        write_json_str(out, self);
    }
}

/// A string the log's reader has checked for characters to escape, once,
/// when a record defined it: it writes every reference to one without
/// checking it again (that check, at every reference, was a quarter of
/// `troupe runs export`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Checked<'a> {
    /// Needs no escaping: kept with its quotes, written as it is.
    Quoted(&'a [u8]),
    /// Needs escaping: the text, escaped as it is written.
    Escaped(&'a str),
}

impl JsonStr for Checked<'_> {
    fn write_to(self, out: &mut Vec<u8>) {
        match self {
            Checked::Quoted(quoted) => out.extend_from_slice(quoted),
            Checked::Escaped(text) => write_json_str(out, text),
        }
    }
}

/// Whether `s` is written as a JSON string as it is, between quotes.
pub(crate) fn clean(s: &str) -> bool {
    !needs_escape(s.as_bytes())
}

/// What every line begins with: `seq`, `ts`, `event`, `workflowRunId`,
/// then `stageExecutionId`, `stageId` and `tool` where the event has
/// them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head<S> {
    pub seq: u64,
    /// Microseconds since 1970 (`ts`).
    pub micros: u64,
    pub name: S,
    pub run: S,
    pub exec: Option<S>,
    pub stage: Option<S>,
    pub tool: Option<S>,
}

/// Opens a line with its head keys: `{"seq":…` through `tool`, without
/// the closing brace (the event's own fields follow, each
/// [`write_key`] then its value).
pub(crate) fn write_head<S: JsonStr>(out: &mut Vec<u8>, head: &Head<S>) {
    let mut ts_buf = [0u8; RFC3339_LEN];
    out.extend_from_slice(b"{\"seq\":");
    write_u64(out, head.seq);
    out.extend_from_slice(b",\"ts\":\"");
    out.extend_from_slice(rfc3339_micros_into(head.micros, &mut ts_buf).as_bytes());
    out.extend_from_slice(b"\",\"event\":");
    head.name.write_to(out);
    out.extend_from_slice(b",\"workflowRunId\":");
    head.run.write_to(out);
    if let Some(v) = head.exec {
        out.extend_from_slice(b",\"stageExecutionId\":");
        v.write_to(out);
    }
    if let Some(v) = head.stage {
        out.extend_from_slice(b",\"stageId\":");
        v.write_to(out);
    }
    if let Some(v) = head.tool {
        out.extend_from_slice(b",\"tool\":");
        v.write_to(out);
    }
}

/// A field's key, after the members before it: `,"key":`.
pub(crate) fn write_key(out: &mut Vec<u8>, key: impl JsonStr) {
    out.push(b',');
    key.write_to(out);
    out.push(b':');
}

/// The members of a relayed event (a worker's fields, kept as the text
/// they were written in), after the members before them.
pub(crate) fn write_members(out: &mut Vec<u8>, members: &[u8]) {
    if !members.is_empty() {
        out.push(b',');
        out.extend_from_slice(members);
    }
}

/// A stage's usage as serde writes `Usage` (camelCase names, in order).
pub(crate) fn write_usage(out: &mut Vec<u8>, prompt: u64, completion: u64, requests: u64) {
    out.extend_from_slice(br#"{"promptTokens":"#);
    write_u64(out, prompt);
    out.extend_from_slice(br#","completionTokens":"#);
    write_u64(out, completion);
    out.extend_from_slice(br#","requests":"#);
    write_u64(out, requests);
    out.push(b'}');
}

/// The name serde_json's `raw_value` protocol gives a raw value: its
/// serializer writes a struct of this name as its one field's text, and
/// a `Value` reads an object whose first key it is as the JSON that
/// key's string holds.
pub(crate) const RAW_VALUE: &str = "$serde_json::private::RawValue";

/// A JSON string: copied whole when nothing in it needs escaping, else
/// escaped by serde_json (which escapes `"`, `\\` and bytes below 0x20).
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        // Writing into a Vec cannot fail, and a &str always serializes.
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// How long `s` is written as a JSON string's body: `"` and `\\` take
/// two bytes, a control character at most six (`\u00XX`).
pub(crate) fn escaped_len(s: &str) -> usize {
    if !needs_escape(s.as_bytes()) {
        return s.len();
    }
    s.len()
        + s.bytes()
            .map(|b| match b {
                b'"' | b'\\' => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// Whether any byte is `"`, `\\` or below 0x20, eight bytes at a time
/// (the classic has-zero-byte / has-less-than word tricks, exact as a
/// yes/no answer).
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH != 0;
    let word_needs = |v: u64| {
        v.wrapping_sub(ONES * 0x20) & !v & HIGH != 0
            || has_zero(v ^ (ONES * u64::from(b'"')))
            || has_zero(v ^ (ONES * u64::from(b'\\')))
    };
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        if word_needs(u64::from_ne_bytes(w)) {
            return true;
        }
    }
    // The tail as one word padded with spaces, which need no escaping.
    let rest = words.remainder();
    let mut w = [b' '; 8];
    w[..rest.len()].copy_from_slice(rest);
    !rest.is_empty() && word_needs(u64::from_ne_bytes(w))
}

/// Decimal digits of `n`, without `fmt`.
pub(crate) fn write_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// The decimal digits of `n` appended to `out`, without `fmt` (ids and
/// tool-call ids are built from them a few times a sibling).
pub(crate) fn push_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checked_string_is_written_as_an_unchecked_one() {
        for text in [
            "",
            "plain",
            "01a2/worker#7/1",
            "q\"uote",
            "back\\slash",
            "nl\n",
            "\u{1}",
            "é✓\u{7f}",
        ] {
            let (mut checked, mut unchecked) = (Vec::new(), Vec::new());
            write_json_str(&mut unchecked, text);
            let as_checked = if clean(text) {
                Checked::Quoted(&unchecked)
            } else {
                Checked::Escaped(text)
            };
            as_checked.write_to(&mut checked);
            assert_eq!(checked, unchecked, "{text:?}");
            assert_eq!(clean(text), unchecked.len() == text.len() + 2, "{text:?}");
        }
    }

    #[test]
    fn numbers_read_as_format_writes_them() {
        for n in [
            0,
            9,
            10,
            99,
            100,
            4_999,
            65_536,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut bytes = Vec::new();
            write_u64(&mut bytes, n);
            let mut text = String::from("x");
            push_decimal(&mut text, n);
            assert_eq!((bytes, text), (n.to_string().into_bytes(), format!("x{n}")));
        }
    }

    #[test]
    fn needs_escape_finds_every_byte_that_needs_it_at_every_offset() {
        for len in 0..20 {
            let clean = "a".repeat(len);
            assert!(!needs_escape(clean.as_bytes()), "{len}");
            assert!(!needs_escape("é ~\u{7f}ü !#[]{}".as_bytes()));
            for at in 0..len {
                for bad in (0u8..0x20).chain([b'"', b'\\']) {
                    let mut bytes = clean.clone().into_bytes();
                    bytes[at] = bad;
                    assert!(needs_escape(&bytes), "byte {bad:#x} at {at} of {len}");
                }
                // Next to the bad bytes, but fine.
                for fine in [0x20u8, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xff] {
                    let mut bytes = clean.clone().into_bytes();
                    bytes[at] = fine;
                    assert!(!needs_escape(&bytes), "byte {fine:#x} at {at} of {len}");
                }
            }
        }
    }
}
