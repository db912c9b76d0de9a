//! An event read back from its audit line: a worker's events, relayed to
//! the coordinator's log, keep their head keys and carry their own fields
//! as the JSON text they were written in, so the line written again is the
//! line read — and the coordinator builds no JSON values to relay them.

use std::fmt;
use std::sync::Arc;

use serde::Deserializer;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::vocabulary::{Event, EventName, FieldValue};
use crate::auditlog::clock::parse_rfc3339;
use crate::auditlog::json::write_json_str;

impl Event {
    /// An event read back from its JSON line (a worker's event, relayed
    /// to the coordinator's log): the head keys as they were (`seq`, if
    /// there, is dropped: the new bus numbers it), the other fields kept
    /// as their text, in order. `None` for a line that is not a JSON
    /// object of a known event.
    pub fn from_line(line: &str) -> Option<Event> {
        let mut de = serde_json::Deserializer::from_str(line);
        let event = de.deserialize_map(LineVisitor).ok()?;
        de.end().ok()?;
        event
    }

    /// [`Event::from_line`] for a line that is one value inside a larger
    /// JSON text (a worker's report): read in the same pass as the text
    /// around it. Any JSON value is taken; one that is not an object of a
    /// known event reads as `None`, and so does an object with a value
    /// `from_line` refuses, without failing the text around it.
    pub fn read_embedded<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Event>, D::Error> {
        d.deserialize_any(AnyLine)
    }
}

/// Any JSON value: an object is read as an event line, anything else
/// skipped whole.
struct AnyLine;

impl<'de> Visitor<'de> for AnyLine {
    type Value = Option<Event>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<Event>, A::Error> {
        LineVisitor.visit_map(map)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Event>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<Event>, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Option<Event>, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Option<Event>, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Option<Event>, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Option<Event>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<Event>, E> {
        Ok(None)
    }
}

/// A string borrowed from the line where it has no escapes.
enum Text<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Text<'_> {
    fn as_str(&self) -> &str {
        match self {
            Text::Borrowed(s) => s,
            Text::Owned(s) => s,
        }
    }
}

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text::Borrowed(s))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text::Owned(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text::Owned(s))
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

/// Whether a value's text may hold what JSON's grammar allows and a JSON
/// value cannot: a number out of range (`1e999`, 400 digits: an exponent
/// or a long run of digits, outside strings) or a string with a lone
/// surrogate (`"\ud800"`: any `\u` escape in a string). Taken as text,
/// it would be written into the run's log, which troupe's own readers
/// could then not read (both found by fuzzing); a value that may hold one
/// is read as values once, to be sure. The lines a worker writes have
/// neither, nearly always.
fn needs_reading(text: &str) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    let mut run = 0usize;
    let mut previous = b' ';
    for &b in text.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, b'u') => return true,
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'e' | b'E' if previous.is_ascii_digit() || previous == b'.' => return true,
            _ => {}
        }
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        if run > 300 {
            return true;
        }
        previous = b;
    }
    false
}

struct LineVisitor;

