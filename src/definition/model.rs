//! The typed, immutable pipeline model that loading produces and the runtime
//! reads. Nothing here is parsed lazily: expressions, templates and schemas
//! are compiled at load.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::expr::Expr;
use super::schema::Schema;
use super::template::Template;

/// Default parallel cap when neither the CLI nor `pipeline.yaml` sets one.
pub const DEFAULT_PARALLEL_CAP: usize = 8;

/// Default loop guard when `pipeline.yaml` sets no `maxVisits`: a stage
/// entered more often fails the run. A loop without a guard ran until the
/// disk filled (a `review → plan` loop wrote 435 MB of audit log in three
/// seconds); 25 matches the recursion limit agent frameworks such as
/// LangGraph default to, and a pipeline that loops longer says so.
pub const DEFAULT_MAX_VISITS: u32 = 25;

/// ctx names the runtime provides; a pipeline may not declare them.
pub const RESERVED_CTX: [&str; 6] = [
    "upstream",
    "results",
    "workflowRunId",
    "stageExecutionId",
    "item",
    "index",
];

/// ctx names that exist at run time but are not addressable from templates
/// or expressions.
pub const FORBIDDEN_CTX: [&str; 2] = ["attempts", "host"];

/// A loaded pipeline (the state machine).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pipeline {
    pub id: String,
    pub name: String,
    #[serde(skip)]
    pub dir: PathBuf,
    pub entry: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_cap: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_visits: Option<u32>,
    pub ctx: Vec<CtxField>,
    pub stages: Vec<Stage>,
    pub next: BTreeMap<String, Next>,
    #[serde(rename = "assert", skip_serializing_if = "BTreeMap::is_empty")]
    pub asserts: BTreeMap<String, Vec<Expr>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gates: BTreeMap<String, Gate>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<super::hooks::HookDef>,
    /// The optional `provider:` block: defaults for `troupe run`, which its
    /// flags override.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderBlock>,
    /// MCP servers whose tools stages may use (`mcpServers:`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<super::mcp::McpServerDef>,
}

/// Which model provider runs the LLM stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Offline, deterministic: `script.yaml` or synthesized payloads.
    Scripted,
    /// Any OpenAI-compatible `/v1/chat/completions` endpoint.
    Openai,
}

/// `provider:` in pipeline.yaml. Every field is optional; the API key is
/// never in the file, only the name of the variable that holds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderBlock {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<ProviderKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<usize>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_opt_duration"
    )]
    pub request_timeout: Option<Duration>,
    /// The run's budget in tokens (prompt + completion), `--max-tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The run's budget in US dollars, `--max-cost`; needs the model's price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Prices per model, in US dollars per million tokens.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
}

/// What a model costs, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

impl Price {
    /// The cost of `input` prompt and `output` completion tokens.
    pub fn cost(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input + output as f64 * self.output) / 1_000_000.0
    }
}

fn ser_opt_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_duration(d, s),
        None => s.serialize_none(),
    }
}

impl Pipeline {
    pub fn stage(&self, id: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.id == id)
    }

    /// The cap for fan-outs: CLI flag, then `pipeline.yaml`, then 8.
    pub fn effective_cap(&self, cli: Option<usize>) -> usize {
        cli.or(self.parallel_cap)
            .unwrap_or(DEFAULT_PARALLEL_CAP)
            .max(1)
    }

    /// The loop guard: `maxVisits`, else [`DEFAULT_MAX_VISITS`]. A stage
    /// entered more often fails the run.
    pub fn effective_max_visits(&self) -> u32 {
        self.max_visits.unwrap_or(DEFAULT_MAX_VISITS)
    }

    /// The Next() entry for a stage; `None` means terminal.
    pub fn next_of(&self, stage: &str) -> Option<&Next> {
        self.next.get(stage)
    }

    pub fn llm_stage_count(&self) -> usize {
        self.stages
            .iter()
            .filter(|s| matches!(s.kind, StageKind::Llm(_)))
            .count()
    }
}

/// A ctx field the pipeline accepts (`ctx:` in pipeline.yaml).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CtxField {
    pub name: String,
    pub required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One node of the pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    pub id: String,
    #[serde(flatten)]
    pub kind: StageKind,
}

