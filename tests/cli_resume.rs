//! `troupe resume` through the real binary. A fan-out stopped by `kill -9`,
//! by Ctrl-C, or by a failed sibling is resumed to its end: every sibling
//! ran to its exit exactly once in total (the failed one twice), none
//! whose exit was streamed before the stop was entered again, the join ran
//! once and its result (every sibling's, in order) equals an uninterrupted
//! run's, and the audit log is whole across both sessions. Then resume's
//! refusals: a changed pipeline, an unknown run, a finished run, a run
//! another process holds, a run whose earlier sessions used its budget.
//!
//! The tests wait on the `--events -` stream (a streamed `StageExited` is
//! durable, so "some hundreds exited" is a fact, not a guess) and on the
//! child's exit. No sleeps.

#![cfg(unix)]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use common::project::{
    Project, Running, assert_logged, assert_streamed, assert_well_formed, bundled, entries,
    fixture, of, recovered_exits, sibling_exits,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// Siblings of every fan-out here.
const WIDTH: u64 = 600;
/// Worker exits streamed before the first session is stopped.
const EXITS_BEFORE_STOP: usize = 300;

fn path(p: std::path::PathBuf) -> String {
    p.to_str().unwrap().to_owned()
}

/// The bundled fan-out's turns with a join whose result holds every
/// worker's result (`tests/fixtures/resume/script.yaml`).
fn script() -> String {
    path(fixture("resume/script.yaml"))
}

/// `troupe run stages/fanout` at [`WIDTH`] with the join-echoing script,
/// then `extra`.
fn run_args<'a>(fanout: &'a str, script: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        fanout,
        "--ctx",
        "width=600",
        "--script",
        script,
        "--headless",
    ];
    args.extend_from_slice(extra);
    args
}

/// The join's result, with the run's id taken out of the execution ids it
/// holds, so two runs can be compared.
fn join_result(project: &Project, run_id: &str) -> Value {
    let shown = project.json(&["runs", "show", run_id, "--stage", "reduce", "--json"]);
    let execs = shown["executions"].as_array().unwrap();
    assert_eq!(execs.len(), 1, "one join execution: {shown}");
    let parsed = execs[0]["parsed"].to_string().replace(run_id, "RUN");
    let parsed: Value = serde_json::from_str(&parsed).unwrap();
    // Every sibling's result, in sibling order.
    let upstream = parsed["upstream"].as_array().unwrap();
    assert_eq!(upstream.len() as u64, WIDTH);
    for (i, r) in upstream.iter().enumerate() {
        assert_eq!(r["stageExecutionId"], format!("RUN/worker#{i}/1"));
        assert_eq!(r["parsed"]["item"], i);
    }
    parsed
}

/// The join's result in an uninterrupted run (computed once).
fn uninterrupted_join() -> &'static Value {
    static JOIN: OnceLock<Value> = OnceLock::new();
    JOIN.get_or_init(|| {
        let project = Project::new();
        let (fanout, script) = (path(bundled("fanout")), script());
        let report = project.json(&run_args(&fanout, &script, &["--json"]));
        assert_eq!(report["status"], "ok");
        join_result(&project, report["runId"].as_str().unwrap())
    })
}

/// Starts the fan-out (cap 32, 20 ms a model turn, the last worker stuck),
/// streaming its events, and reads them until [`EXITS_BEFORE_STOP`]
/// workers exited.
fn start_and_wait_for_exits(project: &Project) -> Running {
    start_and_wait_for_exits_with(project, &[])
}

/// [`start_and_wait_for_exits`] with `extra` arguments.
fn start_and_wait_for_exits_with(project: &Project, extra: &[&str]) -> Running {
    // The last worker never ends in this session, so the run is stopped
    // with work left however far the child got ahead of the reading (its
    // event queue lets it run hundreds of siblings ahead).
    let fanout = path(bundled("fanout"));
    let script = path(fixture("resume/script-last-hangs.yaml"));
    let mut flags = vec!["--parallel-cap", "32", "--events", "-"];
    flags.extend_from_slice(extra);
    let args = run_args(&fanout, &script, &flags);
    let mut run = project.spawn(&args);
    let mut exited = 0;
    run.until(|e| {
        if e["event"] == "StageExited" && e["stageId"] == "worker" {
            exited += 1;
        }
        exited == EXITS_BEFORE_STOP
    });
    run
}

