//! StageContext: what a stage execution may read through `ctx.*` and
//! `stage.*` in its templates and expressions. Built at
//! Setup from shared, immutable pieces so a 100 000-wide fan-out does not
//! copy the state slot per sibling.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::result::Kept;
use crate::definition::expr::{Expr, ExprError};
use crate::definition::template::{Segment, lookup};
use crate::provider::TemplateScope;

/// Everything a stage execution can read through `ctx.*` and `stage.*`:
/// its own ids and item, and (read through it, by `Deref`) what the
/// executions of its stage in its turn share.
#[derive(Debug, Clone)]
pub struct StageContext {
    pub shared: Arc<SharedContext>,
    pub stage_execution_id: Arc<str>,
    pub item: Option<Value>,
    pub index: Option<usize>,
}

/// What every execution of one stage in one turn shares, behind one
/// `Arc`: a reference count is a cache line, and each shared `Arc` a
/// sibling's context cloned was written by the scheduler's thread at its
/// start and by an arbiter at its end. Six such lines per sibling, each
/// bouncing between cores, became one.
#[derive(Debug)]
pub struct SharedContext {
    /// Declared ctx fields with their run values (CLI `--ctx` and defaults).
    pub fields: Arc<Map<String, Value>>,
    /// Predecessor results: one for a sequential successor, one per sibling
    /// (plan order) for a join, empty for the entry stage and siblings.
    pub upstream: Arc<Vec<Kept>>,
    /// The state slot: the latest result of every finished stage.
    pub results: Arc<BTreeMap<String, Kept>>,
    pub workflow_run_id: Arc<str>,
    pub stage_id: Arc<str>,
    pub stage_name: Arc<str>,
}

impl std::ops::Deref for StageContext {
    type Target = SharedContext;

    fn deref(&self) -> &SharedContext {
        &self.shared
    }
}

impl StageContext {
    /// Resolves a placeholder path (`ctx.…` or `stage.…`).
    pub fn resolve(&self, path: &[Segment]) -> Result<Value, String> {
        let key = |i: usize| match path.get(i) {
            Some(Segment::Key(k)) => Some(k.as_str()),
            _ => None,
        };
        match (key(0), key(1)) {
            (Some("stage"), Some("id")) if path.len() == 2 => Ok(Value::from(&*self.stage_id)),
            (Some("stage"), Some("name")) if path.len() == 2 => Ok(Value::from(&*self.stage_name)),
            (Some("ctx"), Some("upstream")) => match path.get(2) {
                None => Ok(Value::Array(
                    self.upstream.iter().map(Kept::to_json).collect(),
                )),
                Some(Segment::Index(i)) => {
                    let result = self.upstream.get(*i).ok_or_else(|| {
                        format!(
                            "`ctx.upstream[{i}]` is out of range (length {})",
                            self.upstream.len()
                        )
                    })?;
                    resolve_in_result(result, &path[3..])
                }
                Some(Segment::Key(k)) => {
                    Err(format!("`ctx.upstream.{k}`: upstream is a list; index it"))
                }
            },
            (Some("ctx"), Some("results")) => match path.get(2) {
                None => Ok(Value::Object(
                    self.results
                        .iter()
                        .map(|(k, r)| (k.clone(), r.to_json()))
                        .collect(),
                )),
                Some(Segment::Key(stage)) => {
                    let result = self.results.get(stage).ok_or_else(|| {
                        format!("`ctx.results.{stage}` is not set (that stage has not finished)")
                    })?;
                    resolve_in_result(result, &path[3..])
                }
                Some(Segment::Index(i)) => Err(format!(
                    "`ctx.results[{i}]`: results are keyed by stage id; name one"
                )),
            },
            (Some("ctx"), Some("workflowRunId")) => {
                sub(Value::from(&*self.workflow_run_id), &path[2..])
            }
            (Some("ctx"), Some("stageExecutionId")) => {
                sub(Value::from(&*self.stage_execution_id), &path[2..])
            }
            (Some("ctx"), Some("item")) => {
                let item = self
                    .item
                    .clone()
                    .ok_or("`ctx.item` is only set in map siblings")?;
                sub(item, &path[2..])
            }
            (Some("ctx"), Some("index")) => {
                let index = self
                    .index
                    .ok_or("`ctx.index` is only set in map siblings")?;
                sub(Value::from(index), &path[2..])
            }
            (Some("ctx"), Some(field)) => {
                let value = self
                    .fields
                    .get(field)
                    .ok_or_else(|| format!("`ctx.{field}` is not set"))?;
                lookup(value, &path[2..]).cloned()
            }
            _ => Err("only ctx.* and stage.* are addressable".to_owned()),
        }
    }

    /// Evaluates `expr` with `ctx` bound to this context. A plain path
    /// under `ctx` (a fan-out's `over: ctx.upstream[0].parsed.items`) is
    /// read through [`StageContext::resolve`]: the value CEL would be
    /// handed holds each upstream result whole, serialized again, and a
    /// million items were three copies at once (BENCHMARKS.md, twenty-third
    /// round). A path that does not resolve is evaluated as before, for
    /// CEL's own message.
    pub fn eval(&self, expr: &Expr) -> Result<Value, ExprError> {
        if let Some(found) = expr.path_under("ctx").and_then(|p| self.resolve(&p).ok()) {
            return Ok(found);
        }
        let value = self.to_expr_value(expr.source());
        expr.eval(&[("ctx", &value)])
    }

