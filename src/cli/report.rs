//! `troupe report`: read a run's audit log and write its timeline as SVG
//! and/or a self-contained HTML page.

use std::path::{Path, PathBuf};

use super::Exit;
use crate::error::HasCode;
use crate::report::{ReportError, RowBudget, SvgOptions, load_run, render_svg};

/// Examples and what the picture shows, after `troupe report --help`.
pub const AFTER_HELP: &str = "\
Examples:
  troupe run stages/fanout --ctx width=2000 --parallel-cap 64 --latency 5ms
  troupe report <RUN_ID> --svg run.svg                # the id `troupe run` printed
  troupe report <RUN_ID> --html run.html --svg run.svg
  troupe report <RUN_ID> --html run.html --runs-dir /tmp/runs --rows 50

The picture: one row per stage execution in order of first appearance, each
a bar from StageEntered to its end coloured by outcome (ok, failed, skipped,
cancelled, unfinished), retries as black ticks, approval waits hatched, and
for a sibling the time it waited for a cap slot as a dashed line from the
group's start. Siblings sit under their group's header; a group wider than
--rows is drawn as at most --rows bins of consecutive siblings. Below, the
number of running executions over time, with each group's cap dashed.

Exit codes:
  0    the files were written
  2    no --svg/--html, an unknown run id (Store/RunNotFound), an unreadable
       or corrupt audit log (Store/AuditCorrupt, with the line), or a file
       that cannot be written (Store/WriteFailed)";

/// Options of `troupe report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The run's workflowRunId (or the start of it; `troupe runs` lists
    /// them). Looked up in the run store, else as a folder under
    /// --runs-dir.
    #[arg(value_name = "RUN_ID")]
    pub run_id: String,
    /// Write the timeline as an SVG picture to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Write one self-contained HTML page to FILE: the run's figures, the
    /// timeline and a table per stage (outcomes, retries, median and max
    /// duration, model requests).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Where the run folders are (the --runs-dir of `troupe run`).
    #[arg(long, value_name = "DIR", default_value = ".troupe/runs")]
    pub runs_dir: PathBuf,
    /// The run store [default: troupe.db beside --runs-dir].
    #[arg(long, value_name = "FILE")]
    pub store: Option<PathBuf>,
    /// Most sibling rows per parallel group; a wider group is drawn as at
    /// most this many bins of consecutive siblings.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub rows: u32,
    /// Width of the picture in pixels.
    #[arg(long, value_name = "PX", default_value_t = 1200,
          value_parser = clap::value_parser!(u32).range(600..=20_000))]
    pub width: u32,
    /// Print what was written (or the error) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Draw the pipeline's graph (stages, the next table, fan-outs with
    /// their caps, joins) above the timeline in the HTML page; the
    /// pipeline is read from where the run store says the run's came from.
    #[arg(long, requires = "html")]
    pub graph: bool,
}

/// Where the run's folder is (`options::find_run_folder`), as the folder
/// that holds it and its name; a run it does not find is looked for in
/// `--runs-dir` by the name given, and `load_run` says what is missing. A
/// prefix of several runs' ids is that error (`Store/AmbiguousRun`).
fn locate(args: &ReportArgs) -> Result<(PathBuf, String, Option<PathBuf>), ReportError> {
    let path = super::options::store_path(args.store.as_deref(), &args.runs_dir);
    let found = match super::options::find_run_folder(&path, &args.runs_dir, &args.run_id) {
        Ok(found) => Some(found),
        Err(e @ crate::store::StoreError::AmbiguousRun { .. }) => return Err(e.into()),
        Err(_) => None,
    };
    let split = found.as_ref().and_then(|run| {
        let parent = run.dir.parent()?;
        let name = run.dir.file_name()?;
        Some((parent, name, &run.pipeline))
    });
    Ok(match split {
        Some((parent, name, pipeline)) => (
            parent.to_owned(),
            name.to_string_lossy().into_owned(),
            pipeline.clone(),
        ),
        None => (args.runs_dir.clone(), args.run_id.clone(), None),
    })
}

/// One file written.
struct Written {
    format: &'static str,
    path: PathBuf,
    bytes: usize,
}

pub fn run(args: ReportArgs) -> Exit {
    match write_report(&args) {
        Ok(written) => {
            print_written(&args, &written);
            Exit::Ok
        }
        Err(e) => {
            print_error(&e, args.json);
            Exit::Invalid
        }
    }
}

