//! What a resume's scan reads of an audit line (`store::repair`): the
//! few members it needs, borrowed from the line where they have no
//! escapes; every other member is skipped unread. A log of records is
//! read for the same members without its lines ([`super::records::Entries`],
//! [`super::scan_heads`]). Reading each line into a `serde_json::Value` (a map,
//! a `String` per key, every nested value built) was most of a resume's
//! time on a large log: a million-wide run's log has twelve million lines.
//!
//! It reads the members it uses as leniently as the `Value` it replaced:
//! a member of another type than expected reads as absent, and of a
//! member given twice the last counts. A line that is not a JSON object,
//! or not UTF-8 (the scan checks that first), is refused. The members it
//! skips are only checked to be well-formed JSON: a lone surrogate
//! escape, a number out of range or nesting past 128 levels inside one
//! of them no longer refuses the line, as the `Value` did.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The members of an audit line the scan reads.
#[derive(Debug, Default, PartialEq)]
pub struct Head<'a> {
    /// `seq`, when it is an unsigned integer.
    pub seq: Option<u64>,
    pub event: Option<Cow<'a, str>>,
    pub stage_execution_id: Option<Cow<'a, str>>,
    pub stage_id: Option<Cow<'a, str>>,
    pub turn_id: Option<Cow<'a, str>>,
    /// `status` (a `WorkflowExit`'s) or `verdict` (a `StageExited`'s): no
    /// event has both, and of the two given the last counts.
    pub status: Option<Cow<'a, str>>,
}

impl<'a> Head<'a> {
    /// The same members, owning their text.
    pub fn into_owned(self) -> Head<'static> {
        let own = |t: Option<Cow<'a, str>>| t.map(|t| Cow::Owned(t.into_owned()));
        Head {
            seq: self.seq,
            event: own(self.event),
            stage_execution_id: own(self.stage_execution_id),
            stage_id: own(self.stage_id),
            turn_id: own(self.turn_id),
            status: own(self.status),
        }
    }

    /// A line's members, or `None` for a line that is not UTF-8 or not a
    /// JSON object.
    pub fn of_line(line: &'a [u8]) -> Option<Head<'a>> {
        // Checked as UTF-8 whole first: the members skipped are not read
        // closely enough to find bytes that are not.
        std::str::from_utf8(line)
            .ok()
            .and_then(|text| serde_json::from_str(text).ok())
    }
}

impl<'de> Deserialize<'de> for Head<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Head<'de>, D::Error> {
        d.deserialize_map(HeadVisitor)
    }
}

struct HeadVisitor;

impl<'de> Visitor<'de> for HeadVisitor {
    type Value = Head<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an audit event (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head<'de>, A::Error> {
        let mut head = Head::default();
        while let Some(key) = map.next_key::<Key>()? {
            let text = |map: &mut A| map.next_value::<Text<'de>>().map(|t| t.0);
            match key {
                Key::Seq => head.seq = map.next_value::<Unsigned>()?.0,
                Key::Event => head.event = text(&mut map)?,
                Key::StageExecutionId => head.stage_execution_id = text(&mut map)?,
                Key::StageId => head.stage_id = text(&mut map)?,
                Key::TurnId => head.turn_id = text(&mut map)?,
                Key::Status => head.status = text(&mut map)?,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(head)
    }
}

/// A member's name, matched without copying it.
enum Key {
    Seq,
    Event,
    StageExecutionId,
    StageId,
    TurnId,
    Status,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        d.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(match v {
            "seq" => Key::Seq,
            "event" => Key::Event,
            "stageExecutionId" => Key::StageExecutionId,
            "stageId" => Key::StageId,
            "turnId" => Key::TurnId,
            "status" | "verdict" => Key::Status,
            _ => Key::Other,
        })
    }
}

/// Any JSON value: a string is kept (borrowed when it can be), anything
/// else is skipped and reads as `None`.
struct Text<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text<'de>, D::Error> {
        d.deserialize_any(Only(|v: Scalar<'de>| match v {
            Scalar::Str(s) => Some(s),
            Scalar::U64(_) | Scalar::Other => None,
        }))
        .map(Text)
    }
}

