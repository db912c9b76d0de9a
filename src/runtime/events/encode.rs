//! An event as one audit line: a JSON object with `seq`, `ts`, `event`,
//! `workflowRunId`, then `stageExecutionId`, `stageId`, `tool` where they
//! apply, then the event's own fields. `to_json` builds it as a value;
//! `write_json` writes the same bytes straight into a buffer.

use serde_json::{Map, Value};

use super::vocabulary::{Event, FieldValue, relayed_fields};
use crate::auditlog::clock::{RFC3339_LEN, micros_since_epoch, rfc3339, rfc3339_into};
use crate::auditlog::json::{
    Head as LineHead, write_head, write_json_str, write_key, write_members, write_u64, write_usage,
};
use crate::auditlog::records::{EventHead, RecordWriter};

/// The keys `to_json` puts first, in order.
pub(super) const HEAD_KEYS: [&str; 7] = [
    "seq",
    "ts",
    "event",
    "workflowRunId",
    "stageExecutionId",
    "stageId",
    "tool",
];

/// Whether `key` is one of [`HEAD_KEYS`]: by its length first, which
/// tells all seven apart, so that a field named otherwise (nearly every
/// one) is told by one comparison, not seven. The audit writer asks this
/// of every field of every event.
fn is_head_key(key: &str) -> bool {
    match key.len() {
        2 => key == "ts",
        3 => key == "seq",
        4 => key == "tool",
        5 => key == "event",
        7 => key == "stageId",
        13 => key == "workflowRunId",
        16 => key == "stageExecutionId",
        _ => false,
    }
}

impl Event {
    /// The JSON object of one audit line, keys in contract order.
    pub fn to_json(&self, seq: u64) -> Value {
        let mut obj = Map::with_capacity(self.fields.len() + 7);
        obj.insert("seq".into(), Value::from(seq));
        obj.insert("ts".into(), Value::String(rfc3339(self.ts)));
        obj.insert("event".into(), Value::String(self.name.as_str().to_owned()));
        obj.insert("workflowRunId".into(), Value::from(&*self.workflow_run_id));
        if let Some(v) = &self.stage_execution_id {
            obj.insert("stageExecutionId".into(), Value::from(&**v));
        }
        if let Some(v) = &self.stage_id {
            obj.insert("stageId".into(), Value::from(&**v));
        }
        if let Some(v) = &self.tool {
            obj.insert("tool".into(), Value::from(&**v));
        }
        for (k, v) in &self.fields {
            match (k.is_empty(), v) {
                (true, FieldValue::Relayed(members)) => {
                    obj.extend(relayed_fields(members));
                }
                _ => {
                    obj.insert((*k).to_owned(), v.to_value());
                }
            }
        }
        Value::Object(obj)
    }

    /// Appends the same JSON object as `to_json(seq)` (no newline), byte
    /// for byte, without building it first: no cloned strings, no map,
    /// and strings that need no escaping (ids, names, timestamps: nearly
    /// all of them) are copied whole. The audit writer calls this for
    /// every line of a run (BENCHMARKS.md).
    pub fn write_json(&self, seq: u64, out: &mut Vec<u8>) {
        if self.has_head_key_fields() {
            return self.write_json_with_clashes(seq, out);
        }
        write_head(
            out,
            &LineHead {
                seq,
                micros: micros_since_epoch(self.ts),
                name: self.name.as_str(),
                run: &self.workflow_run_id,
                exec: self.stage_execution_id.as_deref(),
                stage: self.stage_id.as_deref(),
                tool: self.tool.as_deref(),
            },
        );
        for (k, v) in &self.fields {
            if let (true, FieldValue::Relayed(members)) = (k.is_empty(), v) {
                // Relayed fields (`from_line`), as they were written.
                write_members(out, members.as_bytes());
                continue;
            }
            write_key(out, *k);
            v.write_json(out);
        }
        out.push(b'}');
    }

    /// The event as a binary record of the log ([`crate::auditlog::records`]),
    /// which the log's reader writes back as exactly the line
    /// [`Event::write_json`] writes. An event with a field named like a
    /// head key is kept as that line.
    pub fn write_record(&self, seq: u64, w: &mut RecordWriter, out: &mut Vec<u8>) {
        if self.has_head_key_fields() {
            return w.line(out, |line| self.write_json_with_clashes(seq, line));
        }
        w.event(
            out,
            &EventHead {
                seq,
                micros: micros_since_epoch(self.ts),
                name: self.name.as_str(),
                run: &self.workflow_run_id,
                exec: self.stage_execution_id.as_ref(),
                stage: self.stage_id.as_ref(),
                tool: self.tool.as_ref(),
                fields: self.fields.len(),
            },
        );
        for (k, v) in &self.fields {
            match v {
                FieldValue::Static(s) => w.field_static(out, k, s),
                FieldValue::Shared(s) => w.field_shared(out, k, s),
                FieldValue::Text(s) => w.field_text(out, k, s),
                FieldValue::Usage(u) => {
                    w.field_usage(out, k, [u.prompt_tokens, u.completion_tokens, u.requests])
                }
                FieldValue::Number(n) => match n.as_u64() {
                    Some(n) => w.field_u64(out, k, n),
                    None => w.field_json(out, k, |o| write_json_number(o, n)),
                },
                FieldValue::Bool(b) => w.field_bool(out, k, *b),
                FieldValue::Json(value) => match &**value {
                    Value::String(s) => w.field_text(out, k, s),
                    other => w.field_json(out, k, |o| write_json_value(o, other)),
                },
                FieldValue::Relayed(members) if k.is_empty() => w.members(out, members),
                FieldValue::Calls(_) | FieldValue::Relayed(_) => {
                    w.field_json(out, k, |o| v.write_json(o));
                }
            }
        }
    }