    /// The `ctx` value that expressions see. `upstream` and `results` are
    /// included only when `source` mentions them: materialising them for
    /// every sibling of a wide fan-out would be quadratic.
    pub fn to_expr_value(&self, source: &str) -> Value {
        let mut ctx: Map<String, Value> = (*self.fields).clone();
        if source.contains("upstream") {
            ctx.insert(
                "upstream".into(),
                Value::Array(self.upstream.iter().map(Kept::to_json).collect()),
            );
        }
        if source.contains("results") {
            ctx.insert(
                "results".into(),
                Value::Object(
                    self.results
                        .iter()
                        .map(|(k, r)| (k.clone(), r.to_json()))
                        .collect(),
                ),
            );
        }
        ctx.insert("workflowRunId".into(), Value::from(&*self.workflow_run_id));
        ctx.insert(
            "stageExecutionId".into(),
            Value::from(&*self.stage_execution_id),
        );
        if let Some(item) = &self.item {
            ctx.insert("item".into(), item.clone());
        }
        if let Some(index) = self.index {
            ctx.insert("index".into(), Value::from(index));
        }
        Value::Object(ctx)
    }
}

/// Providers that template their replies (scripted) read the context
/// through this, without naming the runtime.
impl TemplateScope for StageContext {
    fn resolve(&self, path: &[Segment]) -> Result<Value, String> {
        StageContext::resolve(self, path)
    }
}

fn sub(value: Value, rest: &[Segment]) -> Result<Value, String> {
    lookup(&value, rest).cloned()
}

/// Looks into a kept result without serialising it whole: `parsed` or
/// `output` alone is all a packed one parses again.
fn resolve_in_result(result: &Kept, rest: &[Segment]) -> Result<Value, String> {
    match rest.first() {
        Some(Segment::Key(k)) if k == "parsed" => taken(result.parsed(), &rest[1..]),
        Some(Segment::Key(k)) if k == "output" => taken(result.output(), &rest[1..]),
        _ => lookup(&result.to_json(), rest).cloned(),
    }
}

