//! The messages every distributed sibling sends, written by hand: a
//! coordinator's task, a worker's `accepted` and `exited` reports.
//!
//! serde_json writes a struct's field names through its string escaper,
//! a byte at a time, and a task and its two reports name about forty:
//! with the values' own strings that was some 5 000 instructions a task
//! on the coordinator and 9 000 a sibling's reports on the worker
//! (callgrind, BENCHMARKS.md "Every core, twentieth round"). Here the
//! names are written as the bytes they are, strings that need no escape
//! are copied, and numbers go through itoa. What is written is what
//! serde_json writes for the same value, byte for byte (the tests below
//! compare them); anything rarer is left to serde_json.

use serde::Serialize;

use super::{Report, Task};
use crate::auditlog::json::{write_json_str, write_key, write_u64};

fn value<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> serde_json::Result<()> {
    serde_json::to_writer(&mut *out, value)
}

impl Task {
    /// The task's JSON, as serde_json writes it.
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"runId\":");
        write_json_str(out, &self.run_id);
        write_key(out, "turn");
        write_u64(out, self.turn);
        write_key(out, "unit");
        write_u64(out, self.unit as u64);
        write_key(out, "stageExecutionId");
        write_json_str(out, &self.stage_execution_id);
        write_key(out, "stageId");
        write_json_str(out, &self.stage_id);
        write_key(out, "index");
        match self.index {
            Some(index) => write_u64(out, index as u64),
            None => out.extend_from_slice(b"null"),
        }
        write_key(out, "visit");
        write_u64(out, u64::from(self.visit));
        write_key(out, "item");
        value(out, &self.item)?;
        write_key(out, "pipelineId");
        write_json_str(out, &self.pipeline_id);
        write_key(out, "digest");
        write_json_str(out, &self.digest);
        if self.zstd_reports {
            out.extend_from_slice(b",\"zstdReports\":true");
        }
        if self.relay_records {
            out.extend_from_slice(b",\"relayRecords\":true");
        }
        out.push(b'}');
        Ok(())
    }
}

impl Report {
    /// The report's JSON, as serde_json writes it.
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let (kind, id, turn, unit, worker) = match self {
            Report::Accepted {
                stage_execution_id,
                turn,
                unit,
                worker,
            } => ("accepted", stage_execution_id, turn, unit, worker),
            Report::Exited {
                stage_execution_id,
                turn,
                unit,
                worker,
                ..
            } => ("exited", stage_execution_id, turn, unit, worker),
            other => return value(out, other),
        };
        out.extend_from_slice(b"{\"kind\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"body\":{\"stageExecutionId\":");
        write_json_str(out, id);
        write_key(out, "turn");
        write_u64(out, *turn);
        write_key(out, "unit");
        write_u64(out, *unit as u64);
        write_key(out, "worker");
        write_json_str(out, worker);
        if let Report::Exited {
            delivered,
            result,
            events,
            ..
        } = self
        {
            write_key(out, "delivered");
            write_u64(out, *delivered);
            write_key(out, "result");
            result.write_json(out)?;
            write_key(out, "events");
            value(out, events)?;
        }
        out.extend_from_slice(b"}}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::super::{EventLine, Report, Task};
    use crate::runtime::events::{Event, EventName};
    use crate::runtime::result::{Kept, StageResult, Usage, Verdict};

    fn task(item: Option<serde_json::Value>, flags: bool) -> Task {
        Task {
            run_id: "run \"1\"".into(),
            turn: 3,
            unit: 7,
            stage_execution_id: "run/worker#7/1".into(),
            stage_id: "wörker\n".into(),
            index: if flags { Some(7) } else { None },
            visit: 2,
            item,
            pipeline_id: "fanout".into(),
            digest: "ab12".into(),
            zstd_reports: flags,
            relay_records: !flags,
        }
    }

    fn written(write: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>) -> String {
        let mut out = Vec::new();
        write(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_task_is_written_as_serde_json_writes_it() {
        for item in [None, Some(json!({"a": [1, "x\u{1}"], "b": -2.5}))] {
            for flags in [false, true] {
                let task = task(item.clone(), flags);
                assert_eq!(
                    written(|o| task.write_json(o)),
                    serde_json::to_string(&task).unwrap()
                );
            }
        }
    }

    proptest::proptest! {
        /// Any strings and numbers: the same bytes as serde_json.
        #[test]
        fn any_task_and_report_are_written_as_serde_json_writes_them(
            strings in proptest::collection::vec("\\PC{0,12}|[\"\\\\\u{0}-\u{1f}a]{0,4}", 6),
            numbers in proptest::array::uniform4(proptest::num::u64::ANY),
        ) {
            let mut t = task(Some(json!({ strings[5].clone(): strings[4] })), numbers[0] % 2 == 0);
            t.run_id = strings[0].clone();
            t.stage_id = strings[1].clone();
            t.turn = numbers[1];
            t.unit = numbers[2] as usize;
            t.visit = numbers[3] as u32;
            proptest::prop_assert_eq!(written(|o| t.write_json(o)), serde_json::to_string(&t).unwrap());
            let report = Report::Accepted {
                stage_execution_id: strings[2].clone(),
                turn: numbers[0],
                unit: numbers[3] as usize,
                worker: strings[3].clone(),
            };
            proptest::prop_assert_eq!(
                written(|o| report.write_json(o)),
                serde_json::to_string(&report).unwrap()
            );
        }
    }

    #[test]
    fn the_reports_are_written_as_serde_json_writes_them() {
        let parsed = Arc::new(json!({"item": 3, "summary": "done \"3\""}));
        let result = |output: Arc<serde_json::Value>, reason: Option<&str>| StageResult {
            stage_id: "worker".into(),
            stage_execution_id: "r/worker#3/1".into(),
            verdict: if reason.is_some() {
                Verdict::Fail
            } else {
                Verdict::Ok
            },
            reason: reason.map(str::to_owned),
            parsed: Arc::clone(&parsed),
            output,
            cap_hit: true,
            attempt_count: 2,
            usage: Usage {
                prompt_tokens: 5,
                completion_tokens: u64::MAX,
                requests: 1,
            },
        };
        let mut reports = vec![Report::Accepted {
            stage_execution_id: "r/worker#3/1".into(),
            turn: 1,
            unit: 3,
            worker: "w\t1".into(),
        }];
        let whole = Arc::new(result(Arc::clone(&parsed), None));
        let other = Arc::new(result(Arc::new(json!(["other"])), Some("why \\")));
        let packed = Kept::packed(Arc::clone(&other), "worker".into(), "r/worker#3/1".into());
        let event = Event::new(EventName::StageExited, Arc::from("r"));
        for (result, events) in [
            (Kept::Whole(whole), Vec::new()),
            (
                Kept::Whole(other),
                vec![EventLine::written(&event).unwrap()],
            ),
            (packed, Vec::new()),
        ] {
            reports.push(Report::Exited {
                stage_execution_id: "r/worker#3/1".into(),
                turn: 1,
                unit: 3,
                worker: "w1".into(),
                delivered: 2,
                result,
                events,
            });
        }
        reports.push(Report::Barrier { turn: 4 });
        for report in reports {
            assert_eq!(
                written(|o| report.write_json(o)),
                serde_json::to_string(&report).unwrap()
            );
        }
    }
}
