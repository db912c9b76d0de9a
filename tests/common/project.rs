//! A project folder driven through the real `troupe` binary: commands run
//! in it (so the store is the default `.troupe/troupe.db`), a child whose
//! `--events -` stream is read event by event, the run's audit log, and
//! the checks a run's log must pass however many sessions it took.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tempfile::TempDir;

/// Events that reach `--events` but never the audit log.
pub const OBSERVER_EVENTS: [&str; 5] = [
    "Token",
    "Progress",
    "StagePreFired",
    "StagePostFired",
    "SubscriberLagged",
];

/// A bundled pipeline (`stages/<name>`).
pub fn bundled(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("stages")
        .join(name)
}

/// A file under `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// An empty project folder in a temp dir.
pub struct Project {
    dir: TempDir,
}

impl Project {
    pub fn new() -> Project {
        Project {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `troupe` with this folder as its working directory, no stdin.
    pub fn troupe(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_troupe"));
        cmd.current_dir(self.path()).stdin(Stdio::null());
        cmd
    }

    /// Runs `troupe <args>` to its end.
    pub fn output(&self, args: &[&str]) -> Output {
        self.troupe().args(args).output().expect("troupe starts")
    }

    /// Runs `troupe <args>`, which must exit 0, and parses its stdout.
    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.output(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "troupe {args:?}: {}",
            said(&out)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("troupe {args:?} printed no JSON ({e}): {}", said(&out)))
    }

    /// Runs the bundled `stages/fanout` `width` wide (offline) to its
    /// end, which must be ok; its `--json` report.
    pub fn fanout(&self, width: u32) -> Value {
        let fanout = bundled("fanout");
        let report = self.json(&[
            "run",
            fanout.to_str().expect("a UTF-8 path"),
            "--ctx",
            &format!("width={width}"),
            "--json",
        ]);
        assert_eq!(report["status"], "ok", "{report}");
        report
    }

    /// Starts `troupe <args>` (which should include `--events -`).
    pub fn spawn(&self, args: &[&str]) -> Running {
        let stderr = tempfile::tempfile().expect("temp file");
        let child = self
            .troupe()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr.try_clone().expect("temp file"))
            .spawn()
            .expect("troupe starts");
        Running::new(child, stderr, args)
    }

    /// The run's folder in the default runs folder.
    pub fn run_dir(&self, run_id: &str) -> PathBuf {
        self.path().join(".troupe/runs").join(run_id)
    }

    pub fn audit_path(&self, run_id: &str) -> PathBuf {
        // An older troupe's log where a test put one, else this troupe's.
        troupe::auditlog::in_dir(&self.run_dir(run_id))
    }

    /// The whole lines of the run's audit log, as text.
    pub fn audit_text(&self, run_id: &str) -> String {
        troupe::auditlog::read_text(&self.audit_path(run_id)).expect("an audit log")
    }

    /// The run's audit log; every line must be a whole event.
    pub fn audit(&self, run_id: &str) -> Vec<Value> {
        let text = troupe::auditlog::read_text(&self.audit_path(run_id)).expect("an audit log");
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "the audit log ends in a torn line: {:?}",
            text.lines().last()
        );
        text.lines()
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("audit line {} is not an event ({e}): {l}", i + 1))
            })
            .collect()
    }

    /// The run's row as `troupe runs --json` lists it.
    pub fn listed(&self, run_id: &str) -> Value {
        let list = self.json(&["runs", "--json"]);
        list["runs"]
            .as_array()
            .expect("a list of runs")
            .iter()
            .find(|r| r["id"] == run_id)
            .unwrap_or_else(|| panic!("run {run_id} not listed: {list}"))
            .clone()
    }
}

/// What a finished command said, for assertion messages.
pub fn said(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A `troupe` child whose event stream the test reads. Dropping it kills
/// the child (a failed assertion leaves no run behind).
pub struct Running {
    child: Option<Child>,
    stdout: BufReader<ChildStdout>,
    stderr: std::fs::File,
    /// Every event read so far but observer events, in order.
    pub events: Vec<Value>,
    what: String,
}

/// How a child ended.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    /// Every event it streamed but observer events.
    pub events: Vec<Value>,
    pub stderr: String,
}

impl Finished {
    pub fn run_id(&self) -> String {
        run_id_of(&self.events)
    }
}

/// The `workflowRunId` of a stream's first event.
pub fn run_id_of(events: &[Value]) -> String {
    events
        .first()
        .and_then(|e| e["workflowRunId"].as_str())
        .expect("a first event with the run's id")
        .to_owned()
}