    /// A field is named like a head key (`seq`, `tool`, …): its line is
    /// written by [`Event::write_json_with_clashes`].
    fn has_head_key_fields(&self) -> bool {
        self.fields.iter().any(|(k, _)| is_head_key(k))
    }

    /// [`Event::write_json`] for an event with a field named like a head
    /// key: it takes the head key's place when that key is written, and
    /// its own place in field order when it is not.
    fn write_json_with_clashes(&self, seq: u64, out: &mut Vec<u8>) {
        let mut ts_buf = [0u8; RFC3339_LEN];
        let ts = rfc3339_into(self.ts, &mut ts_buf);
        let heads: [Option<Head<'_>>; 7] = [
            Some(Head::Number(seq)),
            Some(Head::Text(ts)),
            Some(Head::Text(self.name.as_str())),
            Some(Head::Text(&self.workflow_run_id)),
            self.stage_execution_id.as_deref().map(Head::Text),
            self.stage_id.as_deref().map(Head::Text),
            self.tool.as_deref().map(Head::Text),
        ];
        out.push(b'{');
        let mut first = true;
        let mut key = |out: &mut Vec<u8>, k: &str| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            write_json_str(out, k);
            out.push(b':');
        };
        for (k, head) in HEAD_KEYS.iter().zip(&heads) {
            let Some(head) = head else { continue };
            key(out, k);
            // A field named like a head key replaces that key's value in
            // place (as the map insert in `to_json` does).
            match (self.field_value(k), head) {
                (Some(v), _) => v.write_json(out),
                (None, Head::Number(n)) => write_u64(out, *n),
                (None, Head::Text(t)) => write_json_str(out, t),
            }
        }
        for (k, v) in &self.fields {
            if let (true, FieldValue::Relayed(members)) = (k.is_empty(), v) {
                // `seq` was written: a comma always goes first.
                if !members.is_empty() {
                    out.push(b',');
                    out.extend_from_slice(members.as_bytes());
                }
                continue;
            }
            let written = HEAD_KEYS
                .iter()
                .zip(&heads)
                .any(|(h, head)| head.is_some() && h == k);
            if !written {
                key(out, k);
                v.write_json(out);
            }
        }
        out.push(b'}');
    }
}

/// The value of a head key.
enum Head<'a> {
    Number(u64),
    Text(&'a str),
}

/// A JSON number as `serde_json::to_writer` writes it.
fn write_json_number(out: &mut Vec<u8>, n: &serde_json::Number) {
    match n.as_u64() {
        Some(n) => write_u64(out, n),
        // Negative and float numbers: serde_json's own formatting.
        None => out.extend_from_slice(n.to_string().as_bytes()),
    }
}

/// `value` as compact JSON, as `serde_json::to_writer` writes it.
fn write_json_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_json_number(out, n),
        Value::String(s) => write_json_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_str(out, k);
                out.push(b':');
                write_json_value(out, v);
            }
            out.push(b'}');
        }
    }
}

