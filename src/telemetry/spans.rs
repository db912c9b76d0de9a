//! Spans from a run's events: one trace per run (its id is the run's),
//! a span per session, turn, stage execution, model request and tool
//! call, parented as the actors are: run → turn → execution → request or
//! tool call. Named and attributed by the OpenTelemetry GenAI semantic
//! conventions, plus `troupe.*` attributes. Span ids are derived from what
//! they stand for (the execution's id, the call's id), so events relayed
//! from a worker land under the same parents as local ones.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};
use serde_json::Value;

use crate::runtime::events::{Event, EventName};

/// The trace id of run `run_id`: the run's UUID, or a digest of an id that
/// is not one.
pub fn trace_id(run_id: &str) -> Vec<u8> {
    uuid::Uuid::parse_str(run_id).map_or_else(
        |_| {
            let mut id = span_id(run_id);
            id.extend(span_id(&format!("{run_id}/trace")));
            id
        },
        |u| u.as_bytes().to_vec(),
    )
}

/// The span id of what `key` names: a 64-bit SipHash with fixed keys
/// (ids need only be unique within their trace, and cheap: a wide run
/// makes tens of thousands).
pub fn span_id(key: &str) -> Vec<u8> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish().to_be_bytes().to_vec()
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(capped(value).to_owned()))
}

/// The longest attribute value exported, in bytes: a `Write` call's
/// arguments (with `--otlp-content`) may be megabytes, and a collector
/// refuses a post past its body limit whole, spans and all. The SDKs'
/// `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT` sets it (in characters there; here
/// bytes, cut at a character's edge).
fn value_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        crate::environ::var("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(16 * 1024)
    })
}

