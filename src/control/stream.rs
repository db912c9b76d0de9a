//! A run's events as Server-Sent Events, read from its audit log (not the
//! event bus): a client that stops reading holds up nothing but its own
//! connection, and reconnecting from a `seq` (`Last-Event-ID`) loses
//! nothing the log has.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use serde_json::Value;

use super::hosted::RunControl;
use crate::auditlog::Follower;

/// How often a stream at the end of the log looks for more.
const FOLLOW_POLL: Duration = Duration::from_millis(20);

/// An audit line's `seq` and event name, read from the fixed head the
/// audit writer gives every line (`{"seq":N,"ts":…,"event":"…"`): ten
/// watchers cost ten scans of a line, not ten parses. `None` for a line
/// without that head.
pub fn line_head(line: &str) -> Option<(u64, &str)> {
    let rest = line.strip_prefix("{\"seq\":")?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let seq = rest[..digits].parse::<u64>().ok()?;
    let event_at = rest.find("\"event\":\"")? + "\"event\":\"".len();
    let name = &rest[event_at..];
    Some((seq, &name[..name.find('"')?]))
}

/// A log line's `seq` and whether it is the `WorkflowExit`; a line
/// without the writer's head is parsed.
fn seq_and_exit(line: &str) -> Option<(u64, bool)> {
    line_head(line)
        .map(|(seq, event)| (seq, event == "WorkflowExit"))
        .or_else(|| {
            let v: Value = serde_json::from_str(line).ok()?;
            Some((v["seq"].as_u64()?, v["event"] == "WorkflowExit"))
        })
}

/// Events of one batch are written as one piece: a write per event per
/// watcher would cost more than the run (measured: ten watchers of a
/// 100 000-wide run). File bytes read at once (compressed).
const BATCH_BYTES: usize = 64 * 1024;

/// Idle polls between keep-alive comments (about 15 s).
const KEEP_ALIVE_POLLS: u32 = 750;

/// The audit log's lines with `seq` > `after`, as Server-Sent Events
/// (`id: <seq>`, `data: <line>`), in batches of what was appended at once,
/// following the file until its `WorkflowExit` (this session's: a resumed
/// run's earlier exits are not its end). When the run's session is over
/// and the log has nothing more, the stream ends too, with an `event: end`
/// whose data is the typed error of a run refused after it was accepted
/// (`{"error":{"code":"Control/RunRefused",…}}`).
pub fn follow(
    control: Arc<RunControl>,
    after: u64,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    struct Tail {
        control: Arc<RunControl>,
        log: Option<Follower>,
        after: u64,
        done: bool,
        /// The last whole line read was a `WorkflowExit`.
        last_was_exit: bool,
        idle: u32,
    }
    let tail = Tail {
        log: Some(Follower::new(&control.audit_path)),
        control,
        after,
        done: false,
        last_was_exit: false,
        idle: 0,
    };
    futures::stream::unfold(tail, |mut t| async move {
        loop {
            if t.done {
                return None;
            }
            // Whether its session was over before this read: then what the
            // read finds is all there will be.
            let ended = t.control.has_ended();
            let base = t.control.base_seq();
            // Read what was appended since last time (the follower goes to
            // the blocking pool and back).
            let mut log = t.log.take()?;
            let read = tokio::task::spawn_blocking(move || {
                let mut lines = Vec::new();
                let read = log.read_more(BATCH_BYTES, &mut lines);
                (log, read, lines)
            })
            .await;
            let Ok((log, read, lines)) = read else {
                return None;
            };
            t.log = Some(log);
            let (grew, at_end) = match read {
                Ok(n) => (n > 0, n < BATCH_BYTES),
                Err(e) => {
                    // A log that cannot be read ends the stream with the
                    // error as its last comment.
                    t.done = true;
                    let said = format!(": {}: {e}\n\n", e.code());
                    return Some((Ok(Bytes::from(said)), t));
                }
            };
            let mut batch = String::new();
            for line in lines.split(|b| *b == b'\n') {
                let Ok(line) = std::str::from_utf8(line) else {
                    continue;
                };
                let line = line.trim_end();
                let Some((seq, exit)) = seq_and_exit(line) else {
                    continue;
                };
                t.last_was_exit = exit && seq > base;
                if seq > t.after {
                    t.after = seq;
                    batch.push_str("id: ");
                    batch.push_str(&seq.to_string());
                    batch.push_str("\ndata: ");
                    batch.push_str(line);
                    batch.push_str("\n\n");
                }
            }
            // The run is over when the log ends with its exit (a resumed
            // run's earlier exit is followed by more).
            if at_end && t.last_was_exit {
                t.done = true;
            }
            if !batch.is_empty() {
                t.idle = 0;
                return Some((Ok(Bytes::from(batch)), t));
            }
            if t.done {
                return None;
            }
            if !grew && ended {
                t.done = true;
                let said = if t.control.withdrawn() {
                    let cancelled = serde_json::json!({"cancelled": {
                        "message": "the run was cancelled while it waited for a place, before it started",
                    }});
                    format!("event: end\ndata: {cancelled}\n\n")
                } else {
                    t.control.refusal().map_or_else(
                        || "event: end\ndata: {}\n\n".to_owned(),
                        |why| {
                            let error = serde_json::json!({"error": {
                                "code": "Control/RunRefused",
                                "message": format!("the run was accepted, then refused before it ran: {why}"),
                            }});
                            format!("event: end\ndata: {error}\n\n")
                        },
                    )
                };
                return Some((Ok(Bytes::from(said)), t));
            }
            if !grew {
                t.idle += 1;
                if t.idle >= KEEP_ALIVE_POLLS {
                    t.idle = 0;
                    return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), t));
                }
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        }
    })
}