/// The workers a stream showed exiting ok.
fn exited_ok(stream: &[Value]) -> BTreeSet<String> {
    of(stream, "StageExited", "worker")
        .into_iter()
        .filter(|e| e["verdict"] == "ok")
        .map(|e| e["stageExecutionId"].as_str().unwrap().to_owned())
        .collect()
}

/// `troupe resume <id>` to its end (at full speed: only the stopped
/// session needs to be slow), streaming its events.
fn resume(project: &Project, run_id: &str) -> common::project::Finished {
    let script = script();
    project
        .spawn(&[
            "resume",
            run_id,
            "--script",
            &script,
            "--headless",
            "--events",
            "-",
        ])
        .finish()
}

/// What every resumed fan-out must show once it ended ok.
fn assert_resumed_to_the_end(
    project: &Project,
    run_id: &str,
    resumed: &common::project::Finished,
    before_stop: &BTreeSet<String>,
) -> Vec<Value> {
    assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
    let log = project.audit(run_id);
    assert_well_formed(&log);

    // The resumed session goes on where the (repaired) log ended: its
    // first event follows the log's last line before it, and the log
    // holds exactly what the session streamed.
    let first = &resumed.events[0];
    assert_eq!(first["event"], "WorkflowResumed");
    let at = log
        .iter()
        .position(|e| e == first)
        .expect("WorkflowResumed in the log");
    assert_eq!(
        first["seq"].as_u64(),
        log[at - 1]["seq"].as_u64().map(|s| s + 1),
        "a gap at the seam of the sessions"
    );
    assert_logged(&log, &resumed.events, ..);
    assert_streamed(&log, &resumed.events, first["seq"].as_u64().unwrap());
    assert!(
        first["storedResults"].as_u64().unwrap() > before_stop.len() as u64,
        "the plan and the exited workers are restored: {first}"
    );

    // A worker whose exit was streamed before the stop is never entered
    // again (after a kill, the log may have lost its entry with its exit).
    let (entered, recovered) = (entries(&log, "worker"), recovered_exits(&log));
    for id in before_stop {
        assert_entered_once(&entered, &recovered, id);
    }
    // The plan and the join ran once; the run ended ok once.
    for stage in ["plan", "reduce"] {
        assert_eq!(of(&log, "StageEntered", stage).len(), 1, "{stage} entered");
        let exits = of(&log, "StageExited", stage);
        assert_eq!(exits.len(), 1, "{stage} exited");
        assert_eq!(exits[0]["verdict"], "ok");
    }
    let ends: Vec<&Value> = log
        .iter()
        .filter(|e| e["event"] == "WorkflowExit")
        .collect();
    assert_eq!(ends.last().unwrap()["status"], "ok");
    assert_eq!(log.last().unwrap()["event"], "WorkflowExit");
    assert_eq!(&join_result(project, run_id), uninterrupted_join());
    let listed = project.listed(run_id);
    assert_eq!(listed["state"], "ok");
    assert_eq!(listed["sessions"], 2);
    log
}

/// Execution `id` was entered once in the whole log (`entered`, by id):
/// it ran in one session only. Zero entries are allowed for an execution
/// whose exit the repair recovered from the store (`recovered`): a killed
/// process's log lost its entry along with its exit.
fn assert_entered_once(entered: &BTreeMap<String, usize>, recovered: &BTreeSet<String>, id: &str) {
    let times = entered.get(id).copied().unwrap_or(0);
    assert!(
        times == 1 || (times == 0 && recovered.contains(id)),
        "{id} was entered {times} times (its exit recovered: {})",
        recovered.contains(id)
    );
}

/// Every sibling `0..WIDTH` has exactly the one `StageExited` given.
fn assert_each_sibling_exited(log: &[Value], verdicts: impl Fn(u64) -> Vec<&'static str>) {
    let exits = sibling_exits(log, "worker");
    assert_eq!(
        exits.keys().copied().collect::<Vec<_>>(),
        (0..WIDTH).collect::<Vec<_>>(),
        "every sibling exited"
    );
    for (i, v) in &exits {
        assert_eq!(v, &verdicts(*i), "the exits of worker#{i}");
    }
}

