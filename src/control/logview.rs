//! What a run's audit log says so far, read on from where the last look
//! stopped: its status, executions by stage and state, model requests and
//! tokens, tool calls by outcome. `describe` and `/metrics` read it; a
//! poll costs what the run wrote since the last one. Lines are told apart
//! by the writer's fixed head and their few fields read in place, not
//! parsed whole.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::stream::line_head;
use crate::auditlog::Follower;

/// File bytes a look reads at once (compressed: about ten times as much
/// log).
const READ_AT_ONCE: usize = 1 << 20;

/// Executions of one stage, by how they stand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Executions {
    pub entered: u64,
    pub ok: u64,
    pub failed: u64,
    pub cancelled: u64,
}

impl Executions {
    pub fn running(&self) -> u64 {
        self.entered
            .saturating_sub(self.ok + self.failed + self.cancelled)
    }
}

/// What one model's requests came to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    pub requests: Requests,
    /// In US dollars; `None` while no price was in force for any of them.
    pub cost: Option<f64>,
}

/// Model requests of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    pub completed: u64,
    pub failed: u64,
    /// Requests that were a retry (`try` > 1).
    pub retries: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Requests {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Requests) {
        self.completed += other.completed;
        self.failed += other.failed;
        self.retries += other.retries;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// The log as far as it was read.
#[derive(Debug, Clone, Default)]
pub struct LogView {
    /// The last event's `seq`; 0 before the log has one.
    pub last_seq: u64,
    /// The last `WorkflowExit`'s status (a resumed run's is followed by
    /// more events, which clear it).
    pub status: Option<String>,
    pub reason: Option<String>,
    /// The model the run asks (the provider's name when it names none).
    pub model: String,
    /// Its price in US dollars per million tokens, when the run has one
    /// (`--price`, `provider.prices`).
    pub price: Option<crate::definition::Price>,
    pub stages: BTreeMap<String, Executions>,
    /// The run's model requests by the model asked when each was made,
    /// with what they cost at the price in force then: a resume that
    /// changes the model or the price leaves what came before as it was
    /// counted (a `_total` series must never go down).
    pub by_model: BTreeMap<String, Spent>,
    /// Tool calls by (tool, outcome).
    pub tools: BTreeMap<(String, &'static str), u64>,
    /// Open parallel turns: turn id → (stage, width, the stage's entries
    /// when the turn began).
    fanouts: BTreeMap<String, (String, u64, u64)>,
    /// The fan-out the latest `SessionTurnEnd` closed, while no turn has
    /// started since: a run cancelled in it is resumed in it (its turn is
    /// not started again), and its siblings wait again.
    ended_fanout: Option<(String, (String, u64, u64))>,
    /// The last event's `ts` (RFC 3339).
    pub last_ts: Option<String>,
}

/// The string value of `"name":"…"` in a line the writer made (no
/// escapes in the names it is asked for).
fn text<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":\"");
    let at = line.find(&key)? + key.len();
    let rest = &line[at..];
    Some(&rest[..rest.find('"')?])
}

