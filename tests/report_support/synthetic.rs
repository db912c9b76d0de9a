//! A synthetic audit log of a wide fan-out, shaped like the ones
//! `troupe run stages/fanout` writes (the same events per sibling, the same
//! keys), for the report's tests and its bench. Included with `#[path]`.

use std::fmt::Write;

const RUN: &str = "01a2096b-ccc5-70f2-9350-99e5bbbd25c0";

/// `2026-01-02T03:04:05.000000Z` plus `us` microseconds (under a day).
fn ts(us: i64) -> String {
    let total = 3 * 3_600_000_000 + 4 * 60_000_000 + 5_000_000 + us;
    let (s, frac) = (total / 1_000_000, total % 1_000_000);
    format!(
        "2026-01-02T{:02}:{:02}:{:02}.{frac:06}Z",
        s / 3600,
        (s % 3600) / 60,
        s % 60
    )
}

/// A run of `plan`, then `width` `worker` siblings under `cap`, then a
/// `reduce` join. Sibling `i` takes 2–3 ms and starts when sibling
/// `i - cap` ends. Every 997th sibling has a retry; every 1009th is
/// cancelled instead of exiting. With `every_event`, twelve lines per
/// sibling as a real run writes (~3.3 KB); without, only the three the
/// report reads most (entered, assert, end).
pub fn fanout_log(width: usize, cap: usize, every_event: bool) -> String {
    let mut out = String::with_capacity(width * if every_event { 3300 } else { 700 } + 4096);
    let mut seq = 0u64;
    let mut line = |out: &mut String, us: i64, event: &str, rest: &str| {
        seq += 1;
        let _ = writeln!(
            out,
            "{{\"seq\":{seq},\"ts\":\"{}\",\"event\":\"{event}\",\"workflowRunId\":\"{RUN}\"{rest}}}",
            ts(us)
        );
    };
    let exec = |stage: &str| format!(",\"stageExecutionId\":\"{RUN}/{stage}/1\"");
    let usage = "\"usage\":{\"promptTokens\":57,\"completionTokens\":9,\"requests\":1}";
    line(
        &mut out,
        0,
        "WorkflowStarted",
        &format!(
            ",\"pipeline\":\"fanout\",\"entry\":\"plan\",\"parallelCap\":{cap},\"ctx\":{{\"width\":{width}}}"
        ),
    );
    let e = exec("plan");
    line(
        &mut out,
        10,
        "StageEntered",
        &format!("{e},\"stageId\":\"plan\",\"kind\":\"llm\",\"visit\":1"),
    );
    line(
        &mut out,
        4_000,
        "StageExited",
        &format!(
            "{e},\"stageId\":\"plan\",\"verdict\":\"ok\",\"capHit\":false,\"attemptCount\":1,{usage}"
        ),
    );
    let group_start = 4_100;
    line(
        &mut out,
        group_start,
        "SessionTurnStart",
        &format!(
            ",\"turnId\":\"{RUN}/turn/2\",\"stages\":[\"worker[{width}]\"],\"execution\":\"parallel\",\"width\":{width},\"cap\":{cap},\"join\":\"reduce\""
        ),
    );
    let mut ends: Vec<i64> = Vec::with_capacity(width);
    for i in 0..width {
        let start = if i >= cap {
            ends[i - cap] + 5
        } else {
            group_start + 20 + i as i64
        };
        let d = 2_000 + (i as i64 * 7_919) % 1_000;
        let end = start + d;
        ends.push(end);
        let e = exec(&format!("worker#{i}"));
        let head = format!("{e},\"stageId\":\"worker\"");
        line(
            &mut out,
            start,
            "StageEntered",
            &format!("{head},\"kind\":\"llm\",\"visit\":1,\"index\":{i}"),
        );
        if !every_event {
            let verdict = if i % 997 == 996 { "retry" } else { "ok" };
            let assert = format!("{head},\"verdict\":\"{verdict}\",\"attempt\":1");
            line(&mut out, end - 20, "StageAssertOutcome", &assert);
            let end_event = if i % 1009 == 1008 {
                "StageCancelled"
            } else {
                "StageExited"
            };
            line(
                &mut out,
                end,
                end_event,
                &format!("{head},\"verdict\":\"ok\""),
            );
            continue;
        }
        line(
            &mut out,
            start + 3,
            "StageCheckGateResult",
            &format!("{head},\"outcome\":\"proceed\",\"check\":1"),
        );
        line(
            &mut out,
            start + 5,
            "ProviderRequestStarted",
            &format!("{head},\"provider\":\"scripted\",\"turn\":1,\"try\":1"),
        );
        line(
            &mut out,
            start + d / 3,
            "ProviderRequestCompleted",
            &format!("{head},\"turn\":1,\"toolCalls\":1,{usage}"),
        );
        line(
            &mut out,
            start + d / 3 + 20,
            "ToolInvocationProposed",
            &format!(
                "{head},\"tool\":\"Echo\",\"callId\":\"call_1_0\",\"argsDigest\":\"e7b995efa755c5ff3b84d2188b58cb4ae916a59470eb3761df8a814f11763500\""
            ),
        );
        line(
            &mut out,
            start + d / 3 + 25,
            "ToolCallApproved",
            &format!("{head},\"tool\":\"Echo\",\"callId\":\"call_1_0\",\"by\":\"allowedTools\""),
        );
        line(
            &mut out,
            start + d / 3 + 30,
            "ToolInvocationStarted",
            &format!("{head},\"tool\":\"Echo\",\"callId\":\"call_1_0\""),
        );
        line(
            &mut out,
            start + d / 3 + 60,
            "ToolInvocationSucceeded",
            &format!("{head},\"tool\":\"Echo\",\"callId\":\"call_1_0\",\"bytes\":12"),
        );
        line(
            &mut out,
            start + d / 3 + 70,
            "ProviderRequestStarted",
            &format!("{head},\"provider\":\"scripted\",\"turn\":2,\"try\":1"),
        );
        line(
            &mut out,
            end - 40,
            "ProviderRequestCompleted",
            &format!("{head},\"turn\":2,\"toolCalls\":1,{usage}"),
        );
        let verdict = if i % 997 == 996 { "retry" } else { "ok" };
        line(
            &mut out,
            end - 20,
            "StageAssertOutcome",
            &format!("{head},\"verdict\":\"{verdict}\",\"attempt\":1,\"capHit\":false"),
        );
        if i % 1009 == 1008 {
            line(
                &mut out,
                end,
                "StageCancelled",
                &format!(
                    "{head},\"reason\":\"Cancellation/TurnCancelled\",\"phase\":\"Act\",\"attempt\":1,\"turn\":2,\"toolCalls\":[]"
                ),
            );
        } else {
            line(
                &mut out,
                end,
                "StageExited",
                &format!("{head},\"verdict\":\"ok\",\"capHit\":false,\"attemptCount\":1,{usage}"),
            );
        }
    }
    let last = ends.iter().copied().max().unwrap_or(group_start) + 50;
    let e = exec("reduce");
    line(
        &mut out,
        last,
        "StageEntered",
        &format!("{e},\"stageId\":\"reduce\",\"kind\":\"llm\",\"visit\":1"),
    );
    line(
        &mut out,
        last + 3_000,
        "StageExited",
        &format!(
            "{e},\"stageId\":\"reduce\",\"verdict\":\"ok\",\"capHit\":false,\"attemptCount\":1,{usage}"
        ),
    );
    line(
        &mut out,
        last + 3_100,
        "SessionTurnEnd",
        &format!(",\"turnId\":\"{RUN}/turn/2\""),
    );
    line(&mut out, last + 3_200, "WorkflowExit", ",\"status\":\"ok\"");
    out
}
