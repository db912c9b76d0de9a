//! `troupe serve`'s `/metrics` through a real server: the token guards
//! it, and the exposition, checked against the Prometheus text format's
//! grammar, counts the runs, executions, requests, cost, tool calls,
//! waiting answers and siblings waiting for a slot.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;
use common::serve::{Server, asking, cli, fanout, get, submit, until, wait_json};

/// A Prometheus text-format exposition, checked against the format's
/// grammar: `# HELP`/`# TYPE` before a family's samples, valid names and
/// labels, numeric values. The samples, by `name{labels}`.
fn parse_exposition(text: &str) -> std::collections::BTreeMap<String, f64> {
    use std::collections::{BTreeMap, BTreeSet};
    let name_ok = |n: &str| {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut typed = BTreeSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(name_ok(name), "{line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(name_ok(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(kind != "counter" || name.ends_with("_total"), "{line}");
            typed.insert(name.to_owned());
        } else {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            let name = series.split('{').next().unwrap();
            assert!(
                name_ok(name) && typed.contains(name),
                "{line}: not declared"
            );
            if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
                let inner = labels
                    .strip_prefix('{')
                    .and_then(|l| l.strip_suffix('}'))
                    .unwrap();
                for pair in inner.split("\",") {
                    let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
                    assert!(name_ok(k), "{line}");
                    assert!(!v.trim_end_matches('"').contains('\n'), "{line}");
                }
            }
            assert!(
                samples.insert(series.to_owned(), value).is_none(),
                "{line} twice"
            );
        }
    }
    samples
}

#[test]
fn metrics_count_the_runs_executions_requests_and_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--listen", "tcp:127.0.0.1:0"]);
    let addr = server.tcp();
    let token = std::fs::read_to_string(dir.path().join(".troupe/token")).unwrap();
    let bearer = format!("Authorization: Bearer {}\r\n", token.trim());
    assert_eq!(
        get(&addr, "/metrics", "").0,
        401,
        "the token guards the metrics too"
    );
    let fanout = fanout();
    let url = format!("http://{addr}");
    // The first run knows its model's price, the second does not.
    for (width, price) in [("20", "1,2"), ("5", "")] {
        let width = format!("width={width}");
        let mut args = vec![
            "submit",
            fanout.to_str().unwrap(),
            "--ctx",
            &width,
            "--server",
            &url,
            "--watch",
        ];
        if !price.is_empty() {
            args.extend(["--price", price]);
        }
        let out = cli(dir.path(), &args);
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    }
    let pipeline = asking();
    let waiting = submit(
        dir.path(),
        &[pipeline.path().to_str().unwrap(), "--server", &url],
    );
    let _ = wait_json(
        dir.path(),
        &["pending", &waiting, "--json", "--server", &url],
        "an approval",
        |v| v.get(0)?["proposalId"].as_str().map(str::to_owned),
    );
    let (status, head, body) = get(&addr, "/metrics", &bearer);
    assert_eq!(status, 200);
    assert!(
        head.to_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let m = parse_exposition(&body);
    assert_eq!(m["troupe_runs{status=\"ok\"}"], 2.0, "{body}");
    assert_eq!(m["troupe_runs{status=\"running\"}"], 1.0, "{body}");
    assert_eq!(
        m["troupe_executions{stage=\"worker\",state=\"ok\"}"], 25.0,
        "{body}"
    );
    assert_eq!(
        m["troupe_executions{stage=\"reduce\",state=\"ok\"}"], 2.0,
        "{body}"
    );
    assert_eq!(
        m["troupe_executions{stage=\"s\",state=\"running\"}"], 1.0,
        "{body}"
    );
    assert_eq!(
        m["troupe_waiting_answers{kind=\"approval\"}"], 1.0,
        "{body}"
    );
    // Every fanout sibling is two model turns; plus the plan's and reduce's.
    assert!(
        m["troupe_model_requests_total{model=\"scripted\"}"] >= 2.0 * 25.0,
        "{body}"
    );
    assert!(
        m["troupe_tokens_total{model=\"scripted\",kind=\"input\"}"] > 0.0,
        "{body}"
    );
    let cost = m["troupe_model_cost_usd_total{model=\"scripted\"}"];
    let at_most = (m["troupe_tokens_total{model=\"scripted\",kind=\"input\"}"]
        + 2.0 * m["troupe_tokens_total{model=\"scripted\",kind=\"output\"}"])
        / 1e6;
    assert!(
        cost > 0.0 && cost < at_most,
        "{cost} of at most {at_most}: {body}"
    );
    assert!(m["troupe_audit_events_total"] > 100.0, "{body}");
    assert!(m.contains_key("troupe_audit_idle_seconds"), "{body}");
    // Nothing is waiting to be stored once the runs are at rest.
    assert_eq!(m["troupe_store_queued_records"], 0.0, "{body}");
    let out = cli(dir.path(), &["cancel", &waiting, "--server", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));

    // A fan-out of three under cap 1 whose first sibling waits for an
    // approval: two siblings wait for a slot.
    let worker =
        common::stage_md("worker", "", "Work.").replace("allowedTools: [Read]", "allowedTools: []");
    let plan = common::stage_md("plan", "", "Plan.").replace(
        "required: [summary]\n  properties:\n    summary: { type: string }",
        "required: [items]\n  properties:\n    items: { type: array }",
    );
    let fan = common::Fixture::new(
        "id: fan\nentry: plan\nstages:\n  plan: plan.md\n  worker: worker.md\nnext:\n  plan: { parallel: { map: worker, over: \"ctx.upstream[0].parsed.items\", cap: 1 } }\n  worker: end\n",
        &[
            ("plan.md", &plan),
            ("worker.md", &worker),
            (
                "script.yaml",
                "stages:\n  plan:\n    - complete: { items: [1, 2, 3] }\n  worker:\n    - tool: Echo\n      args: { text: hi }\n    - complete: { summary: done }\n",
            ),
        ],
    );
    let fanning = submit(
        dir.path(),
        &[fan.path().to_str().unwrap(), "--server", &url],
    );
    let _ = wait_json(
        dir.path(),
        &["pending", &fanning, "--json", "--server", &url],
        "an approval",
        |v| v.get(0)?["proposalId"].as_str().map(str::to_owned),
    );
    let (_, _, body) = get(&addr, "/metrics", &bearer);
    let m = parse_exposition(&body);
    assert_eq!(
        m["troupe_executions_waiting{stage=\"worker\"}"], 2.0,
        "{body}"
    );
    let out = cli(dir.path(), &["cancel", &fanning, "--server", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    until("the cancel to be counted", || {
        let (_, _, body) = get(&addr, "/metrics", &bearer);
        parse_exposition(&body)["troupe_runs{status=\"cancelled\"}"] == 2.0
    });
}