impl FieldValue {
    pub(super) fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            FieldValue::Static(s) => write_json_str(out, s),
            FieldValue::Shared(s) | FieldValue::Text(s) => write_json_str(out, s),
            // By hand, as serde writes it (`Usage`'s camelCase names, in
            // order): through serde it was a thousand instructions, and
            // three of a sibling's events carry one.
            FieldValue::Usage(u) => {
                write_usage(out, u.prompt_tokens, u.completion_tokens, u.requests)
            }
            FieldValue::Number(n) => write_json_number(out, n),
            FieldValue::Bool(true) => out.extend_from_slice(b"true"),
            FieldValue::Bool(false) => out.extend_from_slice(b"false"),
            FieldValue::Json(v) => write_json_value(out, v),
            FieldValue::Calls(calls) => {
                out.push(b'[');
                for (i, (id, tool)) in calls.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(br#"{"callId":"#);
                    write_json_str(out, id);
                    out.extend_from_slice(br#","tool":"#);
                    write_json_str(out, tool);
                    out.push(b'}');
                }
                out.push(b']');
            }
            FieldValue::Relayed(members) => {
                out.push(b'{');
                out.extend_from_slice(members.as_bytes());
                out.push(b'}');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// `is_head_key` is `HEAD_KEYS.contains`: each head key, and keys
    /// one byte off (in length or in content) and the fields the runtime
    /// names, are told apart alike.
    #[test]
    fn a_head_key_is_told_by_length_then_content() {
        let mut keys: Vec<String> = Vec::new();
        for head in super::HEAD_KEYS {
            keys.push(head.to_owned());
            keys.push(format!("{head}x"));
            keys.push(head[1..].to_owned());
            keys.push(head.to_uppercase());
        }
        keys.extend(
            [
                "",
                "s",
                "outcome",
                "reason",
                "callId",
                "arguments",
                "verdict",
                "usage",
                "step",
            ]
            .map(str::to_owned),
        );
        for key in &keys {
            assert_eq!(
                super::is_head_key(key),
                super::HEAD_KEYS.contains(&key.as_str()),
                "{key:?}"
            );
        }
    }

    use std::sync::Arc;

    use super::*;
    use crate::provider::Usage;
    use crate::runtime::events::EventName;

    #[test]
    fn usage_is_written_as_serde_writes_it() {
        for n in [0, 1, 9, 10, 12_345, u64::MAX] {
            let usage = Usage {
                prompt_tokens: n,
                completion_tokens: n / 3,
                requests: u64::MAX - n,
            };
            let mut ours = Vec::new();
            FieldValue::Usage(usage).write_json(&mut ours);
            assert_eq!(ours, serde_json::to_vec(&usage).unwrap(), "{usage:?}");
        }
    }

    #[test]
    fn write_json_matches_to_json_byte_for_byte() {
        let plain = Event::new(EventName::WorkflowStarted, "run").with("pipeline", "p");
        let full = Event::new(EventName::ToolInvocationStarted, "run")
            .stage("worker", "run/worker#1/1")
            .tool("Echo")
            .with("callId", "c\"1")
            .with(
                "arguments",
                serde_json::json!({"text": "item 1", "n": [1, 2.5, null]}),
            );
        // Fields named like head keys: in place when the head key is
        // written, in field order when it is not.
        let clash = Event::new(EventName::StageExited, "run")
            .with("tool", "from-field")
            .with("seq", 99)
            .with("verdict", "ok");
        // Everything that must be escaped, in keys, values and ids, and
        // numbers serde_json formats itself.
        let awkward = Event::new(EventName::ToolInvocationFailed, "r\"un\\")
            .stage("st\u{1}age", "exé/\n/1")
            .tool("To\tol")
            .with("message", "line 1\nline \"2\"\r\u{7f}\u{1f} — ünïcødé, and a long tail past sixteen bytes \\")
            .with(
                "nested",
                serde_json::json!({"k\"ey": ["\u{0}", -3, 1.5e300, 0.1, u64::MAX, i64::MIN, true, {}], "": []}),
            );
        // Values kept without a JSON value: static names, shared strings
        // (escaped like any other), usage counts.
        let typed = Event::new(EventName::StageExited, "run")
            .with_static("verdict", "ok")
            .with("reason", Arc::<str>::from("sibling \"w#1\"\n failed"))
            .with(
                "usage",
                Usage {
                    prompt_tokens: 12,
                    completion_tokens: 3,
                    requests: 2,
                },
            );
        // Tool calls in flight, none and two (one escaped).
        let calls: Vec<(Arc<str>, Arc<str>)> = vec![
            ("c1".into(), "Echo".into()),
            ("c\"2\n".into(), "Bash".into()),
        ];
        let cancelled = Event::new(EventName::StageCancelled, "run")
            .with("toolCalls", FieldValue::calls(&calls))
            .with("none", FieldValue::calls(&[]));
        assert_eq!(
            cancelled.field("toolCalls"),
            Some(
                serde_json::json!([{"callId": "c1", "tool": "Echo"}, {"callId": "c\"2\n", "tool": "Bash"}])
            )
        );
        assert_eq!(cancelled.field("none"), Some(serde_json::json!([])));
        assert_eq!(typed.field("verdict"), Some(serde_json::json!("ok")));
        assert_eq!(
            typed.field("usage"),
            Some(serde_json::json!({"promptTokens": 12, "completionTokens": 3, "requests": 2}))
        );
        for (i, e) in [plain, full, clash, awkward, typed, cancelled]
            .iter()
            .enumerate()
        {
            let mut fast = Vec::new();
            e.write_json(i as u64 + 1, &mut fast);
            let slow = serde_json::to_vec(&e.to_json(i as u64 + 1)).unwrap();
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(slow).unwrap()
            );
        }
    }

    #[test]
    fn json_keys_in_contract_order() {
        let e = Event::new(EventName::ToolInvocationStarted, "run")
            .stage("worker", "run/worker#1/1")
            .tool("Echo")
            .with("callId", "c1");
        let v = e.to_json(7);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "seq",
                "ts",
                "event",
                "workflowRunId",
                "stageExecutionId",
                "stageId",
                "tool",
                "callId"
            ]
        );
    }
}
