//! The end-of-run report: status, verdicts per stage, retries, cap hits,
//! fan-out figures, usage and wall time — printed by `troupe run`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::result::Kept;
use crate::provider::Usage;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum RunStatus {
    Ok,
    Failed { reason: String },
    Cancelled,
}

/// Counts per stage id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageStats {
    pub ok: u64,
    pub failed: u64,
    pub skipped: u64,
    pub cancelled: u64,
    pub retries: u64,
    pub cap_hits: u64,
}

/// Figures of one parallel group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupStats {
    pub turn_id: String,
    pub stage: String,
    pub width: usize,
    pub cap: usize,
    pub peak_running: usize,
    /// Siblings that waited for a slot.
    pub cap_waits: usize,
    pub cancelled: usize,
    /// Siblings spawned but never started when the group failed.
    pub withdrawn: usize,
    /// Siblings that never started: withdrawn, plus those never spawned
    /// because the group was decided first.
    pub never_started: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_sibling: Option<String>,
    /// Siblings not run again because a resumed run had their results.
    #[serde(skip_serializing_if = "is_zero")]
    pub restored: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Everything `troupe run` reports at the end.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    pub run_id: String,
    pub pipeline: String,
    #[serde(flatten)]
    pub status: RunStatus,
    /// Per stage, in the order the pipeline declares its stages (a JSON
    /// object keyed by stage id, in that order).
    #[serde(serialize_with = "ser_ordered")]
    pub stages: Vec<(String, StageStats)>,
    pub groups: Vec<GroupStats>,
    pub usage: Usage,
    #[serde(serialize_with = "ser_ms", rename = "wallMs")]
    pub wall: Duration,
    /// Spent vs budget, when the run had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::limits::BudgetReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_path: Option<PathBuf>,
    /// What went wrong without failing the run (an event sink that could
    /// not write); the CLI prints them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The state slot at the end: latest result per stage.
    #[serde(skip)]
    pub results: BTreeMap<String, Kept>,
    /// Every StageResult of the run, in the order the executions ended.
    #[serde(rename = "results")]
    pub all_results: Vec<Kept>,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

fn ser_ordered<S: serde::Serializer>(
    stages: &[(String, StageStats)],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(stages.len()))?;
    for (id, stats) in stages {
        map.serialize_entry(id, stats)?;
    }
    map.end()
}

/// A wall time as people read it: milliseconds below a second, seconds
/// with three decimals above.
pub fn human_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        let ms = d.as_secs_f64() * 1000.0;
        if ms < 10.0 {
            format!("{ms:.2}ms")
        } else {
            format!("{ms:.0}ms")
        }
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

impl RunReport {
    /// The counts of one stage.
    pub fn stage(&self, id: &str) -> Option<&StageStats> {
        self.stages
            .iter()
            .find(|(s, _)| s == id)
            .map(|(_, stats)| stats)
    }

    /// The human summary.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let status = match &self.status {
            RunStatus::Ok => "ok".to_owned(),
            RunStatus::Failed { reason } => format!("FAILED — {reason}"),
            RunStatus::Cancelled => "CANCELLED".to_owned(),
        };
        let _ = writeln!(out, "run {} of {}: {status}", self.run_id, self.pipeline);
        let _ = writeln!(
            out,
            "{:<20} {:>7} {:>6} {:>8} {:>10} {:>8} {:>8}",
            "stage", "ok", "fail", "skipped", "cancelled", "retries", "capHits"
        );
        for (id, s) in &self.stages {
            let _ = writeln!(
                out,
                "{id:<20} {:>7} {:>6} {:>8} {:>10} {:>8} {:>8}",
                s.ok, s.failed, s.skipped, s.cancelled, s.retries, s.cap_hits
            );
        }
        for g in &self.groups {
            let _ = write!(
                out,
                "fan-out {}: {} siblings, cap {}, peak {} running, {} waited for a slot",
                g.stage, g.width, g.cap, g.peak_running, g.cap_waits
            );
            if g.restored > 0 {
                let _ = write!(out, ", {} restored", g.restored);
            }
            if g.cancelled > 0 || g.never_started > 0 {
                let _ = write!(
                    out,
                    ", {} cancelled, {} never started",
                    g.cancelled, g.never_started
                );
            }
            if let Some(f) = &g.failed_sibling {
                let _ = write!(out, ", failed sibling {f}");
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(
            out,
            "model requests {}, tokens {} in / {} out",
            self.usage.requests, self.usage.prompt_tokens, self.usage.completion_tokens
        );
        if let Some(b) = &self.budget {
            let _ = writeln!(out, "{}", budget_line(b));
        }
        let _ = writeln!(out, "wall time {}", human_duration(self.wall));
        if let Some(p) = &self.audit_path {
            let _ = writeln!(out, "audit log {}", p.display());
        }
        out
    }
}

/// `budget: 1234 of 5000 tokens, $0.0123 of $1.00`.
fn budget_line(b: &super::limits::BudgetReport) -> String {
    let mut parts = Vec::new();
    match b.max_tokens {
        Some(max) => parts.push(format!("{} of {max} tokens", b.spent_tokens)),
        None => parts.push(format!("{} tokens", b.spent_tokens)),
    }
    match (b.spent_cost, b.max_cost) {
        (Some(spent), Some(max)) => parts.push(format!(
            "${} of ${}",
            super::limits::dollars(spent),
            super::limits::dollars(max)
        )),
        (Some(spent), None) => parts.push(format!("${}", super::limits::dollars(spent))),
        _ => {}
    }
    let mut line = format!("budget: {}", parts.join(", "));
    if let Some(code) = &b.exceeded {
        line.push_str(&format!(" — {code}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_runs_print_milliseconds_long_ones_seconds() {
        assert_eq!(human_duration(Duration::from_micros(1_234)), "1.23ms");
        assert_eq!(human_duration(Duration::from_millis(87)), "87ms");
        assert_eq!(human_duration(Duration::from_millis(999)), "999ms");
        assert_eq!(human_duration(Duration::from_millis(1_500)), "1.500s");
    }
}
