//! An event read back from its audit line: a worker's events, relayed to
//! the coordinator's log, keep their head keys and carry their own fields
//! inline, in order, so the line written again is the line read.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::clock::parse_rfc3339;
use super::encode::HEAD_KEYS;
use super::vocabulary::{Event, EventName, FieldValue};

impl Event {
    /// An event read back from its JSON line (a worker's event, relayed
    /// to the coordinator's log): the head keys as they were (`seq` is
    /// the new bus's), the other fields kept inline in their order.
    /// `None` for a line that is not a known event.
    pub fn from_json(line: &Value) -> Option<Event> {
        let obj = line.as_object()?;
        let name = EventName::parse(obj.get("event")?.as_str()?)?;
        let text = |k: &str| obj.get(k).and_then(Value::as_str).map(Arc::<str>::from);
        let mut event = Event::new(name, text("workflowRunId")?);
        if let Some(ts) = obj
            .get("ts")
            .and_then(Value::as_str)
            .and_then(parse_rfc3339)
        {
            event.ts = ts;
        }
        event.stage_execution_id = text("stageExecutionId");
        event.stage_id = text("stageId");
        event.tool = text("tool");
        let rest: Map<String, Value> = obj
            .iter()
            .filter(|(k, _)| !HEAD_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !rest.is_empty() {
            event
                .fields
                .push(("", FieldValue::Json(Value::Object(rest))));
        }
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_read_back_from_its_line_writes_the_same_line_with_its_new_seq() {
        let event = Event::new(EventName::StageExited, "run-1")
            .stage("worker", "run-1/worker#3/1")
            .with_static("verdict", "ok")
            .with("capHit", false)
            .with("attemptCount", 2u32)
            .with("reason", "a \"quoted\" reason");
        let line = event.to_json(5);
        let back = Event::from_json(&line).expect("a known event");
        let mut written = Vec::new();
        back.write_json(7, &mut written);
        let mut expected = line.clone();
        expected["seq"] = 7.into();
        assert_eq!(
            serde_json::from_slice::<Value>(&written).expect("JSON"),
            expected
        );
        assert_eq!(back.to_json(7), expected);
        assert!(Event::from_json(&serde_json::json!({"event": "Nope"})).is_none());
        for name in [
            EventName::StageEntered,
            EventName::ProviderNotice,
            EventName::Progress,
        ] {
            assert_eq!(EventName::parse(name.as_str()), Some(name));
        }
    }
}