#[test]
fn a_log_of_formatter_threads_segments_survives_kill_9_and_resume() {
    // From four threads on the audit log's lines are formatted and
    // compressed by formatter threads, each batch a closed segment of its
    // own: a kill leaves at most a cut last segment.
    let project = Project::new();
    let run = start_and_wait_for_exits_with(&project, &["--threads", "4"]);
    run.signal(Signal::SIGKILL);
    let killed = run.finish();
    let run_id = killed.run_id();
    let before_kill = exited_ok(&killed.events);
    assert!((before_kill.len() as u64) < WIDTH, "the kill came too late");

    // What the dead process flushed, read to its last whole segment, is
    // a prefix of what it streamed, in many segments.
    let flushed: Vec<Value> = project
        .audit_text(&run_id)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last_flushed = flushed.last().unwrap()["seq"].as_u64().unwrap();
    assert_logged(&flushed, &killed.events, ..=last_flushed);
    let audit = project.audit_path(&run_id);
    let segments = troupe::auditlog::segment_starts(&audit).unwrap();
    assert!(segments.len() > 2, "{} segments", segments.len());

    let script = script();
    let resumed = project
        .spawn(&[
            "resume",
            &run_id,
            "--script",
            &script,
            "--headless",
            "--events",
            "-",
            "--threads",
            "4",
        ])
        .finish();
    let log = assert_resumed_to_the_end(&project, &run_id, &resumed, &before_kill);
    assert_each_sibling_exited(&log, |_| vec!["ok"]);
}

/// A fan-out `kill -9`ed mid-way: the killed process, its run id and the
/// workers its stream showed exiting ok before the kill.
fn killed_mid_fan_out(project: &Project) -> (common::project::Finished, String, BTreeSet<String>) {
    let run = start_and_wait_for_exits(project);
    run.signal(Signal::SIGKILL);
    let killed = run.finish();
    assert_eq!(killed.code, None, "killed by the signal");
    let before_kill = exited_ok(&killed.events);
    assert!(before_kill.len() >= EXITS_BEFORE_STOP);
    assert!(
        (before_kill.len() as u64) < WIDTH,
        "the kill came after the fan-out ended"
    );
    let run_id = killed.run_id();
    (killed, run_id, before_kill)
}

#[test]
fn kill_9_mid_fan_out_then_resume_runs_every_sibling_to_its_exit_once() {
    let project = Project::new();
    let (killed, run_id, before_kill) = killed_mid_fan_out(&project);

    // The store still says `running`; nobody holds the run's lock.
    assert_eq!(project.listed(&run_id)["state"], "interrupted");

    // What the dead process flushed is a prefix of what it streamed.
    let audit = project.audit_path(&run_id);
    let text = project.audit_text(&run_id);
    let lines: Vec<&str> = text
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .collect();
    let flushed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last_flushed = flushed.last().unwrap()["seq"].as_u64().unwrap();
    assert_logged(&flushed, &killed.events, ..=last_flushed);
    // Make the kill's worst case certain: the log loses its last
    // `LOST_EXITS` worker exits (as when the audit writer lags the store)
    // and ends in a torn line (as a write cut by the kill leaves one).
    const LOST_EXITS: usize = 20;
    let exits_at: Vec<usize> = (0..flushed.len())
        .filter(|&i| flushed[i]["event"] == "StageExited" && flushed[i]["stageId"] == "worker")
        .collect();
    let cut = exits_at[exits_at.len() - LOST_EXITS];
    let lost: Vec<&Value> = exits_at[exits_at.len() - LOST_EXITS..]
        .iter()
        .map(|&i| &flushed[i])
        .collect();
    common::project::write_killed_log(&audit, &lines[..cut].concat(), "{\"seq\":");

    let resumed = resume(&project, &run_id);
    assert!(
        resumed.stderr.contains("its torn end made whole"),
        "{}",
        resumed.stderr
    );
    let log = assert_resumed_to_the_end(&project, &run_id, &resumed, &before_kill);
    assert_each_sibling_exited(&log, |_| vec!["ok"]);
    // The lost exits are back, rebuilt from the store (a new `seq`, the
    // stored end time, marked recovered) with what was first written, and
    // their workers did not run again.
    let (entered, recovered) = (entries(&log, "worker"), recovered_exits(&log));
    for first in lost {
        let id = first["stageExecutionId"].as_str().unwrap();
        let restored = log
            .iter()
            .find(|e| e["event"] == "StageExited" && e["stageExecutionId"] == id)
            .unwrap();
        assert_eq!(restored["recovered"], true, "{restored}");
        for (key, value) in first.as_object().unwrap() {
            if key != "seq" && key != "ts" {
                assert_eq!(&restored[key], value, "{key} of {restored}");
            }
        }
        assert_entered_once(&entered, &recovered, id);
    }
    assert_eq!(
        log.iter().filter(|e| e["event"] == "WorkflowExit").count(),
        1,
        "the killed session wrote no WorkflowExit"
    );
}

