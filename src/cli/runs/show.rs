//! `troupe runs show`: one run, its per-stage figures and its executions.
//!
//! A run's executions are read a pass at a time, never held together: the
//! store says which of its records stand (a number each), then each pass
//! (the figures, then the JSON array, or the cancelled, failed and result
//! lists of the text) reads them again in the order they were stored. Held
//! whole, a million-wide run's executions took 4.4 GB to print as JSON.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde::ser::{Error as _, SerializeSeq};
use serde_json::Value;

use super::{duration, status_of, when};
use crate::auditlog;
use crate::cli::Exit;
use crate::provider::Usage;
use crate::runtime::result::Verdict;
use crate::store::pack::{End, Stored};
use crate::store::records::{Standing, exec_row};
use crate::store::{Counts, RunRow, Store, StoreError};

/// Per-stage figures of a run, from its executions.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct StageFigures {
    /// `ok`, `failed`, `skipped`, `cancelled`, as `troupe runs` counts.
    #[serde(flatten)]
    counts: Counts,
    retries: u64,
    cap_hits: u64,
    usage: Usage,
}

impl StageFigures {
    fn add(&mut self, r: &Stored<'_>) {
        self.counts.count(r.verdict());
        if let End::Exited { cap_hit: true, .. } = r.end {
            self.cap_hits += 1;
        }
        self.retries += u64::from(r.attempts.saturating_sub(1));
        self.usage.add(r.usage);
    }
}

/// What one run's reading needs: the store, the run, which records stand.
struct Shown<'s> {
    store: &'s Store,
    run: RunRow,
    standing: Standing,
}

impl Shown<'_> {
    /// Each standing record that `wanted` selects, in the order stored,
    /// until `each` says stop.
    fn each(
        &self,
        wanted: impl Fn(&Stored<'_>) -> bool,
        mut each: impl FnMut(&Stored<'_>) -> bool,
    ) -> Result<(), StoreError> {
        self.store
            .each_standing(&self.run.id, &self.standing, |r| !wanted(r) || each(r))
    }

    fn figures(&self) -> Result<BTreeMap<String, StageFigures>, StoreError> {
        let mut figures: BTreeMap<String, StageFigures> = BTreeMap::new();
        self.each(
            |_| true,
            |r| {
                match figures.get_mut(r.stage_id) {
                    Some(f) => f.add(r),
                    None => figures.entry(r.stage_id.to_owned()).or_default().add(r),
                }
                true
            },
        )?;
        Ok(figures)
    }
}

pub(super) fn show(
    path: &Path,
    id: &str,
    stage: Option<&str>,
    json: bool,
) -> Result<Exit, StoreError> {
    let store = Store::open_read_only(path)?;
    let run = store.find_run(id)?;
    let (stage_id, index) = match stage.map(|s| s.split_once('#')) {
        None => (None, None),
        Some(None) => (stage, None),
        Some(Some((s, i))) => match i.parse::<u64>() {
            Ok(i) => (Some(s), Some(i)),
            Err(_) => {
                return Ok(crate::cli::launch::input_invalid(
                    path,
                    format!(
                        "--stage {}: the index after `#` must be a number",
                        stage.unwrap_or_default()
                    ),
                    json,
                ));
            }
        },
    };
    // A stage the run does not have shows nothing: said, with the ones it
    // has, when they can be told (its summary, else its pipeline's files).
    if let Some(wanted) = stage_id {
        let known = known_stages(&run);
        if !known.is_empty() && !known.iter().any(|k| k == wanted) {
            let v = serde_json::json!({
                "status": "error",
                "code": crate::error::HasCode::code(&crate::error::ValidationCode::UnknownStage).to_string(),
                "message": format!("run `{}` has no stage `{wanted}`", run.id),
                "hint": format!("its stages: {}", known.join(", ")),
            });
            if json {
                tell!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                say!(
                    "error: {}: {}\n  hint: {}",
                    v["code"].as_str().unwrap_or_default(),
                    v["message"].as_str().unwrap_or_default(),
                    v["hint"].as_str().unwrap_or_default()
                );
            }
            return Ok(Exit::Invalid);
        }
    }
    let standing = store.standing(&run.id, stage_id, index)?;
    let shown = Shown {
        store: &store,
        run,
        standing,
    };
    let figures = shown.figures()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if json {
        write_json(&shown, &figures, &mut out)
    } else {
        write_text(&shown, &figures, &mut out)
    };
    match written.and_then(|()| out.flush().map_err(Failed::Io)) {
        Ok(()) => Ok(Exit::Ok),
        // A reader that went away (`| head`) wanted no more: status 141,
        // as every listing ends then (`quiet_broken_pipe`).
        Err(Failed::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Exit::ReaderGone),
        Err(Failed::Io(e)) => Err(StoreError::Io {
            path: "stdout".into(),
            detail: e.to_string(),
        }),
        Err(Failed::Store(e)) => Err(e),
    }
}

/// Why printing stopped.
enum Failed {
    Store(StoreError),
    Io(std::io::Error),
}

impl From<StoreError> for Failed {
    fn from(e: StoreError) -> Failed {
        Failed::Store(e)
    }
}

/// `{"run", "state", "stages", "executions"}`, pretty, the executions
/// serialized as they are read.
fn write_json(
    shown: &Shown<'_>,
    figures: &BTreeMap<String, StageFigures>,
    out: &mut impl Write,
) -> Result<(), Failed> {
    #[derive(Serialize)]
    struct Document<'a> {
        run: &'a RunRow,
        state: &'a str,
        stages: &'a BTreeMap<String, StageFigures>,
        executions: Executions<'a>,
    }
    /// Serialized as an array read from the store while it is written; a
    /// store error is kept aside to be returned as itself.
    struct Executions<'a> {
        shown: &'a Shown<'a>,
        failed: std::cell::RefCell<Option<StoreError>>,
    }
    impl Serialize for Executions<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let mut seq = serializer.serialize_seq(None)?;
            let mut error = None;
            let read = self.shown.each(
                |_| true,
                |r| {
                    error = seq
                        .serialize_element(&exec_row(&self.shown.run.id, r))
                        .err();
                    error.is_none()
                },
            );
            if let Some(e) = error {
                return Err(e);
            }
            if let Err(e) = read {
                let said = e.to_string();
                *self.failed.borrow_mut() = Some(e);
                return Err(S::Error::custom(said));
            }
            seq.end()
        }
    }
    let document = Document {
        run: &shown.run,
        state: status_of(&shown.run),
        stages: figures,
        executions: Executions {
            shown,
            failed: std::cell::RefCell::new(None),
        },
    };
    match serde_json::to_writer_pretty(&mut *out, &document) {
        Ok(()) => writeln!(out).map_err(Failed::Io),
        Err(e) => match document.executions.failed.take() {
            Some(store) => Err(Failed::Store(store)),
            None => Err(Failed::Io(e.into())),
        },
    }
}