/// What a stage does: call a model, or one deterministic step.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StageKind {
    Llm(Arc<StageDefinition>),
    ExtractJson {
        from: Expr,
    },
    Print {
        content: Template,
    },
    IfElse {
        condition: Expr,
        then: String,
        #[serde(rename = "else")]
        otherwise: String,
    },
    Switch {
        on: Expr,
        cases: Vec<(String, String)>,
        #[serde(skip_serializing_if = "Option::is_none")]
        default: Option<String>,
    },
    /// Calls a built-in or MCP tool with templated arguments, no model:
    /// every string in `args` is a template (`"{{ctx.dir}}"` alone keeps
    /// the value's type).
    Tool {
        tool: String,
        args: serde_json::Value,
    },
    /// Computes named values with CEL; `parsed` is their object.
    Transform {
        set: Vec<(String, Expr)>,
    },
    /// Asks a person (through the run's interactors) to fill a form;
    /// `parsed` is the answer, which must match `fields`.
    Human {
        prompt: Template,
        fields: super::schema::Schema,
        /// How long to wait; `None` waits as long as the run does.
        #[serde(skip)]
        timeout: Option<Duration>,
        /// Unanswered in time (or no one to ask): fail or skip the step.
        otherwise: HumanOtherwise,
    },
}

/// What an unanswered human step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HumanOtherwise {
    Fail,
    Skip,
}

impl StageKind {
    pub fn kind_name(&self) -> &'static str {
        match self {
            StageKind::Llm(_) => "llm",
            StageKind::ExtractJson { .. } => "extract_json",
            StageKind::Print { .. } => "print",
            StageKind::IfElse { .. } => "if_else",
            StageKind::Switch { .. } => "switch",
            StageKind::Tool { .. } => "tool",
            StageKind::Transform { .. } => "transform",
            StageKind::Human { .. } => "human",
        }
    }

    /// `if_else` and `switch` route by themselves and have no `next` entry.
    pub fn is_router(&self) -> bool {
        matches!(self, StageKind::IfElse { .. } | StageKind::Switch { .. })
    }
}

/// An LLM stage definition (a `*.md` file).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageDefinition {
    pub id: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub allowed_tools: Vec<String>,
    /// Shared with every model request of the stage's executions.
    pub completion_tool: Arc<str>,
    pub completion_schema: Schema,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs_schema: Option<Schema>,
    pub retry_policy: RetryPolicy,
    pub turn_cap: u32,
    pub resolution_policy: ResolutionPolicy,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// `network: deny`: this stage's shells may open no TCP connection.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub network_deny: bool,
    pub body: Template,
    pub file: PathBuf,
    /// Line of the body's first line in `file`, to locate placeholders.
    #[serde(skip)]
    pub body_line: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub backoff: Backoff,
}

/// Wait before a retry (or a CheckGate re-check).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Backoff {
    None,
    Fixed(#[serde(serialize_with = "ser_duration")] Duration),
    Exponential {
        #[serde(serialize_with = "ser_duration")]
        initial: Duration,
        #[serde(serialize_with = "ser_duration")]
        max: Duration,
    },
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&super::duration::format_duration(*d))
}

impl Backoff {
    /// The wait before retry number `retry` (1 = the first retry).
    pub fn delay(&self, retry: u32) -> Duration {
        match *self {
            Backoff::None => Duration::ZERO,
            Backoff::Fixed(d) => d,
            Backoff::Exponential { initial, max } => {
                let factor = 2u32.saturating_pow(retry.saturating_sub(1));
                initial.saturating_mul(factor).min(max)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResolutionPolicy {
    RetryLater,
    Fail,
    Skip,
}

/// The Next() table entry of a stage.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Next {
    End,
    Stage(String),
    Parallel(ParallelPlan),
}

#[derive(Debug, Clone, Serialize)]
pub struct ParallelPlan {
    pub siblings: Siblings,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<String>,
    /// This fan-out's own cap (`cap:` on its `next` entry); the run's cap
    /// still bounds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap: Option<usize>,
}

impl ParallelPlan {
    /// The most siblings of this fan-out running at once: its own cap,
    /// never more than the run's.
    pub fn effective_cap(&self, run_cap: usize) -> usize {
        self.cap.map_or(run_cap, |c| c.min(run_cap)).max(1)
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Siblings {
    Static(Vec<String>),
    Map { stage: String, over: Expr },
}

impl Siblings {
    /// The stage ids the siblings run: the listed ones, or the one `map`
    /// stage every sibling runs.
    pub fn stages(&self) -> &[String] {
        match self {
            Siblings::Static(ids) => ids,
            Siblings::Map { stage, .. } => std::slice::from_ref(stage),
        }
    }
}

/// A CheckGate: proceed when `when` is true, otherwise `otherwise`.
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    pub when: Expr,
    pub otherwise: GateOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GateOutcome {
    Defer,
    Block,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_doubles_up_to_max() {
        let b = Backoff::Exponential {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
        };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(3), Duration::from_millis(350));
        assert_eq!(b.delay(60), Duration::from_millis(350));
    }
}
