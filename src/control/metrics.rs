//! `GET /metrics`: the server's runs in the Prometheus text format
//! (version 0.0.4), summed over every run it hosts, from their audit logs.
//! The names are documented in docs/control-api.md.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::hosted::{Counted, Hosted};
use super::logview::{Executions, Requests};

/// A label value with `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes one metric family: its help, its type and its samples.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// Everything summed over the runs.
#[derive(Default)]
struct Totals {
    runs: BTreeMap<String, u64>,
    stages: BTreeMap<String, Executions>,
    /// The `_total` series: of the runs let go, then of those hosted.
    counted: Counted,
    pending: u64,
    questions: u64,
    waiting: BTreeMap<String, u64>,
    /// The longest a running run's log has gone without an event.
    idle: f64,
    /// Records waiting for the runs' store writers.
    store_queued: u64,
}

pub async fn metrics(State(hosted): State<Arc<Hosted>>) -> Response {
    let mut t = Totals::default();
    for status in [
        "queued",
        "starting",
        "running",
        "refused",
        "ok",
        "failed",
        "cancelled",
    ] {
        t.runs.insert(status.to_owned(), 0);
    }
    // What the runs let go counted, and those still being counted: one
    // look, so that none is counted twice or missed.
    let leaving = {
        let retired = hosted.retired.lock().unwrap_or_else(|p| p.into_inner());
        t.counted = retired.counted.clone();
        retired.leaving.clone()
    };
    for run in leaving {
        t.counted.count(&run.view().await);
    }
    for run in hosted.all() {
        let view = run.view().await;
        *t.runs.entry(run.status(&view)).or_default() += 1;
        for (stage, e) in &view.stages {
            let s = t.stages.entry(stage.clone()).or_default();
            s.entered += e.entered;
            s.ok += e.ok;
            s.failed += e.failed;
            s.cancelled += e.cancelled;
        }
        t.counted.count(&view);
        t.store_queued += run.store_queued() as u64;
        let (pending, questions) = run.waiting().await;
        t.pending += pending as u64;
        t.questions += questions as u64;
        for (stage, n) in view.waiting() {
            *t.waiting.entry(stage).or_default() += n;
        }
        if view.status.is_none()
            && let Some(ts) = view
                .last_ts
                .as_deref()
                .and_then(crate::runtime::events::parse_rfc3339)
            && let Ok(age) = std::time::SystemTime::now().duration_since(ts)
        {
            t.idle = t.idle.max(age.as_secs_f64());
        }
    }
    let mut out = String::new();
    let runs: Vec<(String, u64)> = t
        .runs
        .iter()
        .map(|(s, n)| (format!("status=\"{}\"", label(s)), *n))
        .collect();
    family(
        &mut out,
        "troupe_runs",
        "gauge",
        "Runs this server hosts, by status.",
        &runs,
    );
    let mut executions = Vec::new();
    for (stage, e) in &t.stages {
        let stage = label(stage);
        for (state, n) in [
            ("running", e.running()),
            ("ok", e.ok),
            ("failed", e.failed),
            ("cancelled", e.cancelled),
        ] {
            executions.push((format!("stage=\"{stage}\",state=\"{state}\""), n));
        }
    }
    family(
        &mut out,
        "troupe_executions",
        "gauge",
        "Stage executions by stage and state (running, ok, failed, cancelled).",
        &executions,
    );
    let waiting: Vec<(String, u64)> = t
        .waiting
        .iter()
        .map(|(s, n)| (format!("stage=\"{}\"", label(s)), *n))
        .collect();
    family(
        &mut out,
        "troupe_executions_waiting",
        "gauge",
        "Siblings of open fan-outs waiting for a cap slot, by stage.",
        &waiting,
    );
    let by_model = |f: fn(&Requests) -> u64| -> Vec<(String, u64)> {
        t.counted
            .models
            .iter()
            .filter(|(m, _)| !m.is_empty())
            .map(|(m, r)| (format!("model=\"{}\"", label(m)), f(r)))
            .collect()
    };
    family(
        &mut out,
        "troupe_model_requests_total",
        "counter",
        "Model requests that completed, by model.",
        &by_model(|r| r.completed),
    );
    family(
        &mut out,
        "troupe_model_request_failures_total",
        "counter",
        "Model requests that failed (after their retries), by model.",
        &by_model(|r| r.failed),
    );
    family(
        &mut out,
        "troupe_provider_retries_total",
        "counter",
        "Model requests that were a retry, by model.",
        &by_model(|r| r.retries),
    );
    let mut tokens = Vec::new();
    for (m, r) in t.counted.models.iter().filter(|(m, _)| !m.is_empty()) {
        let m = label(m);
        tokens.push((format!("model=\"{m}\",kind=\"input\""), r.input_tokens));
        tokens.push((format!("model=\"{m}\",kind=\"output\""), r.output_tokens));
    }
    family(
        &mut out,
        "troupe_tokens_total",
        "counter",
        "Tokens by model and kind (input, output).",
        &tokens,
    );
    let _ = writeln!(
        out,
        "# HELP troupe_model_cost_usd_total US dollars spent, by model, priced by each run's --price or provider.prices (runs without a price are not counted).\n# TYPE troupe_model_cost_usd_total counter"
    );
    for (m, usd) in t.counted.cost.iter().filter(|(m, _)| !m.is_empty()) {
        let _ = writeln!(
            out,
            "troupe_model_cost_usd_total{{model=\"{}\"}} {usd:.9}",
            label(m)
        );
    }
    let tools: Vec<(String, u64)> = t
        .counted
        .tools
        .iter()
        .map(|((tool, outcome), n)| {
            (
                format!("tool=\"{}\",outcome=\"{outcome}\"", label(tool)),
                *n,
            )
        })
        .collect();
    family(
        &mut out,
        "troupe_tool_calls_total",
        "counter",
        "Tool calls by tool and outcome (ok, failed, cancelled, denied).",
        &tools,
    );
    family(
        &mut out,
        "troupe_waiting_answers",
        "gauge",
        "Approvals and human questions waiting for an API answer.",
        &[
            ("kind=\"approval\"".to_owned(), t.pending),
            ("kind=\"question\"".to_owned(), t.questions),
        ],
    );
    family(
        &mut out,
        "troupe_audit_events_total",
        "counter",
        "Events the runs' audit logs hold.",
        &[(String::new(), t.counted.events)],
    );
    family(
        &mut out,
        "troupe_store_queued_records",
        "gauge",
        "Execution records the runs' store writers have not yet committed (the store's lag behind the runs).",
        &[(String::new(), t.store_queued)],
    );
    let _ = writeln!(
        out,
        "# HELP troupe_audit_idle_seconds The longest a running run's audit log has gone without an event (a stuck run, or a writer behind).\n# TYPE troupe_audit_idle_seconds gauge\ntroupe_audit_idle_seconds {:.3}",
        t.idle
    );
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::control::hosted::{KEEP_ENDED, RunControl};

    async fn scrape(hosted: &Arc<Hosted>) -> String {
        let response = metrics(State(Arc::clone(hosted))).await;
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    fn sample(text: &str, name: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap()
    }

    /// A run let go past `KEEP_ENDED` keeps what it counted in the
    /// `_total` series: a counter that went down would read as a reset.
    #[tokio::test]
    async fn counters_keep_what_the_runs_let_go_counted() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(crate::auditlog::FILE);
        let mut writer =
            crate::auditlog::Compressed::create(std::fs::File::create(&log).unwrap()).unwrap();
        writer
            .write_lines(b"{\"seq\":1,\"ts\":\"2026-11-28T10:00:00Z\",\"event\":\"WorkflowStarted\",\"workflowRunId\":\"r\"}\n{\"seq\":2,\"ts\":\"2026-11-28T10:00:01Z\",\"event\":\"WorkflowExit\",\"workflowRunId\":\"r\",\"status\":\"ok\"}\n")
            .unwrap();
        writer.finish().unwrap();
        let hosted = Arc::new(Hosted::new(None));
        let run = |i: usize| {
            let run = Arc::new(RunControl::new(
                &format!("run-{i:06}"),
                "p",
                &log,
                None,
                None,
            ));
            run.end();
            run
        };
        for i in 0..KEEP_ENDED {
            hosted.add(run(i));
        }
        let before = sample(&scrape(&hosted).await, "troupe_audit_events_total");
        assert_eq!(before, 2 * KEEP_ENDED as u64);
        hosted.add(run(KEEP_ENDED));
        assert_eq!(hosted.ids().len(), KEEP_ENDED, "the oldest was let go");
        let after = sample(&scrape(&hosted).await, "troupe_audit_events_total");
        assert_eq!(after, before + 2);
        // Counted once, not again on the next scrape.
        assert_eq!(
            sample(&scrape(&hosted).await, "troupe_audit_events_total"),
            after
        );
    }
}