fn write_text(
    shown: &Shown<'_>,
    figures: &BTreeMap<String, StageFigures>,
    out: &mut impl Write,
) -> Result<(), Failed> {
    let run = &shown.run;
    let io = Failed::Io;
    writeln!(
        out,
        "run {} of {}: {}",
        run.id,
        run.pipeline_id,
        status_of(run)
    )
    .map_err(io)?;
    if let Some(reason) = &run.reason {
        writeln!(
            out,
            "  stopped by: {}",
            crate::cli::output::terminal_safe(reason)
        )
        .map_err(io)?;
    }
    writeln!(
        out,
        "  started {} UTC, {}{}",
        when(run.started_at),
        duration(run),
        match run.sessions {
            0 | 1 => String::new(),
            2 => ", 2 sessions (resumed once)".to_owned(),
            n => format!(", {n} sessions (resumed {} times)", n - 1),
        }
    )
    .map_err(io)?;
    writeln!(out, "  pipeline {} ({})", run.pipeline_dir, run.digest).map_err(io)?;
    writeln!(out, "  ctx {}", run.ctx).map_err(io)?;
    writeln!(
        out,
        "  audit log {}",
        auditlog::in_dir(Path::new(&run.run_dir)).display()
    )
    .map_err(io)?;
    writeln!(
        out,
        "\n{:<20} {:>7} {:>6} {:>8} {:>10} {:>8} {:>8} {:>12} {:>12}",
        "stage",
        "ok",
        "fail",
        "skipped",
        "cancelled",
        "retries",
        "capHits",
        "tokens in",
        "tokens out"
    )
    .map_err(io)?;
    for (id, s) in figures {
        writeln!(
            out,
            "{id:<20} {:>7} {:>6} {:>8} {:>10} {:>8} {:>8} {:>12} {:>12}",
            s.counts.ok,
            s.counts.failed,
            s.counts.skipped,
            s.counts.cancelled,
            s.retries,
            s.cap_hits,
            s.usage.prompt_tokens,
            s.usage.completion_tokens
        )
        .map_err(io)?;
    }
    if let Some(groups) = run
        .summary
        .as_ref()
        .and_then(|s| s.get("groups"))
        .and_then(Value::as_array)
    {
        for g in groups {
            writeln!(
                out,
                "fan-out {}: {} siblings, cap {}, peak {} running, {} waited for a slot{}",
                g["stage"].as_str().unwrap_or(""),
                g["width"],
                g["cap"],
                g["peakRunning"],
                g["capWaits"],
                g["failedSibling"]
                    .as_str()
                    .map(|f| format!(", failed sibling {f}"))
                    .unwrap_or_default()
            )
            .map_err(io)?;
        }
    }
    let total = |f: fn(&StageFigures) -> u64| figures.values().map(f).sum::<u64>();
    // Each list is a pass of its own; the first write error ends them.
    let failed: std::cell::RefCell<Option<std::io::Error>> = std::cell::RefCell::default();
    let line = |out: &mut dyn Write, text: std::fmt::Arguments<'_>| -> bool {
        let mut failed = failed.borrow_mut();
        if failed.is_none() {
            *failed = writeln!(out, "{text}").err();
        }
        failed.is_none()
    };
    let going = || failed.borrow().is_none();
    if total(|f| f.counts.cancelled) > 0 && going() {
        line(out, format_args!("\ncancelled:"));
        shown.each(
            |r| matches!(r.end, End::Cancelled { .. }),
            |r| {
                let End::Cancelled {
                    reason,
                    phase,
                    turn,
                    tool_calls,
                } = r.end
                else {
                    return true;
                };
                let calls = serde_json::from_str::<Value>(tool_calls)
                    .ok()
                    .as_ref()
                    .and_then(Value::as_array)
                    .filter(|c| !c.is_empty())
                    .map(|c| {
                        let names: Vec<&str> =
                            c.iter().filter_map(|t| t["tool"].as_str()).collect();
                        format!(", open tool calls: {}", names.join(", "))
                    })
                    .unwrap_or_default();
                line(
                    out,
                    format_args!(
                        "  {}  in {phase} (attempt {}, turn {turn}){calls}, {} requests, {} tokens — {reason}",
                        label(r),
                        r.attempts,
                        r.usage.requests,
                        r.usage.prompt_tokens + r.usage.completion_tokens,
                        reason = crate::cli::output::terminal_safe(reason),
                    ),
                )
            },
        )?;
    }
    if total(|f| f.counts.failed) > 0 && going() {
        line(out, format_args!("\nfailed:"));
        shown.each(
            |r| {
                matches!(
                    r.end,
                    End::Exited {
                        verdict: Verdict::Fail,
                        ..
                    }
                )
            },
            |r| {
                let End::Exited { reason, .. } = r.end else {
                    return true;
                };
                line(
                    out,
                    // A reason may quote a tool's output: no control
                    // sequence of it reaches the terminal.
                    format_args!(
                        "  {}  {}",
                        label(r),
                        crate::cli::output::terminal_safe(reason.unwrap_or(""))
                    ),
                )
            },
        )?;
    }
    if total(|f| f.counts.ok + f.counts.failed + f.counts.skipped) > 0 && going() {
        line(out, format_args!("\nresults:"));
        shown.each(
            |r| matches!(r.end, End::Exited { .. }),
            |r| {
                let End::Exited {
                    verdict, parsed, ..
                } = r.end
                else {
                    return true;
                };
                // As the JSON reads it back: compact, or `null` when the
                // stored text is no JSON.
                let parsed = serde_json::from_str::<Value>(parsed)
                    .map_or("null".to_owned(), |v| v.to_string());
                line(
                    out,
                    format_args!("  {:<16} {:<7} {parsed}", label(r), verdict.as_str()),
                )
            },
        )?;
    }
    match failed.into_inner() {
        Some(e) => Err(Failed::Io(e)),
        None => Ok(()),
    }
}

/// `worker#3` (visit 2: `worker#3@2`).
fn label(r: &Stored<'_>) -> String {
    use std::fmt::Write as _;
    let mut l = r.stage_id.to_owned();
    if let Some(i) = r.index {
        let _ = write!(l, "#{i}");
    }
    if r.visit > 1 {
        let _ = write!(l, "@{}", r.visit);
    }
    l
}

/// The stage ids of `run`: its summary's and those of the pipeline its
/// row names (as its files are now); none when neither can be read.
fn known_stages(run: &crate::store::RunRow) -> Vec<String> {
    let mut known: Vec<String> = run
        .summary
        .as_ref()
        .and_then(|s| s["stages"].as_object())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    if let Ok(p) = crate::definition::load_pipeline(Path::new(&run.pipeline_dir)) {
        for stage in &p.stages {
            if !known.contains(&stage.id) {
                known.push(stage.id.clone());
            }
        }
    }
    known
}
