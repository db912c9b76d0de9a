//! A server's faults as a tool step meets them: a step has no model to
//! call again, so it asks once more itself when the server exited.

use super::*;

#[test]
fn a_tool_step_whose_server_exits_asks_the_restarted_server_once_more() {
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: {{ kind: tool, tool: srv__crash }}\nnext:\n  s: end\n",
        fault_block("srv", Path::new(STATS), &[], "")
    );
    let project = project(&yaml, &[]);
    let (out, _, audit) = run(&project, &[]);
    // The fault server's `crash` exits on every call: both tries fail.
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    assert_eq!(failed.len(), 2, "{audit:#?}");
    assert!(
        failed
            .iter()
            .all(|e| e["code"] == "ToolTransient/ServerExited"),
        "{failed:#?}"
    );
    assert_eq!(failed[0]["retrying"], true);
    assert_eq!(failed[1].get("retrying"), None);
    assert_eq!(events(&audit, "ToolInvocationStarted").len(), 2);
    let seen = server_saw(&project.path().join(STATS));
    assert_eq!(count(&seen, "crash"), 2, "asked twice: {seen:?}");
    assert_eq!(count(&seen, "start"), 2, "started again once: {seen:?}");
}

/// A result with a content block of a kind the client does not know is
/// shown with that block named, not refused whole.
#[test]
fn an_unknown_kind_of_content_is_named_and_the_rest_shown() {
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: {{ kind: tool, tool: srv__mixed }}\nnext:\n  s: end\n",
        fault_block("srv", Path::new(STATS), &[], "")
    );
    let project = project(&yaml, &[]);
    let (out, summary, _) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = parsed(&summary, "s")["text"].as_str().unwrap().to_owned();
    assert_eq!(text, "known\n[hologram content, not shown]");
    // A task where the call's result should be is refused, not taken as
    // an empty result.
    let yaml = yaml.replace("srv__mixed", "srv__tasky");
    let project = self::project(&yaml, &[]);
    let (out, _, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    assert_eq!(failed[0]["code"], "ToolTerminal/McpError", "{failed:#?}");
    assert!(
        failed[0]["message"]
            .as_str()
            .unwrap()
            .contains("\"task\" result")
    );
}

/// A result sent as one message over 16 MiB (more than troupe reads)
/// fails the call at once, naming why, instead of waiting for the call's
/// timeout; the server starts again for the next call.
#[test]
fn a_message_too_long_to_read_fails_the_call_at_once_and_says_why() {
    let yaml = format!(
        "id: t\nentry: big\nmcpServers:\n{}stages:\n  big: {{ kind: tool, tool: srv__big, args: {{ bytes: 17000000 }} }}\nnext:\n  big: end\n",
        fault_block("srv", Path::new(STATS), &[], "    timeout: 30s\n")
    );
    let project = project(&yaml, &[]);
    let (out, _, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["code"], "ToolTerminal/ResultTooLarge");
    assert!(
        failed[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("over 16 MiB")),
        "{failed:#?}"
    );
}

/// A signal while the run is being prepared (here, while its MCP server
/// starts) is not lost to its default action, which left a run folder and
/// no record: the run starts, is cancelled at once, and says so.
#[test]
fn a_signal_while_the_run_is_prepared_cancels_it_as_it_starts() {
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: {{ kind: tool, tool: srv__echo, args: {{ text: hi }} }}\nnext:\n  s: end\n",
        fault_block("srv", Path::new(STATS), &["brief-start"], "")
    );
    let project = project(&yaml, &[]);
    let run = project.spawn(&["run", "p", "--events", "-", "--headless"]);
    let stats = project.path().join(STATS);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while count(&server_saw(&stats), "start") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    run.signal(nix::sys::signal::Signal::SIGINT);
    let done = run.finish();
    assert_eq!(done.code, Some(130), "{}", done.stderr);
    assert!(
        done.stderr.contains("cancelling the run"),
        "{}",
        done.stderr
    );
    let last = done.events.last().expect("events");
    assert_eq!(last["event"], "WorkflowExit", "{last}");
    assert_eq!(last["status"], "cancelled", "{last}");
    assert_eq!(count(&server_saw(&stats), "call"), 0, "nothing ran");
}
