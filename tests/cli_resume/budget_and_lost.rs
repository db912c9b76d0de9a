//! What a resume counts and says: its earlier sessions' spending under a
//! budget, and the exits the store lost.

use super::*;
use crate::common::project::said;

/// The bundled fan-out run in `project` until worker#17 fails it, part
/// way: its id.
fn failed_part_way(project: &Project) -> String {
    let (fanout, script) = (path(bundled("fanout")), script());
    let extra = [
        "--parallel-cap",
        "8",
        "--fail-sibling",
        "worker#17",
        "--json",
    ];
    failed_run(project, &run_args(&fanout, &script, &extra))
}

/// Prompt and completion tokens of every execution the store keeps for
/// `run_id`.
fn stored_tokens(project: &Project, run_id: &str) -> u64 {
    let shown = project.json(&["runs", "show", run_id, "--json"]);
    shown["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["usage"]["promptTokens"].as_u64().unwrap()
                + e["usage"]["completionTokens"].as_u64().unwrap()
        })
        .sum()
}

#[test]
fn a_resumed_runs_budget_counts_what_its_earlier_sessions_used() {
    let project = Project::new();
    let script = script();
    let run_id = &failed_part_way(&project);
    let earlier = stored_tokens(&project, run_id);
    assert!(earlier > 0, "the scripted provider counts tokens");
    let log = std::fs::read(project.audit_path(run_id)).unwrap();

    // Already over: refused before anything runs or is recorded.
    let under = (earlier - 1).to_string();
    let out = project.output(&[
        "resume",
        run_id,
        "--script",
        &script,
        "--max-tokens",
        &under,
        "--json",
    ]);
    assert_eq!(refusal(&out), "Budget/TokensExceeded");
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = said["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{earlier} tokens in its earlier sessions")),
        "{message}"
    );
    // Before the provider is asked anything: an endpoint nothing answers
    // on would otherwise fail the capability check first.
    let nowhere = format!("http://127.0.0.1:{}/v1", common::closed_port());
    let out = project.output(&[
        "resume",
        run_id,
        "--base-url",
        &nowhere,
        "--model",
        "m",
        "--max-tokens",
        &under,
        "--json",
    ]);
    assert_eq!(refusal(&out), "Budget/TokensExceeded");
    assert_eq!(std::fs::read(project.audit_path(run_id)).unwrap(), log);
    assert_eq!(project.listed(run_id)["sessions"], 1);
    assert_eq!(project.listed(run_id)["state"], "failed");

    // Room for the rest: the meter starts at the earlier sessions' use.
    let max = "100000000";
    let resumed = project.json(&[
        "resume",
        run_id,
        "--script",
        &script,
        "--max-tokens",
        max,
        "--json",
    ]);
    assert_eq!(resumed["status"], "ok", "{}", resumed["reason"]);
    let spent = resumed["budget"]["spentTokens"].as_u64().unwrap();
    // Every stored try counts, the cancelled ones and the failed one run
    // again too (when they had used any), which the results the run shows
    // at its end do not hold; without the earlier sessions the meter
    // would read less than those results.
    let shown = stored_tokens(&project, run_id);
    assert!(
        spent >= shown && spent - shown < earlier,
        "{spent} spent, {shown} shown, {earlier} earlier"
    );
}

/// Exits the log has and the store lost (a damaged `-wal`, a dropped
/// commit) run again, and the resume says so rather than repeating them
/// silently.
#[test]
fn exits_the_store_lost_are_said_before_they_run_again() {
    let project = Project::new();
    // Its log is whole, every ok exit in it.
    let run_id = failed_part_way(&project);
    let ok_in_log = project
        .audit(&run_id)
        .iter()
        .filter(|e| e["event"] == "StageExited" && e["verdict"] == "ok")
        .count();
    assert!(ok_in_log >= 10, "{ok_in_log}");
    // Every record the store had of it, gone (as lost commits leave it).
    let db = rusqlite::Connection::open(project.path().join(".troupe/troupe.db")).unwrap();
    assert!(db.execute("DELETE FROM packs", []).unwrap() > 0);
    drop(db);
    let resumed = resume(&project, &run_id);
    assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
    let said = resumed
        .stderr
        .lines()
        .find(|l| l.contains("Store/LostCommits"))
        .unwrap_or_else(|| panic!("no warning: {}", resumed.stderr));
    assert!(
        said.contains(&format!(": {ok_in_log} execution(s)")),
        "{said}"
    );
}

/// A run kept without a store is not resumable, and the refusal says that
/// rather than that there is no such run.
#[test]
fn a_run_kept_without_a_store_is_refused_as_such() {
    let project = Project::new();
    let fanout = path(bundled("fanout"));
    let script = script();
    let ran = project.output(&run_args(&fanout, &script, &["--no-store", "--json"]));
    assert_eq!(ran.status.code(), Some(0), "{}", said(&ran));
    let summary: Value = serde_json::from_slice(&ran.stdout).unwrap();
    let run_id = summary["runId"].as_str().unwrap();
    let refused = project.output(&["resume", run_id]);
    assert_eq!(refused.status.code(), Some(2), "{}", said(&refused));
    let text = said(&refused);
    assert!(text.contains("Store/KeptWithoutStore"), "{text}");
    assert!(text.contains("--no-store"), "{text}");
}