impl<'de> Visitor<'de> for LineVisitor {
    /// `None`: a JSON object, but not an event.
    type Value = Option<Event>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an audit line (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Event>, A::Error> {
        let mut name = None;
        let mut run: Option<Arc<str>> = None;
        let mut ts = None;
        let (mut exec, mut stage, mut tool) = (None, None, None);
        let mut known = true;
        // Room for a usual line's fields: growing by doubling from empty
        // was a tenth of reading one.
        let mut members: Vec<u8> = Vec::with_capacity(256);
        while let Some(key) = map.next_key::<Text<'de>>()? {
            let shared = |t: Text<'de>| Some(Arc::<str>::from(t.as_str()));
            match key.as_str() {
                "seq" => {
                    map.next_value::<IgnoredAny>()?;
                }
                "event" => {
                    let text = map.next_value::<Text<'de>>()?;
                    name = EventName::parse(text.as_str());
                    known &= name.is_some();
                }
                "ts" => ts = parse_rfc3339(map.next_value::<Text<'de>>()?.as_str()),
                "workflowRunId" => run = shared(map.next_value()?),
                "stageExecutionId" => exec = shared(map.next_value()?),
                "stageId" => stage = shared(map.next_value()?),
                "tool" => tool = shared(map.next_value()?),
                _ => {
                    let value: &'de RawValue = map.next_value()?;
                    // Refused, the value makes the line no event; the rest
                    // of the object is still read, so a line inside a
                    // larger text leaves that text readable.
                    known &= push_member(&mut members, &key, value.get());
                }
            }
        }
        let (Some(name), Some(run), true) = (name, run, known) else {
            return Ok(None);
        };
        let mut event = Event::new(name, run);
        if let Some(ts) = ts {
            event.ts = ts;
        }
        event.stage_execution_id = exec;
        event.stage_id = stage;
        event.tool = tool;
        if !members.is_empty() {
            // Keys written by `write_json_str` and values taken whole from
            // a `&str`: the bytes are UTF-8.
            let members = String::from_utf8(members).map_err(de::Error::custom)?;
            event
                .fields
                .push(("", FieldValue::Relayed(members.into_boxed_str())));
        }
        Ok(Some(event))
    }
}

/// Appends one member as a line read back keeps it (after a comma when
/// others precede it): its key, and its value's text on one line.
/// `false` (nothing appended) for a value that may hold what JSON allows
/// and a value cannot (a number out of range, a lone surrogate escape),
/// and that serde_json refuses when read as a value.
fn push_member(members: &mut Vec<u8>, key: &Text<'_>, value: &str) -> bool {
    if !value_reads(value) {
        return false;
    }
    if !members.is_empty() {
        members.push(b',');
    }
    match key {
        // Borrowed from the text only when it had no escapes, and JSON
        // text holds no raw control characters: it is a string's body as
        // it stands.
        Text::Borrowed(name) => {
            members.push(b'"');
            members.extend_from_slice(name.as_bytes());
            members.push(b'"');
        }
        Text::Owned(name) => write_json_str(members, name),
    }
    members.push(b':');
    push_one_line(members, value.as_bytes());
    true
}

/// Whether a raw value's text reads as a value ([`needs_reading`]: read
/// as one only when it may not), read as a value would be (numbers in
/// range, escapes that make characters, nesting to serde_json's limit)
/// without building one: a `Value` takes 24 to 48 times the text of
/// `[{},{},…]`.
fn value_reads(text: &str) -> bool {
    /// Any JSON value, read through and kept nowhere.
    struct Checked;
    impl<'de> de::Deserialize<'de> for Checked {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
            d.deserialize_any(Checked)
        }
    }
    impl<'de> Visitor<'de> for Checked {
        type Value = Checked;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_unit<E>(self) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
            while seq.next_element::<Checked>()?.is_some() {}
            Ok(Checked)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
            while map.next_entry::<Checked, Checked>()?.is_some() {}
            Ok(Checked)
        }
    }
    !needs_reading(text) || serde_json::from_str::<Checked>(text).is_ok()
}

/// A relayed event's members (JSON text without the braces) as a line
/// read back would keep them, checked the same way: each value whole
/// (any depth, as [`RawValue`] reads it) and readable, on one line; none
/// named like a head key, which a line would have taken as its head.
/// Why not, otherwise.
pub(super) fn members_as_read(text: &str) -> Result<String, String> {
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = Result<Vec<u8>, String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("JSON members")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut members = Vec::new();
            while let Some(key) = map.next_key::<Text<'de>>()? {
                let value: &'de RawValue = map.next_value()?;
                if super::encode::HEAD_KEYS.contains(&key.as_str()) {
                    return Ok(Err(format!("members name the head key `{}`", key.as_str())));
                }
                if !push_member(&mut members, &key, value.get()) {
                    return Ok(Err(format!("`{}` holds no readable value", key.as_str())));
                }
            }
            Ok(Ok(members))
        }
    }
    let object = format!("{{{text}}}");
    let mut de = serde_json::Deserializer::from_str(&object);
    let members = de
        .deserialize_map(Members)
        .and_then(|m| de.end().map(|()| m))
        .map_err(|e| format!("no JSON members: {e}"))??;
    // Keys written by `write_json_str` and values taken whole from a
    // `&str`: the bytes are UTF-8.
    String::from_utf8(members).map_err(|e| e.to_string())
}