/// A run an older troupe began and `kill -9` stopped, its log JSON lines
/// (`audit.jsonl.zst`, format 1) with a torn end: this troupe resumes it
/// in that log and that format, so the older troupe (and `zstd -dc`)
/// still reads every line of both sessions.
#[test]
fn a_killed_run_with_an_older_troupes_log_resumes_in_that_logs_format() {
    let project = Project::new();
    let (_, run_id, before_kill) = killed_mid_fan_out(&project);
    let text = project.audit_text(&run_id);
    let new = project.audit_path(&run_id);
    let old = new.with_file_name(troupe::auditlog::LINES_FILE);
    common::project::write_killed_lines_log(&old, &text, "{\"seq\":");
    std::fs::remove_file(&new).unwrap();

    let resumed = resume(&project, &run_id);
    assert!(
        resumed.stderr.contains("its torn end made whole"),
        "{}",
        resumed.stderr
    );
    assert_eq!(project.audit_path(&run_id), old);
    let log = assert_resumed_to_the_end(&project, &run_id, &resumed, &before_kill);
    assert_each_sibling_exited(&log, |_| vec!["ok"]);
    assert!(!new.exists(), "no second log");
    let stock = zstd::decode_all(&std::fs::read(&old).unwrap()[..]).unwrap();
    assert_eq!(
        String::from_utf8(stock).unwrap(),
        project.audit_text(&run_id),
        "every line of both sessions is JSON in the frames"
    );
}

#[test]
fn ctrl_c_mid_fan_out_then_resume_runs_every_sibling_to_its_exit_once() {
    let project = Project::new();
    let run = start_and_wait_for_exits(&project);
    run.signal(Signal::SIGINT);
    let cancelled = run.finish();
    assert_eq!(cancelled.code, Some(130), "{}", cancelled.stderr);
    let run_id = cancelled.run_id();
    let before_stop = exited_ok(&cancelled.events);
    assert!((before_stop.len() as u64) < WIDTH);
    assert_eq!(project.listed(&run_id)["state"], "cancelled");

    // Ctrl-C flushes a whole log: the resume has nothing to repair.
    let log = project.audit(&run_id);
    assert_well_formed(&log);
    assert_eq!(log.last().unwrap()["status"], "cancelled");
    assert_logged(&log, &cancelled.events, ..);

    let resumed = resume(&project, &run_id);
    assert!(!resumed.stderr.contains("repaired"), "{}", resumed.stderr);
    let log = assert_resumed_to_the_end(&project, &run_id, &resumed, &before_stop);
    assert_each_sibling_exited(&log, |_| vec!["ok"]);
}

#[test]
fn a_failed_sibling_fixed_then_resumed_runs_again_alone_with_the_unfinished() {
    let project = Project::new();
    let (fanout, script) = (path(bundled("fanout")), script());
    let failed = project
        .spawn(&run_args(
            &fanout,
            &script,
            &[
                "--parallel-cap",
                "8",
                "--fail-sibling",
                "worker#17",
                "--events",
                "-",
            ],
        ))
        .finish();
    assert_eq!(failed.code, Some(1), "{}", failed.stderr);
    let run_id = failed.run_id();
    assert_eq!(project.listed(&run_id)["state"], "failed");
    let before = exited_ok(&failed.events);
    // Siblings start in order under the cap of 8, so worker#17 started
    // once ten had exited; fail-fast stopped the fan-out part way.
    assert!(
        before.len() >= 10 && (before.len() as u64) < WIDTH - 1,
        "{} exited ok before the failure",
        before.len()
    );

    // The cause is fixed: the resume is not told to fail worker#17.
    let resumed = resume(&project, &run_id);
    let log = assert_resumed_to_the_end(&project, &run_id, &resumed, &before);
    assert_each_sibling_exited(&log, |i| {
        if i == 17 {
            vec!["fail", "ok"]
        } else {
            vec!["ok"]
        }
    });
    let entered = entries(&log, "worker");
    assert_eq!(entered[&format!("{run_id}/worker#17/1")], 2);
}

