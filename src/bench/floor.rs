//! The floor: the `fanout` workload written directly on tokio — a JoinSet
//! under a Semaphore, serde_json, one jsonschema validator compiled once —
//! with no actors, no events and no audit log. Every headline number of
//! `troupe bench` and the criterion benches is a ratio against it.
//!
//! It does the same work per sibling as the runtime with the scripted
//! provider: each model turn's tool-call arguments are serialized to JSON
//! text and parsed back (as a real provider's reply would arrive), turn 1
//! runs the echo tool on `{"text": "item <i>"}`, turn 2 validates
//! `{"item": i, "summary": "done <i>"}` against the worker's completion
//! schema. A plan turn comes before the siblings and a join turn after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::WORKER_SCHEMA;

/// One floor run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorSpec {
    pub width: usize,
    pub cap: usize,
    /// Slept before every model turn's reply.
    pub latency: Duration,
    /// This sibling's first turn fails; the rest are aborted (fail-fast).
    pub fail: Option<usize>,
    /// Every other sibling waits this long before its first turn (keeps
    /// them in flight when `fail` fails: the cancellation bench).
    pub hold: Duration,
}

/// What a floor run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorReport {
    pub wall: Duration,
    /// Siblings that completed.
    pub ok: usize,
    /// The join's count (0 when a sibling failed: no join).
    pub joined: usize,
    /// From the failing sibling's error to every other sibling aborted and
    /// joined.
    pub cancel_latency: Option<Duration>,
}

/// Why the floor could not run.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error("the worker schema does not compile: {0}")]
    Schema(String),
    #[error("cannot start the tokio runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("the floor workload broke: {0}")]
    Workload(String),
}

/// The compiled schema, shared by every run.
#[derive(Debug, Clone)]
pub struct Floor {
    validator: Arc<jsonschema::Validator>,
}

impl Floor {
    /// Compiles the worker schema once.
    pub fn new() -> Result<Floor, FloorError> {
        let schema: Value =
            serde_json::from_str(WORKER_SCHEMA).map_err(|e| FloorError::Schema(e.to_string()))?;
        let validator =
            jsonschema::validator_for(&schema).map_err(|e| FloorError::Schema(e.to_string()))?;
        Ok(Floor {
            validator: Arc::new(validator),
        })
    }

    /// Runs once on a fresh multi-thread tokio runtime (what
    /// `#[tokio::main]` gives a plain program); the runtime is built
    /// outside the measured time.
    pub fn run_blocking(&self, spec: FloorSpec) -> Result<FloorReport, FloorError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_time()
            .build()?;
        rt.block_on(self.run(spec))
    }

    /// Runs once on the current tokio runtime.
    pub async fn run(&self, spec: FloorSpec) -> Result<FloorReport, FloorError> {
        let start = Instant::now();
        // Plan turn: the items list arrives as JSON text.
        turn_latency(spec.latency).await;
        let items: Vec<u64> = (0..spec.width as u64).collect();
        let reply = json!({ "items": items }).to_string();
        let plan: Value = parse(&reply)?;
        let items: Vec<u64> = plan
            .get("items")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();

        let slots = Arc::new(Semaphore::new(spec.cap.max(1)));
        let mut set = JoinSet::new();
        let mut results = Vec::with_capacity(items.len());
        let mut failed_at = None;
        let mut pending = items.into_iter().enumerate().peekable();
        loop {
            let more = pending.peek().is_some();
            tokio::select! {
                biased;
                // Finished siblings are joined as they end, so the set holds
                // at most `cap` tasks and a failure is seen at once.
                Some(done) = set.join_next(), if !set.is_empty() => {
                    if collect(done, &mut results)? {
                        failed_at = Some(Instant::now());
                        break;
                    }
                }
                // No task before its slot: waiting siblings cost nothing.
                permit = Arc::clone(&slots).acquire_owned(), if more => {
                    let permit = permit.map_err(|e| FloorError::Workload(e.to_string()))?;
                    let Some((index, item)) = pending.next() else { break };
                    let validator = Arc::clone(&self.validator);
                    let fail = spec.fail == Some(index);
                    let latency = spec.latency;
                    let hold = if fail { Duration::ZERO } else { spec.hold };
                    set.spawn(async move {
                        turn_latency(hold).await;
                        let out = worker(item, latency, fail, &validator).await;
                        drop(permit);
                        out
                    });
                }
                else => break,
            }
        }
        let mut cancel_latency = None;
        if let Some(at) = failed_at {
            set.abort_all();
            while set.join_next().await.is_some() {}
            cancel_latency = Some(at.elapsed());
        }
        let ok = results.len();
        let mut joined = 0;
        if failed_at.is_none() {
            // Join turn: count the results, reply as JSON text.
            turn_latency(spec.latency).await;
            let reply = json!({ "count": results.len() }).to_string();
            let summary: Value = parse(&reply)?;
            joined = summary
                .get("count")
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(0);
        }
        Ok(FloorReport {
            wall: start.elapsed(),
            ok,
            joined,
            cancel_latency,
        })
    }
}

