//! Starting a run: resolving ctx values from flags and defaults, building the
//! run spec, and starting the session actor inside an actix system.

use std::sync::Arc;

use actix::prelude::*;
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use troupe_actors::EventBus;

use super::audit::Sink;
use super::ids::RunId;
use super::session::{Session, ToSession};
use super::spec::RunSpec;
use super::stage::RunSettings;
use super::summary::RunReport;
use crate::definition::Pipeline;
use crate::error::{Diagnostic, ValidationCode};
use crate::provider::Provider;

/// Parses `key=value`; the value is JSON when it parses as JSON (numbers,
/// booleans, lists, objects), otherwise the raw string.
pub fn parse_ctx_pair(pair: &str) -> Result<(String, Value), String> {
    let (key, raw) = pair
        .split_once('=')
        .ok_or_else(|| format!("`{pair}`: expected key=value"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("`{pair}`: the key is empty"));
    }
    let value = match serde_json::from_str::<Value>(raw) {
        Ok(
            v @ (Value::Number(_)
            | Value::Bool(_)
            | Value::Array(_)
            | Value::Object(_)
            | Value::Null),
        ) => v,
        _ => Value::String(raw.to_owned()),
    };
    Ok((key.to_owned(), value))
}

/// The run's ctx fields: defaults, then `--ctx` values, then `--task`.
/// Undeclared keys and missing required fields are errors.
pub fn resolve_fields(
    pipeline: &Pipeline,
    pairs: &[(String, Value)],
    task: Option<&str>,
) -> Result<Map<String, Value>, Vec<Diagnostic>> {
    let mut fields = Map::new();
    let mut errors = Vec::new();
    let declared: Vec<&str> = pipeline.ctx.iter().map(|f| f.name.as_str()).collect();
    let invalid = |message: String, hint: String| {
        Diagnostic::new(ValidationCode::InputInvalid, message).hint(hint)
    };
    for f in &pipeline.ctx {
        if let Some(d) = &f.default {
            fields.insert(f.name.clone(), d.clone());
        }
    }
    let task_pair = task.map(|t| ("task".to_owned(), Value::String(t.to_owned())));
    for (key, value) in pairs.iter().chain(task_pair.iter()) {
        if declared.contains(&key.as_str()) {
            fields.insert(key.clone(), value.clone());
        } else {
            let flag = if key == "task" && task.is_some() {
                "--task".to_owned()
            } else {
                format!("--ctx {key}=…")
            };
            errors.push(invalid(
                format!(
                    "{flag}: pipeline `{}` declares no ctx field `{key}`",
                    pipeline.id
                ),
                format!(
                    "declared ctx fields: {}",
                    if declared.is_empty() {
                        "none".to_owned()
                    } else {
                        declared.join(", ")
                    }
                ),
            ));
        }
    }
    for f in &pipeline.ctx {
        if f.required && !fields.contains_key(&f.name) {
            let how = if f.name == "task" {
                "--task \"…\"".to_owned()
            } else {
                format!("--ctx {}=…", f.name)
            };
            errors.push(invalid(
                format!("ctx field `{}` is required", f.name),
                format!("pass {how}"),
            ));
        }
    }
    if errors.is_empty() {
        Ok(fields)
    } else {
        Err(errors)
    }
}

impl RunSpec {
    /// A spec with a fresh run id, its own bus and default settings.
    pub fn new(
        pipeline: Arc<Pipeline>,
        fields: Map<String, Value>,
        provider: Arc<dyn Provider>,
        cap: Option<usize>,
    ) -> RunSpec {
        let cap = pipeline.effective_cap(cap);
        crate::tools::args::prepare();
        let hooks = Arc::new(super::hooks::HookSet::from_defs(
            &pipeline.hooks,
            &pipeline.dir,
        ));
        RunSpec {
            pipeline,
            run_id: RunId::new(),
            fields: Arc::new(fields),
            provider,
            bus: EventBus::new(),
            settings: Arc::new(RunSettings::default()),
            cap,
            cancel: super::cancel::CancelScope::root(),
            max_run_time: None,
            interactors: Vec::new(),
            approval_timeout: None,
            hooks,
            restore: Default::default(),
            executor: None,
        }
    }
}

/// Starts a run; call inside an actix `System`. The receiver yields the
/// report once the run is over and every sink has flushed.
pub fn start_run(spec: RunSpec, sinks: Vec<Sink>) -> (Addr<Session>, oneshot::Receiver<RunReport>) {
    let (tx, rx) = oneshot::channel();
    let session = Session::new(spec, sinks).start();
    session.do_send(ToSession::Start { reply: tx });
    (session, rx)
}