/// Runs `args` (`troupe run … --json`), which must fail (exit 1): the
/// run's id.
fn failed_run(project: &Project, args: &[&str]) -> String {
    let out = project.output(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        common::project::said(&out)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["runId"].as_str().unwrap().to_owned()
}

/// A copy of `stages/fanout` in the project, as `fanout/`.
fn copied_fanout(project: &Project) -> std::path::PathBuf {
    let pipeline = project.path().join("fanout");
    std::fs::create_dir(&pipeline).unwrap();
    for file in std::fs::read_dir(bundled("fanout")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, pipeline.join(file.file_name().unwrap())).unwrap();
    }
    pipeline
}

/// The `code` of a refusal printed with `--json`, exit 2.
fn refusal(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{}", common::project::said(out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "error", "{v}");
    v["code"].as_str().unwrap().to_owned()
}

#[test]
fn a_pipeline_changed_since_the_run_is_refused_unless_forced() {
    let project = Project::new();
    let pipeline = copied_fanout(&project);
    let pipeline = path(pipeline);
    let run_id = failed_run(
        &project,
        &[
            "run",
            &pipeline,
            "--ctx",
            "width=8",
            "--fail-sibling",
            "worker#1",
            "--headless",
            "--json",
        ],
    );
    let log = std::fs::read(project.audit_path(&run_id)).unwrap();

    let worker = std::path::Path::new(&pipeline).join("worker.md");
    let mut text = std::fs::read_to_string(&worker).unwrap();
    text.push_str("\nKeep the summary short.\n");
    std::fs::write(&worker, text).unwrap();
    assert_eq!(
        refusal(&project.output(&["resume", &run_id, "--json"])),
        "Store/PipelineChanged"
    );
    // Refused before anything: the run and its log are as they were.
    assert_eq!(project.listed(&run_id)["state"], "failed");
    assert_eq!(std::fs::read(project.audit_path(&run_id)).unwrap(), log);

    let forced = project.output(&["resume", &run_id, "--force", "--json"]);
    assert_eq!(
        forced.status.code(),
        Some(0),
        "{}",
        common::project::said(&forced)
    );
    assert_eq!(project.listed(&run_id)["state"], "ok");
}

#[test]
fn an_unknown_run_and_a_run_that_ended_ok_are_refused() {
    let project = Project::new();
    let fanout = path(bundled("fanout"));
    let report = project.json(&["run", &fanout, "--ctx", "width=4", "--json"]);
    assert_eq!(report["status"], "ok");
    let run_id = report["runId"].as_str().unwrap();
    let log = std::fs::read(project.audit_path(run_id)).unwrap();

    assert_eq!(
        refusal(&project.output(&["resume", run_id, "--json"])),
        "Store/NothingToResume"
    );
    assert_eq!(
        refusal(&project.output(&["resume", "no-such-run", "--json"])),
        "Store/RunNotFound"
    );
    assert_eq!(std::fs::read(project.audit_path(run_id)).unwrap(), log);
    assert_eq!(project.listed(run_id)["sessions"], 1);
}

#[test]
fn two_processes_never_run_one_run_at_once() {
    let project = Project::new();
    let fanout = path(bundled("fanout"));
    let slow = path(fixture("resume/slow-workers.yaml"));
    let worker_entered = |e: &Value| e["event"] == "StageEntered" && e["stageId"] == "worker";

    // The run itself holds its run: a resume while it runs is refused.
    let mut run = project.spawn(&[
        "run",
        &fanout,
        "--ctx",
        "width=4",
        "--script",
        &slow,
        "--headless",
        "--events",
        "-",
    ]);
    run.until(worker_entered);
    let run_id = run.run_id();
    assert_eq!(project.listed(&run_id)["state"], "running");
    assert_eq!(
        refusal(&project.output(&["resume", &run_id, "--json"])),
        "Store/RunBusy"
    );
    run.signal(Signal::SIGKILL);
    assert_eq!(run.finish().code, None);
    assert_eq!(project.listed(&run_id)["state"], "interrupted");

    // So does a resume of it.
    let mut first = project.spawn(&[
        "resume",
        &run_id,
        "--script",
        &slow,
        "--headless",
        "--events",
        "-",
    ]);
    first.until(worker_entered);
    assert_eq!(project.listed(&run_id)["state"], "running");
    assert_eq!(
        refusal(&project.output(&["resume", &run_id, "--json"])),
        "Store/RunBusy"
    );
    // `runs rm` does not delete it from under the process either.
    assert_eq!(
        refusal(&project.output(&["runs", "rm", &run_id, "--json"])),
        "Store/RunBusy"
    );
    first.signal(Signal::SIGKILL);
    assert_eq!(first.finish().code, None);
    assert_eq!(project.listed(&run_id)["sessions"], 2);
}

