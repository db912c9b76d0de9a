//! What `troupe run` and `troupe resume` print: the summary as text or
//! JSON (one last `Summary` line when the event stream is on stdout), the
//! provider line, notes from the capability check, a failed check, and
//! the text of `print` steps.

use serde_json::Value;

use crate::error::HasCode;
use crate::provider::openai::{CheckError, CheckReport, OpenAiProvider, ProviderStats};
use crate::runtime::summary::{RunReport, RunStatus};

/// Prints the run's report. With `events` on stdout, text goes to stderr
/// and JSON becomes the stream's last line. Fails when stdout cannot be
/// written (a reader that went away, a full disk): the caller says so and
/// exits accordingly, rather than with the run's own status.
pub fn print_report(
    report: &RunReport,
    stats: Option<&ProviderStats>,
    json: bool,
    events: bool,
    last_seq: u64,
) -> std::io::Result<()> {
    use std::io::Write;
    for w in &report.warnings {
        say!("warning: {w}");
    }
    if json && !events {
        // Written straight to stdout as it is serialized: a wide run's
        // summary (a result per sibling) is never built as a document in
        // memory first.
        #[derive(serde::Serialize)]
        struct Printed<'a> {
            #[serde(flatten)]
            report: &'a RunReport,
            #[serde(skip_serializing_if = "Option::is_none")]
            provider: Option<&'a ProviderStats>,
        }
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        serde_json::to_writer_pretty(
            &mut out,
            &Printed {
                report,
                provider: stats,
            },
        )
        .map_err(std::io::Error::from)?;
        out.write_all(b"\n")?;
        return out.flush();
    }
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(report).unwrap_or(Value::Null);
        if let (Some(obj), Some(stats)) = (value.as_object_mut(), stats) {
            obj.insert(
                "provider".to_owned(),
                serde_json::to_value(stats).unwrap_or(Value::Null),
            );
        }
        // The event stream is JSON lines: the summary is its last line,
        // with the head keys every line has.
        let line = serde_json::to_string(&summary_line(value, report, last_seq))
            .map_err(std::io::Error::from)?;
        writeln!(out, "{line}")?;
        return out.flush();
    }
    let mut text = report.to_text();
    if let Some(s) = stats {
        text.push_str(&provider_line(s));
    }
    // Reasons and warnings quote what models, commands and servers said.
    let text = terminal_safe(&text);
    if events {
        // The events are the output then; a summary stderr cannot take
        // is lost, as a warning is (`say!`).
        let _ = write!(std::io::stderr(), "{text}");
        return Ok(());
    }
    write!(out, "{text}")?;
    if let RunStatus::Ok = report.status {
        for output in report.results.values().map(|r| r.output()) {
            if let Some(text) = output.get("text").and_then(Value::as_str) {
                writeln!(out, "\n{text}")?;
            }
        }
    }
    out.flush()
}

/// The report as the store keeps it: the summary without the results
/// (those are the store's executions), which are set aside while it is
/// serialized rather than serialized and dropped.
pub fn stored_summary(report: &mut RunReport, stats: Option<&ProviderStats>) -> Value {
    let results = std::mem::take(&mut report.all_results);
    let mut value = serde_json::to_value(&*report).unwrap_or(Value::Null);
    report.all_results = results;
    if let Some(obj) = value.as_object_mut() {
        obj.remove("results");
        if let Some(stats) = stats {
            obj.insert(
                "provider".to_owned(),
                serde_json::to_value(stats).unwrap_or(Value::Null),
            );
        }
    }
    value
}

/// The `--json` summary as the last line of the `--events -` stream: kind
/// `Summary`, with the head keys (`seq` one past the run's last event).
fn summary_line(report: Value, run: &RunReport, last_seq: u64) -> Value {
    let mut line = serde_json::Map::new();
    line.insert("seq".into(), (last_seq + 1).into());
    line.insert(
        "ts".into(),
        crate::runtime::events::rfc3339(std::time::SystemTime::now()).into(),
    );
    line.insert("event".into(), "Summary".into());
    line.insert("workflowRunId".into(), run.run_id.clone().into());
    if let Value::Object(fields) = report {
        for (k, v) in fields {
            if k != "runId" {
                line.insert(k, v);
            }
        }
    }
    Value::Object(line)
}

/// Says on stderr what the capability check found when it matters: a
/// server that cannot force a tool call is asked with `auto`.
pub fn note_check(provider: &OpenAiProvider, report: &CheckReport) {
    if let Some(refused) = &report.forced_choice_refused {
        say!(
            "note: {} cannot force a tool call (tool_choice \"required\" was refused: {refused}); troupe asks with tool_choice \"auto\" and an instruction to call the completion tool",
            provider.config().base_url
        );
    }
}

/// One summary line: where the model requests went and how the limit held.
fn provider_line(s: &ProviderStats) -> String {
    format!(
        "provider openai: model {} at {} ({}), {} requests, peak {} in flight of {} allowed, {} waited for a slot\n",
        s.model.as_deref().unwrap_or("?"),
        s.base_url,
        if s.stream { "streaming" } else { "no stream" },
        s.requests,
        s.peak_in_flight,
        s.max_inflight,
        s.waited_for_slot
    )
}

/// A failed capability check, as text on stderr or JSON on stdout.
pub fn print_check_error(e: &CheckError, json: bool) {
    if json {
        let v = serde_json::json!({
            "status": "error",
            "code": e.code().to_string(),
            "message": e.message,
            "hint": e.hint,
        });
        tell!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        say!("error: {}: {}\n  hint: {}", e.code(), e.message, e.hint);
    }
}

/// A typed error that stops a command before anything ran: as JSON on
/// stdout with `--json`, else on stderr with its hint; exit 2.
pub fn typed_failure(code: &str, message: &str, hint: &str, json: bool) -> super::Exit {
    if json {
        let v = serde_json::json!({
            "status": "error",
            "code": code,
            "message": message,
            "hint": hint,
        });
        tell!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        say!("error: {code}: {message}\n  hint: {hint}");
    }
    super::Exit::Invalid
}

/// `text` as it may go to a terminal: control characters other than a
/// line's own (newline, tab), and those that reorder text (bidi marks and
/// overrides), shown as U+FFFD. A model's reply, a command's output or a
/// server's message may hold escape sequences that clear the screen, set
/// the clipboard, link elsewhere or fake a prompt next to a real one.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| if unsafe_char(c) { '\u{FFFD}' } else { c })
            .collect(),
    )
}

#[cfg(test)]
mod terminal_tests {
    use super::terminal_safe;

    #[test]
    fn escape_sequences_and_reordering_marks_are_shown_not_obeyed() {
        assert_eq!(terminal_safe("plain\ttext\nnext"), "plain\ttext\nnext");
        let hostile = "ok\x1b]52;c;aGk=\x07 \x1b[2J\u{9b}31m \u{202e}txt.exe\r fake";
        let shown = terminal_safe(hostile);
        assert!(
            !shown
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{shown:?}"
        );
        assert!(!shown.contains('\u{202e}'));
        assert_eq!(shown.matches('\u{FFFD}').count(), 6, "{shown:?}");
        assert!(shown.starts_with("ok\u{FFFD}]52;c;aGk=\u{FFFD} "));
    }
}