/// A JSON value's text as a line read back would keep it: one value, any
/// depth, readable, on one line. Why not, otherwise.
pub(super) fn value_as_read(text: &str) -> Result<Vec<u8>, String> {
    let value =
        serde_json::from_str::<&RawValue>(text).map_err(|e| format!("no JSON value: {e}"))?;
    if !value_reads(value.get()) {
        return Err("a JSON value no reader can read".to_owned());
    }
    let mut out = Vec::with_capacity(text.len());
    push_one_line(&mut out, value.get().as_bytes());
    Ok(out)
}

/// A raw JSON value's text, kept on one line: a line break in valid JSON
/// text is whitespace between tokens (inside a string it must be
/// escaped), so it becomes a space. A worker that pretty-printed a nested
/// value would otherwise break the audit line the value is relayed in (and
/// a binary record holding it would not read).
fn push_one_line(out: &mut Vec<u8>, text: &[u8]) {
    if memchr::memchr2(b'\n', b'\r', text).is_none() {
        return out.extend_from_slice(text);
    }
    out.extend(
        text.iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn written(event: &Event, seq: u64) -> String {
        let mut out = Vec::new();
        event.write_json(seq, &mut out);
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn an_event_read_back_from_its_line_writes_the_same_line_with_its_new_seq() {
        let event = Event::new(EventName::StageExited, "run-1")
            .stage("worker", "run-1/worker#3/1")
            .with_static("verdict", "ok")
            .with("capHit", false)
            .with("attemptCount", 2u32)
            .with("reason", "a \"quoted\" reason\n")
            .with(
                "out",
                serde_json::json!({"k\"ey": [1.5, -3, null, "\u{1}"]}),
            );
        let line = written(&event, 5);
        let back = Event::from_line(&line).expect("a known event");
        assert_eq!(written(&back, 7), written(&event, 7));
        let mut expected = event.to_json(5);
        expected["seq"] = 7.into();
        assert_eq!(back.to_json(7), expected);
        assert_eq!(back.field("attemptCount"), Some(Value::from(2)));
        assert_eq!(back.field("verdict"), Some(Value::from("ok")));
        assert_eq!(back.field("missing"), None);
        // A line without `seq` (as a worker may send it) reads the same.
        let unnumbered = line.replacen("\"seq\":5,", "", 1);
        assert_eq!(
            written(&Event::from_line(&unnumbered).expect("known"), 7),
            written(&event, 7)
        );
    }

    #[test]
    fn a_pretty_printed_value_is_relayed_on_one_line_with_the_same_value() {
        let line = "{\"event\":\"ToolInvocationSucceeded\",\"workflowRunId\":\"r\",\"x\":[1,\n  2],\r\n\"y\":{\"a\":\"b\\nc\"}}";
        let event = Event::from_line(line).expect("an event");
        let again = written(&event, 5);
        assert!(!again.contains(['\n', '\r']), "{again}");
        let value: Value = serde_json::from_str(&again).expect("JSON");
        assert_eq!(value["x"], serde_json::json!([1, 2]));
        assert_eq!(value["y"]["a"], "b\nc");
    }

    #[test]
    fn one_relayed_field_reads_as_the_whole_members_would_give_it() {
        use super::super::vocabulary::{relayed_field, relayed_fields};
        let members = concat!(
            r#""verdict":"ok","out":{"k\"ey":[1.5,-3,null,"\u0001"]},"#,
            r#""a\u0062c":"escaped name","twice":1,"n":12e2,"twice":2"#
        );
        let all = relayed_fields(members);
        assert_eq!(all.len(), 5);
        for key in ["verdict", "out", "abc", "twice", "n", "missing", ""] {
            assert_eq!(relayed_field(members, key), all.get(key).cloned(), "{key}");
        }
        for broken in ["", "\"x\":", "\"x\":1}{", "\"x\":1 trailing"] {
            assert_eq!(
                relayed_field(broken, "x"),
                relayed_fields(broken).remove("x"),
                "{broken}"
            );
        }
    }

    #[test]
    fn only_what_may_not_fit_a_json_value_is_read_twice() {
        for plain in [
            "\"01a2173f-7d20-7668-add4-3d73ef83f622\"",
            "{\"usage\":{\"promptTokens\":12,\"cost\":0.25},\"id\":\"x1e5\"}",
            "[\"a \\\"quoted\\\" 9e9\", -3, true, null]",
        ] {
            assert!(!needs_reading(plain), "{plain}");
        }
        for risky in ["1e999", "[0.5E3]", "\"\\ud800\"", &"9".repeat(301)] {
            assert!(needs_reading(risky), "{risky}");
        }
    }

    #[test]
    fn a_field_value_stays_small() {
        // Every field of every event is this large (an event's list holds
        // six); an inline `serde_json::Value` made it 80 bytes.
        assert!(std::mem::size_of::<FieldValue>() <= 32);
        let n = Event::new(EventName::StageEntered, "r")
            .with("n", 3u32)
            .with("neg", -3i64)
            .with("flag", true)
            .with("value", serde_json::json!(2.5))
            .with("list", vec![Value::from(1)]);
        let mut line = Vec::new();
        n.write_json(1, &mut line);
        let line = String::from_utf8(line).unwrap();
        assert!(
            line.ends_with(r#""n":3,"neg":-3,"flag":true,"value":2.5,"list":[1]}"#),
            "{line}"
        );
        assert_eq!(n.field("value"), Some(serde_json::json!(2.5)));
        assert_eq!(n.field("flag"), Some(Value::Bool(true)));
    }

    #[test]
    fn field_names_with_and_without_escapes_are_written_back_as_json() {
        let line = r#"{"event":"StageEntered","workflowRunId":"r","a\u0062c":1,"k\"ey":2,"plain":3,"é\n":4}"#;
        let back = Event::from_line(line).expect("known");
        let Some(FieldValue::Relayed(members)) = back.field_value("") else {
            panic!("relayed members");
        };
        assert_eq!(&**members, r#""abc":1,"k\"ey":2,"plain":3,"é\n":4"#);
    }

    #[test]
    fn escaped_heads_and_an_event_with_no_fields_read_back() {
        let event = Event::new(EventName::StageEntered, "run \"1\"").stage("a\\b", "x\ty");
        let back = Event::from_line(&written(&event, 1)).expect("known");
        assert_eq!(written(&back, 2), written(&event, 2));
        assert_eq!(back.fields().count(), 0);
    }

    #[test]
    fn what_is_not_an_event_line_is_none_never_a_panic() {
        for line in [
            "",
            "[]",
            "{",
            "{\"event\":\"Nope\",\"workflowRunId\":\"r\"}",
            "{\"event\":\"StageEntered\"}",
            "{\"event\":1,\"workflowRunId\":\"r\"}",
            "{\"event\":\"StageEntered\",\"workflowRunId\":\"r\"} trailing",
            "{\"event\":\"StageEntered\",\"workflowRunId\":\"r\",\"x\":}",
            // JSON allows these numbers; a JSON value cannot hold them, so
            // the log they were written into could not be read back (found
            // by fuzzing).
            "{\"event\":\"StageEntered\",\"workflowRunId\":\"r\",\"x\":111111e000000002212}",
            "{\"event\":\"StageEntered\",\"workflowRunId\":\"r\",\"x\":[{\"y\":-1E999}]}",
            "{\"event\":\"StageEntered\",\"workflowRunId\":\"r\",\"x\":{\"y\":\"a\\uda06\\uda0d\"}}",
        ] {
            assert!(Event::from_line(line).is_none(), "{line}");
        }
        assert!(Event::from_line("{\"event\":\"StageEntered\",\"workflowRunId\":\"r\"}").is_some());
        // Exponents and long numbers that fit are kept as they were.
        let fits = "{\"event\":\"StageEntered\",\"workflowRunId\":\"r\",\"x\":[1.5e300,2E-5,\"9e9999 in a string\"]}";
        let event = Event::from_line(fits).expect("it fits");
        let mut line = Vec::new();
        event.write_json(1, &mut line);
        assert!(
            String::from_utf8(line)
                .expect("UTF-8")
                .ends_with("\"x\":[1.5e300,2E-5,\"9e9999 in a string\"]}")
        );
        for name in EventName::ALL {
            assert_eq!(EventName::parse(name.as_str()), Some(name));
        }
        assert_eq!(EventName::parse("stageEntered"), None);
    }
}