/// The number value of `"name":N`.
fn number(line: &str, name: &str) -> Option<u64> {
    let key = format!("\"{name}\":");
    let at = line.find(&key)? + key.len();
    let rest = &line[at..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

impl LogView {
    /// Reads the whole lines `log` finds appended since the last call. A
    /// log that cannot be read is left where it stopped (the run's own
    /// end reports why).
    pub fn read_on(&mut self, log: &mut Follower) {
        let mut lines = Vec::new();
        while let Ok(n) = log.read_more(READ_AT_ONCE, &mut lines) {
            for line in lines.split(|b| *b == b'\n') {
                if let Ok(line) = std::str::from_utf8(line) {
                    self.take(line.trim_end());
                }
            }
            lines.clear();
            if n < READ_AT_ONCE {
                break;
            }
        }
    }

    fn stage(&mut self, line: &str) -> &mut Executions {
        let stage = text(line, "stageId").unwrap_or("?").to_owned();
        self.stages.entry(stage).or_default()
    }

    /// The run's model requests, every model's together.
    #[cfg(test)]
    fn requests(&self) -> Requests {
        let mut all = Requests::default();
        for spent in self.by_model.values() {
            all.add(&spent.requests);
        }
        all
    }

    /// What the model asked now has spent.
    fn spent(&mut self) -> &mut Spent {
        self.by_model.entry(self.model.clone()).or_default()
    }

    fn take(&mut self, line: &str) {
        let Some((seq, event)) = line_head(line) else {
            return;
        };
        self.last_seq = seq;
        self.last_ts = text(line, "ts").map(str::to_owned);
        if event != "WorkflowExit" && self.status.is_some() {
            // Resumed: the run goes on after its earlier exit.
            self.status = None;
            self.reason = None;
        }
        if event == "SessionTurnStart" {
            self.ended_fanout = None;
        }
        match event {
            "WorkflowStarted" | "WorkflowResumed" => {
                if event == "WorkflowResumed"
                    && let Some((turn, (stage, width, _))) = self.ended_fanout.take()
                {
                    // Waiting: the width less the siblings that ended
                    // before and those entered from now on.
                    let now = self.stages.get(&stage).copied().unwrap_or_default();
                    let before = now.entered.saturating_sub(now.ok + now.failed);
                    self.fanouts.insert(turn, (stage, width, before));
                }
                let v: Value = serde_json::from_str(line).unwrap_or_default();
                let provider = &v["provider"];
                if let Some(model) = provider["model"].as_str().or(provider["name"].as_str()) {
                    model.clone_into(&mut self.model);
                }
                let price = &v["limits"]["price"];
                self.price = price["input"]
                    .as_f64()
                    .zip(price["output"].as_f64())
                    .map(|(input, output)| crate::definition::Price { input, output });
            }
            "SessionTurnStart" if text(line, "execution") == Some("parallel") => {
                let stage = line
                    .find("\"stages\":[\"")
                    .map(|at| &line[at + "\"stages\":[\"".len()..])
                    .and_then(|rest| rest.split(['[', '"']).next())
                    .unwrap_or("?")
                    .to_owned();
                let width = number(line, "width").unwrap_or(0);
                let before = self.stages.get(&stage).map_or(0, |e| e.entered);
                if let Some(turn) = text(line, "turnId") {
                    self.fanouts.insert(turn.to_owned(), (stage, width, before));
                }
            }
            "SessionTurnEnd" => {
                if let Some(turn) = text(line, "turnId") {
                    self.ended_fanout = self.fanouts.remove_entry(turn);
                }
            }
            "StageEntered" => self.stage(line).entered += 1,
            "StageExited" => {
                let ok = text(line, "verdict") == Some("ok");
                let stage = self.stage(line);
                if ok {
                    stage.ok += 1;
                } else {
                    stage.failed += 1;
                }
            }
            "StageCancelled" => self.stage(line).cancelled += 1,
            "ProviderRequestStarted" if number(line, "try").is_some_and(|t| t > 1) => {
                self.spent().requests.retries += 1;
            }
            // A failed try carries what the server billed for it, if it
            // said: counted as the budget counts it.
            "ProviderRequestCompleted" | "ProviderRequestFailed" => {
                let (input, output) = (
                    number(line, "promptTokens").unwrap_or(0),
                    number(line, "completionTokens").unwrap_or(0),
                );
                let price = self.price;
                let spent = self.spent();
                if event == "ProviderRequestCompleted" {
                    spent.requests.completed += 1;
                } else {
                    spent.requests.failed += 1;
                }
                spent.requests.input_tokens = spent.requests.input_tokens.saturating_add(input);
                spent.requests.output_tokens = spent.requests.output_tokens.saturating_add(output);
                if let Some(price) = price
                    && (event == "ProviderRequestCompleted" || (input, output) != (0, 0))
                {
                    *spent.cost.get_or_insert(0.0) += price.cost(input, output);
                }
            }
            "ToolInvocationSucceeded" => self.tool(line, "ok"),
            "ToolInvocationFailed" => self.tool(line, "failed"),
            "ToolInvocationCancelled" => self.tool(line, "cancelled"),
            "ToolCallDenied" => self.tool(line, "denied"),
            "WorkflowExit" => {
                self.status = Some(text(line, "status").unwrap_or("ended").to_owned());
                let v: Value = serde_json::from_str(line).unwrap_or_default();
                self.reason = v["reason"].as_str().map(str::to_owned);
            }
            _ => {}
        }
    }

    fn tool(&mut self, line: &str, outcome: &'static str) {
        let tool = text(line, "tool").unwrap_or("?").to_owned();
        *self.tools.entry((tool, outcome)).or_default() += 1;
    }

    /// Siblings of the open fan-outs not started yet (waiting for a cap
    /// slot), by stage.
    pub fn waiting(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (stage, width, before) in self.fanouts.values() {
            let entered = self.stages.get(stage).map_or(0, |e| e.entered);
            let started = entered.saturating_sub(*before);
            *out.entry(stage.clone()).or_default() += width.saturating_sub(started);
        }
        out
    }

    /// Executions of every stage by how they stand, as the API shows them.
    pub fn totals(&self) -> Value {
        let all = self
            .stages
            .values()
            .fold(Executions::default(), |a, s| Executions {
                entered: a.entered + s.entered,
                ok: a.ok + s.ok,
                failed: a.failed + s.failed,
                cancelled: a.cancelled + s.cancelled,
            });
        json!({
            "running": all.running(),
            "ok": all.ok,
            "failed": all.failed,
            "cancelled": all.cancelled,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_in_place() {
        let line = r#"{"seq":7,"ts":"t","event":"ProviderRequestCompleted","stageId":"plan","usage":{"promptTokens":37,"completionTokens":41}}"#;
        assert_eq!(text(line, "stageId"), Some("plan"));
        assert_eq!(number(line, "promptTokens"), Some(37));
        assert_eq!(number(line, "nope"), None);
        let mut view = LogView::default();
        view.take(line);
        assert_eq!(view.requests().completed, 1);
        assert_eq!(view.requests().output_tokens, 41);
        assert_eq!(view.last_seq, 7);
    }

    /// A fan-out cancelled and resumed waits again for what did not end:
    /// its turn is not started again, so the gauge reopens at the resume.
    #[test]
    fn a_resumed_fan_out_waits_for_what_did_not_end() {
        let mut view = LogView::default();
        let sibling = |seq: u32, event: &str| {
            format!(r#"{{"seq":{seq},"ts":"t","event":"{event}","stageId":"w"}}"#)
        };
        view.take(r#"{"seq":1,"ts":"t","event":"SessionTurnStart","turnId":"t1","stages":["w[10]"],"execution":"parallel","width":10}"#);
        for (seq, event) in [(2, "StageEntered"), (3, "StageEntered"), (4, "StageExited")] {
            view.take(&sibling(seq, event));
        }
        view.take(&sibling(5, "StageCancelled"));
        assert_eq!(view.waiting()["w"], 8);
        view.take(r#"{"seq":6,"ts":"t","event":"SessionTurnEnd","turnId":"t1"}"#);
        view.take(r#"{"seq":7,"ts":"t","event":"WorkflowExit","status":"cancelled"}"#);
        assert!(view.waiting().is_empty());
        view.take(r#"{"seq":8,"ts":"t","event":"WorkflowResumed","provider":{"name":"scripted"}}"#);
        assert_eq!(view.waiting()["w"], 9, "all but the one that ended");
        view.take(&sibling(9, "StageEntered"));
        assert_eq!(view.waiting()["w"], 8);
    }

    /// A resume at another price (or model) counts what comes after it at
    /// that one; what came before stays as it was counted.
    #[test]
    fn each_request_is_counted_at_the_model_and_price_it_was_made_at() {
        let mut view = LogView::default();
        for line in [
            r#"{"seq":1,"ts":"t","event":"WorkflowStarted","provider":{"name":"scripted","model":"m1"},"limits":{"price":{"input":1000.0,"output":1000.0}}}"#,
            r#"{"seq":2,"ts":"t","event":"ProviderRequestCompleted","usage":{"promptTokens":100,"completionTokens":100}}"#,
            r#"{"seq":3,"ts":"t","event":"WorkflowExit","status":"cancelled"}"#,
            r#"{"seq":4,"ts":"t","event":"WorkflowResumed","provider":{"name":"scripted","model":"m2"},"limits":{"price":{"input":1.0,"output":1.0}}}"#,
            r#"{"seq":5,"ts":"t","event":"ProviderRequestCompleted","usage":{"promptTokens":100,"completionTokens":100}}"#,
        ] {
            view.take(line);
        }
        let m1 = view.by_model["m1"];
        let m2 = view.by_model["m2"];
        assert_eq!((m1.requests.completed, m2.requests.completed), (1, 1));
        assert!((m1.cost.unwrap() - 0.2).abs() < 1e-9, "{m1:?}");
        assert!((m2.cost.unwrap() - 0.0002).abs() < 1e-9, "{m2:?}");
        assert_eq!(view.requests().completed, 2);
    }

    #[test]
    fn a_resumed_run_is_running_again_after_its_exit() {
        let mut view = LogView::default();
        view.take(r#"{"seq":1,"ts":"t","event":"StageEntered","stageId":"w"}"#);
        view.take(r#"{"seq":2,"ts":"t","event":"WorkflowExit","status":"cancelled"}"#);
        assert_eq!(view.status.as_deref(), Some("cancelled"));
        assert_eq!(view.stages["w"].running(), 1);
        view.take(r#"{"seq":3,"ts":"t","event":"WorkflowResumed","provider":{"name":"scripted"}}"#);
        assert_eq!(view.status, None);
        view.take(r#"{"seq":4,"ts":"t","event":"StageExited","stageId":"w","verdict":"ok"}"#);
        assert_eq!(view.stages["w"].running(), 0);
        assert_eq!(view.model, "scripted");
    }

    #[test]
    fn siblings_not_started_are_waiting_until_their_turn_ends() {
        let mut view = LogView::default();
        view.take(r#"{"seq":1,"ts":"t1","event":"SessionTurnStart","turnId":"r/turn/2","stages":["worker[3]"],"execution":"parallel","width":3,"cap":1}"#);
        assert_eq!(view.waiting()["worker"], 3);
        view.take(r#"{"seq":2,"ts":"t2","event":"StageEntered","stageId":"worker","index":0}"#);
        assert_eq!(view.waiting()["worker"], 2);
        assert_eq!(view.last_ts.as_deref(), Some("t2"));
        view.take(r#"{"seq":3,"ts":"t3","event":"SessionTurnEnd","turnId":"r/turn/2"}"#);
        assert!(view.waiting().is_empty());
    }
}