/// `value` cut to [`value_limit`] bytes, at a character's edge.
fn capped(value: &str) -> &str {
    let limit = value_limit();
    if value.len() <= limit {
        return value;
    }
    let mut end = limit;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

fn int(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

/// An event's token usage as the GenAI attributes name it; read in place
/// for the runtime's own events, from the JSON of a relayed one.
fn usage(e: &Event) -> Vec<(&'static str, i64)> {
    use crate::runtime::events::FieldValue;
    let (input, output) = match e.field_value("usage") {
        Some(FieldValue::Usage(u)) => (Some(u.prompt_tokens), Some(u.completion_tokens)),
        _ => {
            let v = e.field("usage").unwrap_or(Value::Null);
            (v["promptTokens"].as_u64(), v["completionTokens"].as_u64())
        }
    };
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    [
        ("gen_ai.usage.input_tokens", input),
        ("gen_ai.usage.output_tokens", output),
    ]
    .into_iter()
    .filter_map(|(k, n)| n.map(|n| (k, as_i64(n))))
    .collect()
}

/// A span being built.
#[derive(Debug)]
struct Open {
    span: Span,
}

/// Builds spans from the events of one run.
#[derive(Debug)]
pub struct SpanBook {
    trace: Vec<u8>,
    /// Prompts, completions and tool arguments go out only when asked.
    content: bool,
    model: Option<String>,
    provider: Option<String>,
    run: Option<(Vec<u8>, Open)>,
    sessions: u32,
    turns: Vec<(Arc<str>, Open)>,
    open: HashMap<String, Open>,
    /// The keys in `open` of each execution's model requests and tool
    /// calls (some may have ended since): those still open when the
    /// execution ends were dropped with it, and end with it.
    children: HashMap<String, Vec<String>>,
    /// A call's arguments, from its proposal, until it starts (content on).
    proposed: HashMap<String, String>,
    last: SystemTime,
}

impl SpanBook {
    pub fn new(run_id: &str, content: bool) -> SpanBook {
        SpanBook {
            trace: trace_id(run_id),
            content,
            model: None,
            provider: None,
            run: None,
            sessions: 0,
            turns: Vec::new(),
            open: HashMap::new(),
            children: HashMap::new(),
            proposed: HashMap::new(),
            last: SystemTime::UNIX_EPOCH,
        }
    }

    fn start(
        &self,
        key: &str,
        name: String,
        parent: &[u8],
        at: SystemTime,
        kind: span::SpanKind,
    ) -> Open {
        Open {
            span: Span {
                trace_id: self.trace.clone(),
                span_id: span_id(key),
                parent_span_id: parent.to_vec(),
                name,
                kind: kind as i32,
                start_time_unix_nano: nanos(at),
                ..Span::default()
            },
        }
    }

    /// The span of execution `exec`; a late event of an execution no
    /// longer open hangs from the turn (or the run).
    fn execution_span(&self, exec: &str) -> Vec<u8> {
        self.open
            .get(exec)
            .map_or_else(|| self.turn_parent(), |o| o.span.span_id.clone())
    }

    fn run_span_id(&self) -> Vec<u8> {
        self.run
            .as_ref()
            .map(|(id, _)| id.clone())
            .unwrap_or_default()
    }

    /// The span an execution's children hang from: the turn it runs in,
    /// else the run.
    fn turn_parent(&self) -> Vec<u8> {
        self.turns
            .last()
            .map_or_else(|| self.run_span_id(), |(_, t)| t.span.span_id.clone())
    }

    /// A failure's reason as exported: whole with `--otlp-content`;
    /// without it only its code (`ToolTransient/Timeout`), since a reason
    /// may quote a tool's output (a `Bash` timeout's, an MCP server's
    /// error text) that the collector's readers are not meant to see.
    fn reason(&self, reason: &str) -> String {
        fn is_code(s: &str) -> bool {
            s.split_once('/').is_some_and(|(class, name)| {
                !class.is_empty()
                    && !name.is_empty()
                    && class
                        .chars()
                        .chain(name.chars())
                        .all(|c| c.is_ascii_alphanumeric())
            })
        }
        if self.content {
            return reason.to_owned();
        }
        match reason.split_once(':') {
            Some((code, _)) if is_code(code) => code.to_owned(),
            _ if is_code(reason) => reason.to_owned(),
            _ => "failed (the reason is in the run's audit log; --otlp-content exports it)"
                .to_owned(),
        }
    }

    fn end(mut open: Open, at: SystemTime, error: Option<String>, done: &mut Vec<Span>) {
        open.span.end_time_unix_nano = nanos(at).max(open.span.start_time_unix_nano);
        if let Some(message) = error {
            open.span.status = Some(Status {
                message,
                code: status::StatusCode::Error as i32,
            });
        }
        done.push(open.span);
    }

    /// Takes one event; spans it ends go to `done`.
    pub fn take(&mut self, seq: u64, e: &Event, done: &mut Vec<Span>) {
        self.last = self.last.max(e.ts);
        let exec = e.stage_execution_id.as_deref().unwrap_or("");
        // (An event relayed from a worker finds its fields in the text it
        // came with: `Event::field`.)
        let field = |k: &str| e.field(k).unwrap_or(Value::Null);
        match e.name {
            EventName::WorkflowStarted | EventName::WorkflowResumed => {
                let provider = field("provider");
                self.provider = provider["name"].as_str().map(str::to_owned);
                self.model = provider["model"].as_str().map(str::to_owned);
                self.sessions += 1;
                // Keyed by the event's `seq`, which goes on across a
                // resume: a resumed session (a new process, counting its
                // sessions from one again) gets a span id of its own in
                // the run's trace.
                let key = format!("{}/session@{seq}", e.workflow_run_id);
                let pipeline = field("pipeline");
                let mut open = self.start(
                    &key,
                    format!("run {}", pipeline.as_str().unwrap_or("?")),
                    &[],
                    e.ts,
                    span::SpanKind::Internal,
                );
                open.span.attributes = vec![
                    text("troupe.run_id", &e.workflow_run_id),
                    text("troupe.pipeline", pipeline.as_str().unwrap_or("")),
                    int("troupe.session", i64::from(self.sessions)),
                ];
                if let Some(model) = &self.model {
                    open.span
                        .attributes
                        .push(text("gen_ai.request.model", model));
                }
                let id = open.span.span_id.clone();
                if let Some((_, old)) = self.run.replace((id, open)) {
                    SpanBook::end(old, e.ts, Some("a new session began".to_owned()), done);
                }
            }
            EventName::WorkflowExit => {
                self.close(e.ts, done);
                if let Some((_, mut open)) = self.run.take() {
                    let status = field("status");
                    let status = status.as_str().unwrap_or("?");
                    open.span.attributes.push(text("troupe.status", status));
                    let reason = field("reason").as_str().map(|r| self.reason(r));
                    if let Some(r) = &reason {
                        open.span.attributes.push(text("troupe.reason", r));
                    }
                    let error =
                        (status == "failed").then(|| reason.unwrap_or_else(|| "failed".into()));
                    SpanBook::end(open, e.ts, error, done);
                }
            }
            EventName::SessionTurnStart => {
                let turn: Arc<str> = field("turnId").as_str().unwrap_or("?").into();
                let stages = field("stages");
                let names: Vec<&str> = stages
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut open = self.start(
                    &format!("turn:{turn}@{seq}"),
                    format!("turn {}", names.join(", ")),
                    &self.run_span_id(),
                    e.ts,
                    span::SpanKind::Internal,
                );
                open.span.attributes.push(text("troupe.turn_id", &turn));
                for (k, name) in [("width", "troupe.width"), ("cap", "troupe.cap")] {
                    if let Some(n) = field(k).as_i64() {
                        open.span.attributes.push(int(name, n));
                    }
                }
                self.turns.push((turn, open));
            }
            EventName::SessionTurnEnd => {
                let turn = field("turnId");
                let turn = turn.as_str().unwrap_or("?");
                if let Some(i) = self.turns.iter().rposition(|(t, _)| &**t == turn) {
                    let (_, open) = self.turns.remove(i);
                    SpanBook::end(open, e.ts, None, done);
                }
            }
            EventName::StageEntered => {
                let stage = e.stage_id.as_deref().unwrap_or("?");
                // Every span is keyed by the `seq` of the event that began
                // it, unique in the run: an execution that runs again (a
                // resume, a sibling redelivered to another worker) or a
                // request id a retry repeats gets a span id of its own.
                let mut open = self.start(
                    &format!("{exec}@{seq}"),
                    format!("stage {stage}"),
                    &self.turn_parent(),
                    e.ts,
                    span::SpanKind::Internal,
                );
                open.span.attributes = vec![
                    text("troupe.stage", stage),
                    text("troupe.stage_execution_id", exec),
                    text("troupe.kind", field("kind").as_str().unwrap_or("")),
                ];
                if let Some(i) = field("index").as_i64() {
                    open.span.attributes.push(int("troupe.sibling_index", i));
                }
                if let Some(old) = self.open.insert(exec.to_owned(), open) {
                    SpanBook::end(old, e.ts, Some("it began again".to_owned()), done);
                }
            }
            EventName::StageExited | EventName::StageCancelled => {
                // A request or call still open was dropped with its
                // execution (a cancel, the stage's timeout): it ends here,
                // not in error at the run's end.
                for key in self.children.remove(exec).unwrap_or_default() {
                    if let Some(mut open) = self.open.remove(&key) {
                        open.span
                            .attributes
                            .push(text("troupe.outcome", "cancelled"));
                        SpanBook::end(open, e.ts, None, done);
                    }
                }
                if let Some(mut open) = self.open.remove(exec) {
                    let cancelled = e.name == EventName::StageCancelled;
                    let verdict = if cancelled {
                        "cancelled".to_owned()
                    } else {
                        field("verdict").as_str().unwrap_or("?").to_owned()
                    };
                    open.span.attributes.push(text("troupe.verdict", &verdict));
                    let reason = field("reason").as_str().map(|r| self.reason(r));
                    if let Some(r) = &reason {
                        let key = if cancelled {
                            "troupe.cancel_reason"
                        } else {
                            "troupe.reason"
                        };
                        open.span.attributes.push(text(key, r));
                    }
                    if let Some(n) = field("attemptCount").as_i64() {
                        open.span.attributes.push(int("troupe.attempts", n));
                    }
                    for (name, n) in usage(e) {
                        open.span.attributes.push(int(name, n));
                    }
                    // Skipped (a gate's `skip`) is no error either.
                    let error = (!cancelled && verdict != "ok" && verdict != "skipped")
                        .then(|| reason.unwrap_or_else(|| "failed".into()));
                    SpanBook::end(open, e.ts, error, done);
                }
            }
            EventName::ProviderRequestStarted => {
                let key = format!("{exec}/request/{}", field("turn"));
                let attempt = field("try").as_i64().unwrap_or(1);
                if let Some(old) = self.open.remove(&key) {
                    SpanBook::end(old, e.ts, Some("retried".to_owned()), done);
                }
                let model = self.model.clone().unwrap_or_default();
                let id_key = format!("{key}/try/{attempt}@{seq}");
                let mut open = self.start(
                    &id_key,
                    format!("chat {model}").trim_end().to_owned(),
                    &self.execution_span(exec),
                    e.ts,
                    span::SpanKind::Client,
                );
                open.span.attributes = vec![
                    text("gen_ai.operation.name", "chat"),
                    text(
                        "gen_ai.provider.name",
                        field("provider")
                            .as_str()
                            .or(self.provider.as_deref())
                            .unwrap_or("?"),
                    ),
                    text("troupe.stage_execution_id", exec),
                    int("troupe.turn", field("turn").as_i64().unwrap_or(0)),
                    int("troupe.try", attempt),
                ];
                if !model.is_empty() {
                    open.span
                        .attributes
                        .push(text("gen_ai.request.model", &model));
                }
                self.children
                    .entry(exec.to_owned())
                    .or_default()
                    .push(key.clone());
                self.open.insert(key, open);
            }
            EventName::ProviderRequestCompleted | EventName::ProviderRequestFailed => {
                let key = format!("{exec}/request/{}", field("turn"));
                if let Some(mut open) = self.open.remove(&key) {
                    for (name, n) in usage(e) {
                        open.span.attributes.push(int(name, n));
                    }
                    // A server's error may quote the request (prompts, tool
                    // output): its code alone unless content is exported.
                    let error = (e.name == EventName::ProviderRequestFailed).then(|| {
                        self.reason(&format!(
                            "{}: {}",
                            field("code").as_str().unwrap_or("?"),
                            field("message").as_str().unwrap_or("")
                        ))
                    });
                    if let Some(message) = &error {
                        open.span
                            .attributes
                            .push(text("error.type", message.split(':').next().unwrap_or("?")));
                    }
                    SpanBook::end(open, e.ts, error, done);
                }
            }
            EventName::ToolInvocationProposed if self.content => {
                let key = format!("{exec}/call/{}", field("callId").as_str().unwrap_or("?"));
                if let Some(args) = field("arguments").as_str() {
                    self.proposed.insert(key, args.to_owned());
                }
            }
            EventName::ToolInvocationStarted => {
                let call = field("callId");
                let call = call.as_str().unwrap_or("?");
                let tool = e.tool.as_deref().unwrap_or("?");
                let key = format!("{exec}/call/{call}");
                let mut open = self.start(
                    &format!("{key}@{seq}"),
                    format!("execute_tool {tool}"),
                    &self.execution_span(exec),
                    e.ts,
                    span::SpanKind::Internal,
                );
                open.span.attributes = vec![
                    text("gen_ai.operation.name", "execute_tool"),
                    text("gen_ai.tool.name", tool),
                    text("gen_ai.tool.call.id", call),
                    text("troupe.stage_execution_id", exec),
                ];
                // Arguments a transform rewrote are the ones that ran.
                let proposed = self.proposed.remove(&key);
                let rewritten = field("arguments");
                let ran = match rewritten.as_str() {
                    Some(args) if self.content => Some(args),
                    _ => proposed.as_deref(),
                };
                if let Some(args) = ran {
                    open.span
                        .attributes
                        .push(text("gen_ai.tool.call.arguments", args));
                }
                self.children
                    .entry(exec.to_owned())
                    .or_default()
                    .push(key.clone());
                self.open.insert(key, open);
            }
            EventName::ToolInvocationSucceeded
            | EventName::ToolInvocationFailed
            | EventName::ToolInvocationCancelled => {
                let key = format!("{exec}/call/{}", field("callId").as_str().unwrap_or("?"));
                if let Some(mut open) = self.open.remove(&key) {
                    let outcome = match e.name {
                        EventName::ToolInvocationSucceeded => "ok",
                        EventName::ToolInvocationFailed => "failed",
                        _ => "cancelled",
                    };
                    open.span.attributes.push(text("troupe.outcome", outcome));
                    let error = (outcome == "failed").then(|| {
                        self.reason(&format!(
                            "{}: {}",
                            field("code").as_str().unwrap_or("?"),
                            field("message").as_str().unwrap_or("")
                        ))
                    });
                    SpanBook::end(open, e.ts, error, done);
                }
            }
            _ => {}
        }
    }

    /// Ends every span still open (a run that stopped without its end,
    /// or the turns and executions a `WorkflowExit` closes).
    pub fn close(&mut self, at: SystemTime, done: &mut Vec<Span>) {
        let at = at.max(self.last);
        let mut open: Vec<Open> = self.open.drain().map(|(_, o)| o).collect();
        open.sort_by_key(|o| o.span.start_time_unix_nano);
        for o in open {
            SpanBook::end(o, at, Some("the run ended before it did".to_owned()), done);
        }
        while let Some((_, t)) = self.turns.pop() {
            SpanBook::end(t, at, None, done);
        }
    }

    /// Ends everything, the run's span included.
    pub fn finish(&mut self, done: &mut Vec<Span>) {
        let at = self.last;
        self.close(at, done);
        if let Some((_, open)) = self.run.take() {
            SpanBook::end(
                open,
                at,
                Some("the run ended without its WorkflowExit".to_owned()),
                done,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::collections::HashSet;

    /// One execution that runs twice (a retry repeats its turn and try
    /// numbers, a resume or a redelivery its id), with a model request
    /// and a tool call each time: every span has an id of its own, and
    /// each request and call hangs from the execution span it ran in.
    #[test]
    fn an_execution_that_runs_again_gets_span_ids_of_its_own() {
        let run = "01a22167-3058-7161-8dfe-293276497364";
        let exec = format!("{run}/w#0/1");
        let mut book = SpanBook::new(run, false);
        let mut done = Vec::new();
        let mut seq = 0;
        let mut take = |book: &mut SpanBook, e: Event, done: &mut Vec<Span>| {
            seq += 1;
            book.take(seq, &e, done);
        };
        take(
            &mut book,
            Event::new(EventName::WorkflowStarted, run).with("pipeline", "p"),
            &mut done,
        );
        take(
            &mut book,
            Event::new(EventName::SessionTurnStart, run).with("turnId", "turn"),
            &mut done,
        );
        for _ in 0..2 {
            let at = |name| Event::new(name, run).stage("w", exec.as_str());
            take(&mut book, at(EventName::StageEntered), &mut done);
            let request = |name| at(name).with("turn", 1).with("try", 1);
            take(
                &mut book,
                request(EventName::ProviderRequestStarted),
                &mut done,
            );
            take(
                &mut book,
                request(EventName::ProviderRequestCompleted),
                &mut done,
            );
            let call = |name| at(name).tool("Echo").with("callId", "call_0");
            take(&mut book, call(EventName::ToolInvocationStarted), &mut done);
            take(
                &mut book,
                call(EventName::ToolInvocationSucceeded),
                &mut done,
            );
            take(
                &mut book,
                at(EventName::StageExited).with("verdict", "ok"),
                &mut done,
            );
        }
        take(
            &mut book,
            Event::new(EventName::SessionTurnEnd, run).with("turnId", "turn"),
            &mut done,
        );
        take(
            &mut book,
            Event::new(EventName::WorkflowExit, run).with("status", "ok"),
            &mut done,
        );
        let ids: HashSet<&[u8]> = done.iter().map(|s| &s.span_id[..]).collect();
        assert_eq!(ids.len(), done.len(), "{done:#?}");
        let stages: Vec<&Span> = done.iter().filter(|s| s.name == "stage w").collect();
        assert_eq!(stages.len(), 2);
        for child in done
            .iter()
            .filter(|s| s.name != "stage w" && s.name.contains(' '))
        {
            if child.name.starts_with("chat") || child.name.starts_with("execute_tool") {
                assert!(
                    stages.iter().any(|s| s.span_id == child.parent_span_id),
                    "{} hangs from no execution",
                    child.name
                );
            }
        }
        // The second run's children hang from the second execution span.
        let last_call = done
            .iter()
            .rfind(|s| s.name == "execute_tool Echo")
            .unwrap();
        assert_eq!(last_call.parent_span_id, stages[1].span_id);
    }

    /// An attribute value past the limit is cut at a character's edge.
    #[test]
    fn a_long_value_is_cut_at_a_characters_edge() {
        let long = "é".repeat(20_000);
        let cut = capped(&long);
        assert!(cut.len() <= value_limit() && cut.len() >= value_limit() - 1);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(capped("short"), "short");
    }

    /// The spans `events` make, taken in order from `seq` 1.
    fn spans_of(run: &str, events: Vec<Event>) -> Vec<Span> {
        let mut book = SpanBook::new(run, false);
        let mut done = Vec::new();
        for (seq, e) in (1..).zip(&events) {
            book.take(seq, e, &mut done);
        }
        done
    }

    /// A request and a call dropped with their execution (cancelled) end
    /// with it, not in error at the run's end; a skipped stage is no
    /// error.
    #[test]
    fn what_an_execution_drops_ends_with_it_and_skipped_is_no_error() {
        let run = "01a22167-3058-7161-8dfe-293276497364";
        let exec = format!("{run}/w#0/1");
        let skipped = format!("{run}/s/1");
        let at = |name, stage: &str, id: &str| Event::new(name, run).stage(stage, id);
        let done = spans_of(
            run,
            vec![
                Event::new(EventName::WorkflowStarted, run).with("pipeline", "p"),
                at(EventName::StageEntered, "w", &exec),
                at(EventName::ProviderRequestStarted, "w", &exec)
                    .with("turn", 1)
                    .with("try", 1),
                at(EventName::ToolInvocationStarted, "w", &exec)
                    .tool("Echo")
                    .with("callId", "c"),
                at(EventName::StageCancelled, "w", &exec),
                at(EventName::StageEntered, "s", &skipped),
                at(EventName::StageExited, "s", &skipped)
                    .with("verdict", "skipped")
                    .with("reason", "gate"),
            ],
        );
        // Ended before the run's end, none in error.
        let names: Vec<&str> = done.iter().map(|s| s.name.as_str()).collect();
        assert!(
            names.contains(&"chat") && names.contains(&"execute_tool Echo"),
            "{names:?}"
        );
        for span in &done {
            let code = span.status.as_ref().map_or(0, |s| s.code);
            assert_eq!(code, 0, "{} is in error: {span:#?}", span.name);
        }
    }
}