/// The durability rule seen from outside: while the store cannot commit
/// (the test holds its write lock), no worker's `StageExited` is streamed;
/// every sibling that finished waits for the store, holding its slot. The
/// run is killed in that state: every exit it streamed is in the store,
/// and the resume runs each sibling to its exit once.
#[test]
fn no_exit_is_streamed_before_the_store_has_it() {
    const CAP: usize = 32;
    let project = Project::new();
    let (fanout, script) = (path(bundled("fanout")), script());
    let mut run = project.spawn(&run_args(
        &fanout,
        &script,
        &["--parallel-cap", "32", "--latency", "20ms", "--events", "-"],
    ));
    run.until(|e| e["event"] == "StageEntered" && e["stageId"] == "worker");
    let run_id = run.run_id();

    let lock = rusqlite::Connection::open(project.path().join(".troupe/troupe.db")).unwrap();
    lock.busy_timeout(std::time::Duration::from_secs(30))
        .unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Every slot ends up held by a worker that finished (its assert
    // passed) and waits for the store to take its result; near the end of
    // the fan-out (a reader far behind the child), every worker left.
    let (mut finished, mut exited) = (BTreeSet::new(), BTreeSet::new());
    run.until(|e| {
        let id = e["stageExecutionId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if e["stageId"] == "worker" {
            if e["event"] == "StageAssertOutcome" && e["verdict"] == "ok" {
                finished.insert(id);
            } else if e["event"] == "StageExited" {
                exited.insert(id);
            }
        }
        let waiting = finished.difference(&exited).count();
        waiting == CAP.min(WIDTH as usize - exited.len())
    });
    run.signal(Signal::SIGKILL);
    let killed = run.finish();
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);

    let streamed = exited_ok(&killed.events);
    let shown = project.json(&["runs", "show", &run_id, "--stage", "worker", "--json"]);
    let stored: BTreeSet<String> = shown["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["verdict"] == "ok")
        .map(|e| e["stageExecutionId"].as_str().unwrap().to_owned())
        .collect();
    let lost: Vec<&String> = streamed.difference(&stored).collect();
    assert!(lost.is_empty(), "streamed as exited, not stored: {lost:?}");

    let resumed = resume(&project, &run_id);
    let log = assert_resumed_to_the_end(&project, &run_id, &resumed, &streamed);
    assert_each_sibling_exited(&log, |_| vec!["ok"]);
}

/// A run started with a relative pipeline folder resumes from another
/// folder (its row holds both folders absolute); a run whose folder was
/// moved away is refused rather than begun again with an empty log; an
/// empty run id names no run.
#[test]
fn a_run_resumes_from_another_folder_and_not_without_its_own() {
    let project = Project::new();
    copied_fanout(&project);
    let args = [
        "run",
        "fanout",
        "--ctx",
        "width=4",
        "--fail-sibling",
        "worker#1",
        "--headless",
        "--json",
    ];
    let run_id = failed_run(&project, &args);
    let elsewhere = project.path().join("sub");
    std::fs::create_dir(&elsewhere).unwrap();
    let resumed = project
        .troupe()
        .current_dir(&elsewhere)
        .args([
            "resume",
            &run_id,
            "--store",
            "../.troupe/troupe.db",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        common::project::said(&resumed)
    );
    assert_eq!(project.listed(&run_id)["state"], "ok");

    let moved = failed_run(&project, &args);
    let folder = project.audit_path(&moved).parent().unwrap().to_owned();
    std::fs::rename(&folder, project.path().join("moved-away")).unwrap();
    let out = project.output(&["resume", &moved, "--json"]);
    assert_eq!(refusal(&out), "Store/WriteFailed");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("folder is gone"),
        "{}",
        common::project::said(&out)
    );
    assert!(!folder.exists(), "the folder was not made again");
    assert_eq!(project.listed(&moved)["sessions"], 1);

    assert_eq!(
        refusal(&project.output(&["resume", "", "--json"])),
        "Store/RunNotFound"
    );
}

#[path = "cli_resume/budget_and_lost.rs"]
mod budget_and_lost;