impl Running {
    fn new(mut child: Child, stderr: std::fs::File, args: &[&str]) -> Running {
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Running {
            child: Some(child),
            stdout,
            stderr,
            events: Vec::new(),
            what: format!("troupe {args:?}"),
        }
    }

    pub fn pid(&self) -> Pid {
        let child = self.child.as_ref().expect("a child");
        Pid::from_raw(i32::try_from(child.id()).expect("a pid"))
    }

    /// The next streamed event that the audit log would record (observer
    /// events, half of a fan-out's stream, are read and skipped unparsed);
    /// `None` once the stream ended. A last line without its newline (the
    /// child was killed while writing it) ends the stream too.
    pub fn next_event(&mut self) -> Option<&Value> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line).expect("read the stream") == 0 {
                return None;
            }
            if !line.ends_with('\n') {
                let mut rest = String::new();
                let more = self
                    .stdout
                    .read_to_string(&mut rest)
                    .expect("read the stream");
                assert_eq!(
                    more, 0,
                    "{}: a line cut short mid-stream: {line}",
                    self.what
                );
                return None;
            }
            let observer = OBSERVER_EVENTS
                .iter()
                .any(|name| line.contains(&format!("\"event\":\"{name}\"")));
            if !observer {
                break;
            }
        }
        let event: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{}: a stream line is not JSON ({e}): {line}", self.what));
        self.events.push(event);
        self.events.last()
    }

    /// Reads events until `is` accepts one (panics if the stream ends
    /// first).
    pub fn until(&mut self, mut is: impl FnMut(&Value) -> bool) {
        loop {
            let Some(event) = self.next_event() else {
                let stderr = self.stderr_text();
                panic!("{}: the stream ended early; stderr: {stderr}", self.what);
            };
            if is(event) {
                return;
            }
        }
    }

    pub fn run_id(&self) -> String {
        run_id_of(&self.events)
    }

    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal the child");
    }

    fn stderr_text(&mut self) -> String {
        let mut text = String::new();
        self.stderr.rewind().expect("rewind stderr");
        self.stderr.read_to_string(&mut text).expect("read stderr");
        text
    }

    /// Reads the rest of the stream, then waits for the child.
    pub fn finish(mut self) -> Finished {
        while self.next_event().is_some() {}
        let status = self
            .child
            .take()
            .expect("a child")
            .wait()
            .expect("wait for the child");
        Finished {
            code: status.code(),
            events: std::mem::take(&mut self.events),
            stderr: self.stderr_text(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `(stage, sibling index)` of a `stageExecutionId` such as
/// `<run>/worker#17/1`.
pub fn stage_of(exec_id: &str) -> (String, Option<u64>) {
    let mut parts = exec_id.rsplitn(3, '/');
    let _visit = parts.next();
    let stage = parts.next().unwrap_or_default();
    match stage.split_once('#') {
        Some((s, i)) => (s.to_owned(), i.parse().ok()),
        None => (stage.to_owned(), None),
    }
}

/// The events named `name` of stage `stage`.
pub fn of<'a>(log: &'a [Value], name: &str, stage: &str) -> Vec<&'a Value> {
    log.iter()
        .filter(|e| e["event"] == name && e["stageId"] == stage)
        .collect()
}

/// The verdicts of every `StageExited` of `stage`'s siblings, by index.
pub fn sibling_exits(log: &[Value], stage: &str) -> BTreeMap<u64, Vec<String>> {
    let mut exits: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for e in of(log, "StageExited", stage) {
        let id = e["stageExecutionId"].as_str().expect("an execution id");
        let index = stage_of(id).1.expect("a sibling index");
        exits
            .entry(index)
            .or_default()
            .push(e["verdict"].as_str().expect("a verdict").to_owned());
    }
    exits
}

/// How many times each execution of `stage` was entered, by id.
pub fn entries(log: &[Value], stage: &str) -> BTreeMap<String, usize> {
    let mut n: BTreeMap<String, usize> = BTreeMap::new();
    for e in of(log, "StageEntered", stage) {
        *n.entry(e["stageExecutionId"].as_str().expect("an id").to_owned())
            .or_default() += 1;
    }
    n
}

/// The executions whose `StageExited` the repair recovered from the store.
pub fn recovered_exits(log: &[Value]) -> std::collections::BTreeSet<String> {
    log.iter()
        .filter(|e| e["event"] == "StageExited" && e["recovered"] == true)
        .map(|e| e["stageExecutionId"].as_str().expect("an id").to_owned())
        .collect()
}

/// What every run's log must hold, however many sessions it took: `seq`
/// strictly increasing (no duplicate, nothing out of order), and every
/// `StageEntered` closed by exactly one `StageExited` or `StageCancelled`
/// of that execution before it is entered again, none left open at the
/// end, and no end without an entry, except a `StageExited` the repair
/// recovered from the store (`"recovered": true`) of an execution whose
/// entry the killed process's log lost with it.
pub fn assert_well_formed(log: &[Value]) {
    for pair in log.windows(2) {
        let (a, b) = (pair[0]["seq"].as_u64(), pair[1]["seq"].as_u64());
        assert!(
            a.is_some() && b.is_some() && a < b,
            "seq not strictly increasing: {} then {}",
            pair[0],
            pair[1]
        );
    }
    let mut open: BTreeMap<&str, u64> = BTreeMap::new();
    for e in log {
        let Some(id) = e["stageExecutionId"].as_str() else {
            continue;
        };
        let seq = e["seq"].as_u64().unwrap_or_default();
        match e["event"].as_str().unwrap_or_default() {
            "StageEntered" => {
                if let Some(at) = open.insert(id, seq) {
                    panic!("{id} entered at seq {seq} while its entry at seq {at} is open");
                }
            }
            "StageExited" | "StageCancelled" => {
                let recovered = e["event"] == "StageExited" && e["recovered"] == true;
                assert!(
                    open.remove(id).is_some() || recovered,
                    "{id} ended at seq {seq} without an open entry: {e}"
                );
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "entries never closed: {open:?}");
}

/// Every event of `stream` with a `seq` in `seqs` that the audit log
/// records is in `log`, equal to what was streamed (same `seq`): the log
/// lost none of them.
pub fn assert_logged(log: &[Value], stream: &[Value], seqs: impl std::ops::RangeBounds<u64>) {
    let by_seq = by_seq(log);
    let mut checked = 0;
    for e in stream {
        let name = e["event"].as_str().unwrap_or_default();
        let seq = e["seq"].as_u64().expect("seq");
        if OBSERVER_EVENTS.contains(&name) || name == "Summary" || !seqs.contains(&seq) {
            continue;
        }
        assert_eq!(
            by_seq.get(&seq).copied(),
            Some(e),
            "streamed event {seq} is not in the audit log as streamed"
        );
        checked += 1;
    }
    assert!(checked > 0, "no streamed event in the range was checked");
}

/// Every event of `log` from `seq` `from` on was streamed: nothing the
/// session did not publish was added to the log.
pub fn assert_streamed(log: &[Value], stream: &[Value], from: u64) {
    let streamed: std::collections::HashSet<u64> =
        stream.iter().filter_map(|e| e["seq"].as_u64()).collect();
    for (seq, e) in by_seq(log).range(from..) {
        assert!(streamed.contains(seq), "logged but never streamed: {e}");
    }
}

fn by_seq(log: &[Value]) -> BTreeMap<u64, &Value> {
    log.iter()
        .map(|e| (e["seq"].as_u64().expect("seq"), e))
        .collect()
}

/// Writes `lines` to the compact log at `path` as a process killed while
/// writing would leave it: the segment never closed, ending in `torn` (the
/// start of a line whose block was flushed, the line never finished).
pub fn write_killed_log(path: &std::path::Path, lines: &str, torn: &str) {
    write_killed_log_in(path, lines, torn, troupe::auditlog::FORMAT);
}

/// [`write_killed_log`] in the first format, as an older troupe left its
/// `audit.jsonl.zst`: the JSON lines themselves in the frames.
pub fn write_killed_lines_log(path: &std::path::Path, lines: &str, torn: &str) {
    write_killed_log_in(path, lines, torn, troupe::auditlog::FORMAT_LINES);
}

fn write_killed_log_in(path: &std::path::Path, lines: &str, torn: &str, format: u32) {
    use std::io::Write;
    let file = std::fs::File::create(path).expect("the log");
    let mut log = troupe::auditlog::Compressed::create_in(file, format).expect("a log");
    log.write_lines(lines.as_bytes()).expect("lines");
    log.flush().expect("a block");
    if format == troupe::auditlog::FORMAT_LINES {
        log.write_all(torn.as_bytes()).expect("a torn line");
    } else {
        // The record of a line that begins with `torn`, cut before its end.
        let mut record = Vec::new();
        troupe::auditlog::records::lines_as_records(
            format!("{torn}\"never\":\"written\"}}\n").as_bytes(),
            &mut record,
        );
        record.truncate(record.len() - 12);
        log.write_all(&record).expect("a torn record");
    }
    log.flush().expect("a block");
    // Dropped, not finished: the segment stays open.
}