/// The value at `path` in `value`: moved out when this is the value's only
/// holder (a packed result's, parsed again for this look), else copied.
fn taken(value: Arc<Value>, path: &[Segment]) -> Result<Value, String> {
    match Arc::try_unwrap(value) {
        Ok(mut owned) => {
            lookup(&owned, path)?;
            let mut at = &mut owned;
            for segment in path {
                let next = match segment {
                    Segment::Key(k) => at.get_mut(k.as_str()),
                    Segment::Index(i) => at.get_mut(*i),
                };
                at = next.ok_or("the path looked up just above")?;
            }
            Ok(at.take())
        }
        Err(shared) => lookup(&shared, path).cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::template::Template;
    use crate::runtime::result::StageResult;
    use serde_json::json;

    fn ctx() -> StageContext {
        let prior = StageResult::ok(
            "plan",
            "r/plan/1",
            json!({"summary": "s", "steps": ["a", "b"]}),
        );
        let prior = Arc::new(prior);
        let mut fields = Map::new();
        fields.insert("task".into(), json!("fix it"));
        fields.insert("width".into(), json!(3));
        // Upstream packed, as a join reads its siblings; the slot whole.
        let packed = Kept::packed(Arc::clone(&prior), "plan".into(), "r/plan/1".into());
        assert!(matches!(packed, Kept::Packed(_)));
        StageContext {
            shared: Arc::new(SharedContext {
                fields: Arc::new(fields),
                upstream: Arc::new(vec![packed]),
                results: Arc::new(BTreeMap::from([("plan".to_owned(), Kept::Whole(prior))])),
                workflow_run_id: "r".into(),
                stage_id: "worker".into(),
                stage_name: "Worker".into(),
            }),
            stage_execution_id: "r/worker#2/1".into(),
            item: Some(json!(7)),
            index: Some(2),
        }
    }

    #[test]
    fn renders_every_namespace() {
        let t = Template::parse(
            "{{ctx.task}}|{{ctx.width}}|{{ctx.upstream[0].parsed.steps}}|{{ctx.results.plan.verdict}}|{{ctx.item}}#{{ctx.index}}|{{stage.name}}|{{ctx.stageExecutionId}}",
        )
        .unwrap();
        let c = ctx();
        assert_eq!(
            t.render_with(|p| c.resolve(p)).unwrap(),
            r#"fix it|3|["a","b"]|ok|7#2|Worker|r/worker#2/1"#
        );
    }

    #[test]
    fn missing_values_are_render_errors() {
        let c = ctx();
        for src in [
            "{{ctx.upstream[1].parsed}}",
            "{{ctx.results.nope}}",
            "{{ctx.upstream[0].parsed.nope}}",
            "{{ctx.results[0]}}",
        ] {
            let t = Template::parse(src).unwrap();
            assert!(t.render_with(|p| c.resolve(p)).is_err(), "{src}");
        }
    }

    #[test]
    fn single_placeholder_keeps_its_type() {
        let c = ctx();
        let t = Template::parse("{{ctx.index}}").unwrap();
        assert_eq!(t.render_value(|p| c.resolve(p)).unwrap(), json!(2));
        let t = Template::parse("done {{ctx.index}}").unwrap();
        assert_eq!(t.render_value(|p| c.resolve(p)).unwrap(), json!("done 2"));
    }

    /// An expression that is a plain path under `ctx` reads, through
    /// `resolve`, what it read before in the value expressions are handed
    /// (`to_expr_value`, walked by `Expr::eval`): from a packed result
    /// (parsed again for the look, and moved out of it) and from a whole
    /// one (copied, and left as it was), `parsed` and an `output` that
    /// differs from it. One that does not resolve is evaluated as before,
    /// and fails as it did.
    #[test]
    fn a_path_expression_reads_what_it_read_before() {
        let mut c = ctx();
        let mut tool = StageResult::ok("tool", "r/tool/1", json!({"kept": [1, 2]}));
        tool.output = Arc::new(json!({"raw": "text", "kept": [3]}));
        let tool = Arc::new(tool);
        let packed = Kept::packed(Arc::clone(&tool), "tool".into(), "r/tool/1".into());
        let mut results = (*c.results).clone();
        results.insert("tool".into(), Kept::Whole(tool));
        c.shared = Arc::new(SharedContext {
            upstream: Arc::new(vec![c.upstream[0].clone(), packed]),
            results: Arc::new(results),
            fields: Arc::clone(&c.fields),
            workflow_run_id: Arc::clone(&c.workflow_run_id),
            stage_id: Arc::clone(&c.stage_id),
            stage_name: Arc::clone(&c.stage_name),
        });
        let reads = [
            "ctx.upstream[1].parsed.kept",
            "ctx.upstream[1].output.kept",
            "ctx.upstream[1].output.raw",
            "ctx.results.tool.output",
            "ctx.results.tool.parsed.kept[1]",
            "ctx.upstream[0].parsed.steps",
            "ctx.upstream[0].parsed",
            "ctx.upstream[0].output.summary",
            "ctx.upstream[0].verdict",
            "ctx.upstream",
            "ctx.results.plan.parsed.steps",
            "ctx.results.plan.verdict",
            "ctx.width",
            "ctx.item",
            "ctx.index",
            "ctx.stageExecutionId",
        ];
        for src in reads {
            let expr = Expr::compile(src).unwrap();
            let path = expr.path_under("ctx").expect("a plain path");
            assert!(c.resolve(&path).is_ok(), "read through resolve: {src}");
            let slow = expr.eval(&[("ctx", &c.to_expr_value(src))]).unwrap();
            assert_eq!(c.eval(&expr).unwrap(), slow, "{src}");
        }
        assert_eq!(c.results["plan"].parsed()["steps"], json!(["a", "b"]));
        assert_eq!(c.results["tool"].output()["kept"], json!([3]));
        assert_eq!(c.upstream[0].parsed()["steps"], json!(["a", "b"]));
        let misses = [
            "ctx.upstream[2].parsed",
            "ctx.upstream[0].parsed.nope",
            "ctx.upstream[0].parsed.steps[5]",
            "ctx.upstream[0].parsed.summary.x",
            "ctx.upstream[0].parsed.steps.x",
            "ctx.upstream.x",
            "ctx.results.nope.parsed",
            "ctx.results[0]",
            "ctx.results[0].parsed",
            "ctx.task.x",
            "ctx.task[0]",
        ];
        let fails_as_before = |c: &StageContext, src: &str| {
            let expr = Expr::compile(src).unwrap();
            let slow = expr.eval(&[("ctx", &c.to_expr_value(src))]);
            assert!(slow.is_err(), "{src}");
            assert_eq!(c.eval(&expr), slow, "{src}");
        };
        for src in misses {
            fails_as_before(&c, src);
        }
        // `ctx` alone is no path `resolve` reads: the value as before.
        let whole = Expr::compile("ctx").unwrap();
        let slow = whole.eval(&[("ctx", &c.to_expr_value("ctx"))]).unwrap();
        assert_eq!(c.eval(&whole).unwrap(), slow);
        // Unset outside a map's siblings: both miss.
        c.item = None;
        c.index = None;
        for src in ["ctx.item", "ctx.index"] {
            fails_as_before(&c, src);
        }
        let not_a_path = Expr::compile("size(ctx.upstream)").unwrap();
        assert_eq!(not_a_path.path_under("ctx"), None);
        assert_eq!(c.eval(&not_a_path).unwrap(), json!(2));
    }

    #[test]
    fn expression_value_omits_unmentioned_heavy_fields() {
        let c = ctx();
        let v = c.to_expr_value("ctx.width > 1");
        assert!(v.get("upstream").is_none() && v.get("results").is_none());
        let v = c.to_expr_value("size(ctx.upstream) == 1");
        assert_eq!(v["upstream"][0]["parsed"]["summary"], "s");
    }
}