/// Any JSON value: an unsigned integer is kept, anything else is skipped
/// and reads as `None`.
struct Unsigned(Option<u64>);

impl<'de> Deserialize<'de> for Unsigned {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Unsigned, D::Error> {
        d.deserialize_any(Only(|v: Scalar<'de>| match v {
            Scalar::U64(n) => Some(n),
            Scalar::Str(_) | Scalar::Other => None,
        }))
        .map(Unsigned)
    }
}

/// What [`Only`] was given.
enum Scalar<'a> {
    Str(Cow<'a, str>),
    U64(u64),
    Other,
}

/// Reads any JSON value whole and keeps what `keep` takes of it.
struct Only<F>(F);

impl<'de, T, F: FnOnce(Scalar<'de>) -> Option<T>> Visitor<'de> for Only<F> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Str(Cow::Borrowed(v))))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Str(Cow::Owned(v.to_owned()))))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Str(Cow::Owned(v))))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::U64(v)))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Other))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Other))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Other))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Other))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok((self.0)(Scalar::Other))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok((self.0)(Scalar::Other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// What the scan read of a line before: the whole `Value`.
    fn as_before(line: &str) -> Option<(Option<u64>, [Option<String>; 5])> {
        let v: Value = serde_json::from_str(line).ok()?;
        let text = |k: &str| v[k].as_str().map(str::to_owned);
        v.is_object().then(|| {
            (
                v["seq"].as_u64(),
                [
                    text("event"),
                    text("stageExecutionId"),
                    text("stageId"),
                    text("turnId"),
                    text("status"),
                ],
            )
        })
    }

    fn as_now(line: &str) -> Option<(Option<u64>, [Option<String>; 5])> {
        let h: Head = serde_json::from_str(line).ok()?;
        let text = |t: Option<Cow<str>>| t.map(Cow::into_owned);
        let [event, exec, stage, turn, status] = [
            h.event,
            h.stage_execution_id,
            h.stage_id,
            h.turn_id,
            h.status,
        ]
        .map(text);
        Some((h.seq, [event, exec, stage, turn, status]))
    }

    #[test]
    fn reads_what_a_value_read_and_no_more() {
        let lines = [
            r#"{"seq":7,"ts":"t","event":"StageEntered","workflowRunId":"r","stageExecutionId":"r/w#1/1","stageId":"w","kind":"llm"}"#,
            r#"{"seq":8,"event":"SessionTurnStart","turnId":"r/turn/2","stages":["a","b"],"x":{"y":[1,{"z":null}]}}"#,
            r#"{"seq":9,"event":"WorkflowExit","status":"ok","event":"StageExited"}"#,
            r#"{"seq":-1,"event":5,"stageId":["w"],"turnId":{"a":1},"status":null}"#,
            r#"{"seq":1.0,"event":"a\"b\u00e9\n"}"#,
            r#"{"seq":"3"}"#,
            r#"{"seq":18446744073709551615,"stageExecutionId":"r/x"}"#,
            r#"{"seq":18446744073709551616}"#,
            r#"{}"#,
            r#"[1,2]"#,
            r#""text""#,
            r#"{"seq":1"#,
            r#"{"seq":1} trailing"#,
            "{\"seq\":1,\"event\":\"\\ud800\"}",
        ];
        for line in lines {
            assert_eq!(as_now(line), as_before(line), "{line}");
        }
    }

    proptest! {
        #[test]
        fn any_json_line_reads_as_a_value_did(v in arbitrary_json()) {
            let line = v.to_string();
            prop_assert_eq!(as_now(&line), as_before(&line));
        }
    }

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("seq".to_owned()),
            Just("event".to_owned()),
            Just("stageExecutionId".to_owned()),
            Just("stageId".to_owned()),
            Just("turnId".to_owned()),
            Just("status".to_owned()),
            "[a-z]{1,3}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            ".{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }
}
