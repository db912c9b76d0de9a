//! `troupe bench` driven as a user would: a tiny matrix, the JSON shape,
//! and typed errors for bad flags. Figures are timings, so the tests check
//! their shape and sign, never their size.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

fn troupe() -> Command {
    Command::cargo_bin("troupe").unwrap()
}

fn fanout() -> String {
    format!("{}/stages/fanout", env!("CARGO_MANIFEST_DIR"))
}

fn positive(v: &Value, key: &str) -> f64 {
    let n = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"));
    assert!(n > 0.0, "{key} = {n} is not positive");
    n
}

#[test]
fn a_tiny_matrix_reports_every_cell_as_json() {
    let out = troupe()
        .args(["bench", &fanout(), "--width", "10", "--cap", "4"])
        .args(["--latency", "0ms,1ms", "--repeat", "1", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pipeline"], "fanout");
    assert_eq!(v["repeat"], 1);
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    for cell in cells {
        assert_eq!(
            (cell["width"].as_u64(), cell["cap"].as_u64()),
            (Some(10), Some(4))
        );
        assert_eq!(cell["runtimeOk"], true);
        positive(cell, "runtimeWallMs");
        positive(cell, "floorWallMs");
        positive(cell, "perSiblingUs");
        positive(cell, "ratioToFloor");
        positive(cell, "peakRssKib");
        positive(cell, "floorPeakRssKib");
        positive(cell, "rssRatioToFloor");
        assert_eq!(cell["runtimeWallsMs"].as_array().unwrap().len(), 1);
        assert!(cell["cancelLatencyMs"].is_null());
    }
    // No ideal at zero latency; a positive ratio to it at 1ms.
    assert!(cells[0]["ratioToIdeal"].is_null());
    assert_eq!(cells[1]["latencyMs"], 1.0);
    // Plan turn, ceil(10/4) = 3 waves of two worker turns, join turn.
    assert_eq!(cells[1]["idealMs"], 8.0);
    positive(&cells[1], "ratioToIdeal");
}

#[test]
fn a_failing_sibling_reports_its_cancel_latency() {
    let out = troupe()
        .args(["bench", &fanout(), "--width", "20", "--cap", "8"])
        .args(["--latency", "5ms", "--repeat", "1", "--json"])
        .args(["--fail-sibling", "worker#3"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cell = &v["cells"][0];
    assert_eq!(v["failSibling"], "worker#3");
    // Siblings 0..8 start together; #3 fails on its first 5ms turn while
    // the other seven still have their second turn ahead: they are cancelled.
    assert!(cell["cancelled"].as_u64().unwrap() >= 1, "{cell}");
    assert!(cell["cancelLatencyMs"].as_f64().unwrap() >= 0.0, "{cell}");
    assert!(cell["floorCancelLatencyMs"].as_f64().unwrap() >= 0.0);
    // A failing run stops early: no ratio to the ideal.
    assert!(cell["ratioToIdeal"].is_null());
}

#[test]
fn bad_flags_are_typed_input_errors() {
    for (flag, value) in [
        ("--width", "0"),
        ("--width", "ten"),
        ("--cap", "16,,256"),
        ("--latency", "50"),
        ("--repeat", "0"),
        ("--fail-sibling", "#3"),
        ("--fail-sibling", "nosuchstage#3"),
        ("--fail-sibling", "worker"),
        // Past the default width (1 000): it would never fail.
        ("--fail-sibling", "worker#5000"),
    ] {
        let out = troupe()
            .args(["bench", &fanout(), flag, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Validation/InputInvalid"),
            "{flag} {value}: {err}"
        );
    }
}

#[test]
fn a_pipeline_without_a_width_field_is_rejected() {
    let dir = format!("{}/stages/triage", env!("CARGO_MANIFEST_DIR"));
    let out = troupe().args(["bench", &dir]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("width"), "{err}");
}

#[test]
fn the_floor_validates_against_the_fanout_workers_own_schema() {
    let pipeline = troupe::definition::load_pipeline(std::path::Path::new(&fanout())).unwrap();
    let troupe::definition::StageKind::Llm(worker) = &pipeline.stage("worker").unwrap().kind else {
        panic!("worker is an LLM stage");
    };
    let floor: Value = serde_json::from_str(troupe::bench::WORKER_SCHEMA).unwrap();
    assert_eq!(worker.completion_schema.document(), &floor);
}
