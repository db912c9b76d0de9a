//! The `fanout` workload every bench measures: a worker's completion
//! schema and model turns, and the ideal wall time of a run with no
//! overhead at all.

/// The completion schema of a `fanout` worker (issue 6), also the one in
/// `stages/fanout/worker.md`.
pub const WORKER_SCHEMA: &str = r#"{"type":"object","required":["item","summary"],"properties":{"item":{"type":"integer"},"summary":{"type":"string"}}}"#;

/// Model turns of one `fanout` worker: the echo call, then the completion.
pub const WORKER_TURNS: u32 = 2;

/// The ideal wall time of a `fanout` run with `latency` per model turn and
/// no overhead at all: the plan turn, `ceil(width / cap)` waves of
/// `WORKER_TURNS` turns each, the join turn.
pub fn ideal_wall(width: usize, cap: usize, latency: std::time::Duration) -> std::time::Duration {
    let waves = width.div_ceil(cap.max(1));
    let turns = u32::try_from(waves)
        .unwrap_or(u32::MAX)
        .saturating_mul(WORKER_TURNS)
        .saturating_add(2);
    latency.saturating_mul(turns)
}