fn write_report(args: &ReportArgs) -> Result<Vec<Written>, ReportError> {
    if args.svg.is_none() && args.html.is_none() {
        return Err(ReportError::NothingToWrite);
    }
    let (runs_dir, run_id, pipeline_dir) = locate(args)?;
    // A run the store knows whose folder is there but whose log is not:
    // gone, which is not a run that was never there.
    let log = crate::auditlog::in_dir(&runs_dir.join(&run_id));
    if runs_dir.join(&run_id).is_dir() && !log.exists() {
        return Err(crate::store::StoreError::LogMissing { path: log }.into());
    }
    for output in [&args.svg, &args.html].into_iter().flatten() {
        super::options::refuse_output_in_run_folder(output, &runs_dir.join(&run_id))?;
    }
    let timeline = load_run(&runs_dir, &run_id)?;
    let opts = SvgOptions {
        width: args.width,
        rows: RowBudget {
            per_group: args.rows as usize,
            ..RowBudget::default()
        },
        xmlns: true,
    };
    let mut written = Vec::new();
    if let Some(path) = &args.svg {
        written.push(write(path, "svg", render_svg(&timeline, &opts))?);
    }
    if let Some(path) = &args.html {
        let graph = if args.graph {
            graph_of(pipeline_dir.as_deref())
        } else {
            None
        };
        let page = crate::report::html::render_html_with(&timeline, &opts, graph.as_deref());
        written.push(write(path, "html", page)?);
    }
    Ok(written)
}

/// The pipeline's graph as SVG; `None`, said on stderr, when the store does
/// not know where the pipeline is or it no longer loads.
fn graph_of(dir: Option<&Path>) -> Option<String> {
    let Some(dir) = dir else {
        say!("note: --graph: the run store does not know this run's pipeline; no graph drawn");
        return None;
    };
    match crate::definition::load_pipeline(dir) {
        Ok(p) => Some(crate::report::graph::pipeline_svg(&p)),
        Err(diags) => {
            say!(
                "note: --graph: the pipeline at {} does not load ({} problems); no graph drawn",
                dir.display(),
                diags.0.len()
            );
            None
        }
    }
}

/// Writes `text` beside `path`, then renames it into place: a disk that
/// fills midway leaves the last report whole, not a truncated one. The
/// new file gets the mode the old one had, or for a first one what a
/// plain write would give it (0666 less the umask). A path that is not a
/// regular file (`/dev/stdout`, `/dev/null`) is written in place, and a
/// link is followed, so the file it names is replaced, not the link.
fn write(path: &Path, format: &'static str, text: String) -> Result<Written, ReportError> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |source| ReportError::WriteFailed {
        path: path.to_owned(),
        source,
    };
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let existing = std::fs::metadata(&target).ok();
    if existing.as_ref().is_some_and(|m| !m.is_file()) {
        std::fs::write(&target, text.as_bytes()).map_err(failed)?;
    } else {
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // Made with the mode asked for, less the umask; removed if it is
        // not renamed into place.
        let mode = existing
            .as_ref()
            .map_or(0o666, |m| m.permissions().mode() & 0o7777);
        let mut tmp = tempfile::Builder::new()
            .prefix(".troupe-report-")
            .permissions(std::fs::Permissions::from_mode(mode))
            .tempfile_in(dir)
            .map_err(failed)?;
        std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(failed)?;
        // An old report's own mode is kept whole, whatever the umask.
        if existing.is_some() {
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
                .map_err(failed)?;
        }
        tmp.persist(&target).map_err(|e| failed(e.error))?;
    }
    Ok(Written {
        format,
        path: path.to_owned(),
        bytes: text.len(),
    })
}

fn print_written(args: &ReportArgs, written: &[Written]) {
    if args.json {
        let files: Vec<_> = written
            .iter()
            .map(|w| serde_json::json!({"format": w.format, "path": w.path, "bytes": w.bytes}))
            .collect();
        let out = serde_json::json!({"ok": true, "runId": args.run_id, "written": files});
        tell!("{out}");
        return;
    }
    for w in written {
        tell!(
            "wrote {} ({}, {:.1} KiB)",
            w.path.display(),
            w.format,
            w.bytes as f64 / 1024.0
        );
    }
}

/// `error: Store/RunNotFound: …` and a hint on stderr, or the same as JSON
/// on stdout (the shape `troupe validate --json` uses).
fn print_error(e: &ReportError, json: bool) {
    if json {
        let mut err = serde_json::json!({"code": e.code().to_string(), "message": e.to_string()});
        if let Some(h) = e.hint() {
            err["hint"] = serde_json::Value::from(h);
        }
        tell!(
            "{}",
            serde_json::json!({
                "ok": false,
                "status": "error",
                "code": err["code"],
                "message": err["message"],
                "hint": err.get("hint"),
                "errors": [err],
            })
        );
        return;
    }
    say!("error: {}: {e}", e.code());
    if let Some(h) = e.hint() {
        say!("  hint: {h}");
    }
}