/// Records a finished sibling; `true` when it failed.
fn collect(
    done: Result<Result<Value, String>, tokio::task::JoinError>,
    results: &mut Vec<Value>,
) -> Result<bool, FloorError> {
    match done {
        Ok(Ok(v)) => {
            results.push(v);
            Ok(false)
        }
        Ok(Err(_)) => Ok(true),
        Err(e) => Err(FloorError::Workload(e.to_string())),
    }
}

async fn turn_latency(latency: Duration) {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
}

fn parse(text: &str) -> Result<Value, FloorError> {
    serde_json::from_str(text).map_err(|e| FloorError::Workload(e.to_string()))
}

/// One sibling: the echo turn, then the completion turn.
async fn worker(
    item: u64,
    latency: Duration,
    fail: bool,
    validator: &jsonschema::Validator,
) -> Result<Value, String> {
    // Turn 1: the model calls Echo; its arguments arrive as JSON text.
    turn_latency(latency).await;
    if fail {
        return Err(format!("injected failure of sibling {item}"));
    }
    let arguments = json!({ "text": format!("item {item}") }).to_string();
    let args: Value = serde_json::from_str(&arguments).map_err(|e| e.to_string())?;
    let echoed = args
        .get("text")
        .and_then(Value::as_str)
        .ok_or("Echo needs `text`")?
        .to_owned();
    // Turn 2: the model calls the completion tool with the payload.
    turn_latency(latency).await;
    let arguments = json!({ "item": item, "summary": format!("done {item}") }).to_string();
    let parsed: Value = serde_json::from_str(&arguments).map_err(|e| e.to_string())?;
    if !validator.is_valid(&parsed) {
        return Err(format!("completion of item {item} fails its schema"));
    }
    if echoed.is_empty() {
        return Err("echo returned nothing".to_owned());
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sibling_completes_and_the_join_counts_them() {
        let floor = Floor::new().unwrap();
        let spec = FloorSpec {
            width: 50,
            cap: 4,
            latency: Duration::ZERO,
            fail: None,
            hold: Duration::ZERO,
        };
        let r = floor.run_blocking(spec).unwrap();
        assert_eq!((r.ok, r.joined, r.cancel_latency), (50, 50, None));
    }

    #[test]
    fn a_failing_sibling_aborts_the_rest_and_skips_the_join() {
        let floor = Floor::new().unwrap();
        let spec = FloorSpec {
            width: 50,
            cap: 4,
            latency: Duration::ZERO,
            fail: Some(3),
            hold: Duration::ZERO,
        };
        let r = floor.run_blocking(spec).unwrap();
        assert_eq!(r.joined, 0);
        assert!(r.ok < 50);
        assert!(r.cancel_latency.is_some());
    }
}
