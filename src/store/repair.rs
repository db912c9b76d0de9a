//! Repairing a run's audit log before a resumed session appends to it.
//!
//! The log is a prefix of the run's events: its writer writes them in
//! `seq` order, so a killed process leaves complete lines up to some
//! `seq` and a torn end after them (an open segment, perhaps a
//! half-written block; in an older troupe's plain log, a torn line). The
//! repair makes the end whole ([`auditlog::cut_to_whole`]), then appends,
//! each with the next `seq`:
//! - the `StageExited` of every execution the store has as exited whose
//!   line the log lost (it was published, so it was durable, but not yet
//!   flushed when the process died), rebuilt from the stored row with
//!   `"recovered": true` — preceded by a recovered `StageEntered` when the
//!   log lost that too, so every execution in the log is entered before it
//!   ends; for a distributed run, a result a worker reported while no
//!   coordinator read it brings all the events the worker recorded;
//! - a `StageCancelled` (reason `Session/ProcessLost`) for every
//!   execution the log shows as entered and not ended, which the resumed
//!   run runs again.
//!
//! Afterwards every execution the log shows as entered ends in exactly one
//! of `StageExited` or `StageCancelled`, and `seq` goes on without a gap
//! or a duplicate.

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use serde_json::Value;
use troupe_actors::bus::MAX_LAST_SEQ;

use crate::auditlog::{self, AuditError, Compressed, Head, LogEnd};

/// What a scan of the log found.
#[derive(Debug, Default)]
pub struct LogScan {
    /// The `seq` of the last complete line (0 for an empty log).
    pub last_seq: u64,
    /// How the log's bytes end: what stays when it is appended to.
    pub end: LogEnd,
    /// Executions entered and not ended, `stageExecutionId → stageId`:
    /// every sibling passes through it, so it is hashed with foldhash
    /// (a `BTreeMap` compared long ids that share their run's prefix),
    /// and read in order only when the repair cancels what is left.
    pub open: HashMap<String, String, foldhash::fast::RandomState>,
    /// Executions whose `StageExited` is in the log, one for each
    /// finished sibling: hashed with foldhash (SipHash of a million ids
    /// was a twentieth of the scan once the lines were gone).
    pub exited: HashSet<String, foldhash::fast::RandomState>,
    /// Session turns the log shows as started, and as ended.
    pub turns_started: HashSet<String>,
    pub turns_ended: HashSet<String>,
    /// The status of the last `WorkflowExit`, if any.
    pub last_exit: Option<String>,
}

impl LogScan {
    /// The log ends in a torn line or an open segment (a killed process),
    /// which the repair cuts or closes.
    pub fn torn(&self) -> bool {
        self.end.unfinished()
    }
}

/// Reads the log at `path` (compact or plain). Every whole line must be
/// an event; a torn end is noted, not an error.
pub fn scan(path: &Path) -> Result<LogScan, AuditError> {
    // A repair killed midway set the open segment aside: put it back, and
    // this resume repairs the log anew.
    auditlog::undo_interrupted_cut(path)?;
    let mut scan = LogScan::default();
    let mut number = 0u64;
    // A log of records is read for these members without its lines
    // (`auditlog::scan_heads`): making them was most of a resume's work.
    let end = auditlog::scan_heads(path, |head| {
        number += 1;
        let event = head
            .filter(|h| h.seq.is_some())
            .ok_or_else(|| format!("line {number} is not an audit event"))?;
        // The run goes on from the last seq: one past what any bus
        // counts to is no log troupe wrote.
        if event.seq.is_some_and(|s| s > MAX_LAST_SEQ) {
            return Err(format!("line {number} has a seq beyond {MAX_LAST_SEQ}"));
        }
        note(&mut scan, &event);
        Ok(())
    })?;
    scan.end = end;
    Ok(scan)
}

fn note(scan: &mut LogScan, e: &Head) {
    scan.last_seq = e.seq.unwrap_or(scan.last_seq);
    let id = e.stage_execution_id.as_deref().unwrap_or_default();
    match e.event.as_deref().unwrap_or_default() {
        "StageEntered" => {
            // An execution run again (a failed one, resumed) is exited
            // only once its new entry is: its earlier exit no longer says
            // how it ended.
            scan.exited.remove(id);
            scan.open.insert(
                id.to_owned(),
                e.stage_id.as_deref().unwrap_or_default().to_owned(),
            );
        }
        "StageExited" => {
            scan.open.remove(id);
            // A failed exit does not stand: resumed, the execution runs
            // again, and the store may hold a newer result whose exit this
            // log lost (the process killed before its audit writer caught
            // up with its store writer); the repair restores that one.
            if e.status.as_deref() == Some("fail") {
                scan.exited.remove(id);
            } else {
                scan.exited.insert(id.to_owned());
            }
        }
        "StageCancelled" => {
            scan.open.remove(id);
        }
        "SessionTurnStart" => {
            if let Some(t) = e.turn_id.as_deref() {
                scan.turns_started.insert(t.to_owned());
            }
        }
        "SessionTurnEnd" => {
            if let Some(t) = e.turn_id.as_deref() {
                scan.turns_ended.insert(t.to_owned());
            }
        }
        "WorkflowExit" => scan.last_exit = e.status.as_deref().map(str::to_owned),
        _ => {}
    }
}

/// What the repair wrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Repaired {
    /// The `seq` of the last line now in the log.
    pub last_seq: u64,
    pub torn_cut: bool,
    /// `StageExited` lines restored from the store.
    pub exits_restored: usize,
    /// `StageCancelled` lines for executions the dead process left open.
    pub cancels_added: usize,
}

/// An execution the store has as exited whose `StageExited` the log may
/// have lost: its records in order, the last its `StageExited` (their
/// `seq` is replaced). From the store these are a recovered
/// `StageEntered` and `StageExited`; for a result a worker reported while
/// the run had no coordinator, every event the worker recorded.
#[derive(Debug, Clone)]
pub struct LostExit {
    pub id: String,
    pub lines: Vec<Value>,
}

/// Repairs the log at `path` after `scan`: cuts a torn last line, then
/// appends the records of each execution in `lost` whose `StageExited` the
/// log does not have (leaving out a `StageEntered` the log already has),
/// and closes the executions left open. `run_id` and `ts` go into the
/// added records.
pub fn repair(
    path: &Path,
    mut scan: LogScan,
    lost: &[LostExit],
    run_id: &str,
    ts: &str,
) -> Result<(Repaired, LogScan), AuditError> {
    let mut repaired = Repaired {
        torn_cut: scan.torn(),
        ..Repaired::default()
    };
    auditlog::cut_to_whole(path, scan.end)?;
    let mut out = Vec::new();
    let mut seq = scan.last_seq;
    for exit in lost {
        if scan.exited.contains(&exit.id) {
            continue;
        }
        let entered = scan.open.contains_key(&exit.id);
        for line in &exit.lines {
            let Value::Object(fields) = line else {
                continue;
            };
            if entered && fields.get("event").and_then(Value::as_str) == Some("StageEntered") {
                continue;
            }
            seq += 1;
            let mut record = serde_json::Map::with_capacity(fields.len() + 1);
            record.insert("seq".into(), seq.into());
            for (k, v) in fields {
                if k != "seq" {
                    record.insert(k.clone(), v.clone());
                }
            }
            out.extend_from_slice(Value::Object(record).to_string().as_bytes());
            out.push(b'\n');
        }
        scan.open.remove(&exit.id);
        scan.exited.insert(exit.id.clone());
        repaired.exits_restored += 1;
    }
    // In `stageExecutionId` order, whatever the map's.
    let mut left: Vec<(String, String)> = std::mem::take(&mut scan.open).into_iter().collect();
    left.sort_unstable();
    for (id, stage) in left {
        seq += 1;
        let record = serde_json::json!({
            "seq": seq,
            "ts": ts,
            "event": "StageCancelled",
            "workflowRunId": run_id,
            "stageExecutionId": id,
            "stageId": stage,
            "reason": "Session/ProcessLost: the process running the run ended before this execution did; the resumed run runs it again",
            "recovered": true,
        });
        out.extend_from_slice(record.to_string().as_bytes());
        out.push(b'\n');
        repaired.cancels_added += 1;
    }
    append(path, &out)?;
    // Whole now, to its last byte.
    let len = std::fs::metadata(path)
        .map_err(|source| AuditError::Io {
            path: path.to_owned(),
            source,
        })?
        .len();
    scan.last_seq = seq;
    scan.end = LogEnd {
        keep: len,
        fed: len,
    };
    repaired.last_seq = seq;
    Ok((repaired, scan))
}

/// Appends whole lines to the log at `path` (which ends whole): plain, or
/// as one closed segment of a compact log.
fn append(path: &Path, lines: &[u8]) -> Result<(), AuditError> {
    if lines.is_empty() {
        return Ok(());
    }
    let io = |source| AuditError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = OpenOptions::new().append(true).open(path).map_err(io)?;
    if auditlog::is_plain(path) {
        file.write_all(lines).map_err(io)?;
    } else {
        let format = auditlog::format_of(path)?;
        let mut log = Compressed::append(file, format).map_err(io)?;
        log.write_lines(lines).map_err(io)?;
        file = log.finish().map_err(io)?;
    }
    file.sync_data().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, event: &str, id: &str) -> String {
        format!(
            "{{\"seq\":{seq},\"ts\":\"t\",\"event\":\"{event}\",\"workflowRunId\":\"r\",\"stageExecutionId\":\"{id}\",\"stageId\":\"w\"}}\n"
        )
    }

    /// As the store gives it: a recovered entry and the exit.
    fn lost(id: &str) -> LostExit {
        let record = |event: &str| serde_json::from_str(&line(0, event, id)).expect("a record");
        LostExit {
            id: id.to_owned(),
            lines: vec![record("StageEntered"), record("StageExited")],
        }
    }

    /// A failed execution run again: entered after its exit, it is open,
    /// not exited, so a committed exit its new session's log lost is
    /// restored rather than taken as there.
    #[test]
    fn an_execution_entered_again_after_its_exit_is_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        let log = [
            line(1, "StageEntered", "r/w#7/1"),
            line(2, "StageExited", "r/w#7/1"),
            line(3, "StageEntered", "r/w#7/1"),
        ]
        .concat();
        std::fs::write(&path, log).expect("write");
        let scan = scan(&path).expect("scan");
        assert!(!scan.exited.contains("r/w#7/1"));
        assert!(scan.open.contains_key("r/w#7/1"));
        let (repaired, _) = repair(&path, scan, &[lost("r/w#7/1")], "r", "t").expect("repair");
        assert_eq!(repaired.exits_restored, 1);
        assert_eq!(repaired.cancels_added, 0);
        let text = std::fs::read_to_string(&path).expect("read");
        let events: Vec<&str> = text
            .lines()
            .map(|l| {
                if l.contains("StageEntered") {
                    "in"
                } else {
                    "out"
                }
            })
            .collect();
        assert_eq!(events, ["in", "out", "in", "out"], "{text}");
    }

    /// A failed exit does not stand: the execution, resumed and run again
    /// to ok, whose new lines the killed process never wrote, gets its
    /// stored ok exit back rather than keeping `fail` as its last word.
    #[test]
    fn a_failed_exit_does_not_hide_a_newer_stored_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        let failed = line(2, "StageExited", "r/w#7/1").replace("}\n", ",\"verdict\":\"fail\"}\n");
        let ok = line(4, "StageExited", "r/w#8/1").replace("}\n", ",\"verdict\":\"ok\"}\n");
        let log = [
            line(1, "StageEntered", "r/w#7/1"),
            failed,
            line(3, "StageEntered", "r/w#8/1"),
            ok,
        ]
        .concat();
        std::fs::write(&path, log).expect("write");
        let scan = scan(&path).expect("scan");
        assert!(!scan.exited.contains("r/w#7/1"), "a failed exit");
        assert!(scan.exited.contains("r/w#8/1"), "an ok exit stands");
        assert!(scan.open.is_empty());
        let (repaired, _) =
            repair(&path, scan, &[lost("r/w#7/1"), lost("r/w#8/1")], "r", "t").expect("repair");
        assert_eq!(repaired.exits_restored, 1, "#7's, not #8's again");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 6, "{text}");
    }

    #[test]
    fn an_execution_the_log_lost_entirely_is_entered_before_it_exits() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, line(1, "StageEntered", "r/w#0/1")).expect("write");
        let scan = scan(&path).expect("scan");
        let (repaired, scan) = repair(&path, scan, &[lost("r/w#1/1")], "r", "t").expect("repair");
        assert_eq!(repaired.exits_restored, 1);
        assert_eq!(repaired.cancels_added, 1);
        assert!(scan.open.is_empty());
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<(u64, String, String)> = text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).expect("a whole line");
                (
                    v["seq"].as_u64().expect("seq"),
                    v["event"].as_str().expect("event").to_owned(),
                    v["stageExecutionId"].as_str().expect("id").to_owned(),
                )
            })
            .collect();
        let expect = |seq: u64, event: &str, id: &str| (seq, event.to_owned(), id.to_owned());
        assert_eq!(
            lines,
            [
                expect(1, "StageEntered", "r/w#0/1"),
                expect(2, "StageEntered", "r/w#1/1"),
                expect(3, "StageExited", "r/w#1/1"),
                expect(4, "StageCancelled", "r/w#0/1"),
            ]
        );
    }

    /// Executions left open are cancelled in `stageExecutionId` order,
    /// whatever order the scan kept them in: a resume of the same log
    /// appends the same lines.
    #[test]
    fn open_executions_are_cancelled_in_the_order_of_their_ids() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        let ids: Vec<String> = (0..40).rev().map(|i| format!("r/w#{i:02}/1")).collect();
        let log: String = ids
            .iter()
            .enumerate()
            .map(|(seq, id)| line(seq as u64 + 1, "StageEntered", id))
            .collect();
        std::fs::write(&path, &log).expect("write");
        let scan = scan(&path).expect("scan");
        let (repaired, _) = repair(&path, scan, &[], "r", "t").expect("repair");
        assert_eq!(repaired.cancels_added, 40);
        let text = std::fs::read_to_string(&path).expect("read");
        let cancelled: Vec<String> = text
            .lines()
            .filter(|l| l.contains("StageCancelled"))
            .map(|l| {
                let v: Value = serde_json::from_str(l).expect("a whole line");
                v["stageExecutionId"].as_str().expect("id").to_owned()
            })
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(cancelled, sorted);
    }

    #[test]
    fn a_seq_no_bus_counts_to_is_refused_not_continued() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        let mut log = line(1, "StageEntered", "r/w#0/1");
        log += &line(MAX_LAST_SEQ, "StageExited", "r/w#0/1");
        std::fs::write(&path, &log).expect("write");
        assert_eq!(scan(&path).expect("scan").last_seq, MAX_LAST_SEQ);
        log += &line(u64::MAX, "StageEntered", "r/w#1/1");
        std::fs::write(&path, &log).expect("write");
        let refused = scan(&path).expect_err("refused").to_string();
        assert!(refused.contains("line 3 has a seq beyond"), "{refused}");
    }

    #[test]
    fn a_torn_line_is_cut_lost_exits_restored_and_open_executions_closed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        let mut log = String::new();
        log += &line(1, "StageEntered", "r/w#0/1");
        log += &line(2, "StageEntered", "r/w#1/1");
        log += &line(3, "StageEntered", "r/w#2/1");
        log += &line(4, "StageExited", "r/w#0/1");
        log += "{\"seq\":5,\"ts\":\"t\",\"eve";
        std::fs::write(&path, &log).expect("write");
        let scan = scan(&path).expect("scan");
        assert!(scan.torn());
        assert_eq!(scan.last_seq, 4);
        assert_eq!(scan.open.len(), 2);
        // The store has w#1's exit (its line was lost); w#2 ran no Exit.
        let stored = vec![lost("r/w#0/1"), lost("r/w#1/1")];
        let (repaired, scan) = repair(&path, scan, &stored, "r", "t").expect("repair");
        assert_eq!(
            repaired,
            Repaired {
                last_seq: 6,
                torn_cut: true,
                exits_restored: 1,
                cancels_added: 1
            }
        );
        assert!(scan.open.is_empty());
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a whole line"))
            .collect();
        let seqs: Vec<u64> = lines
            .iter()
            .map(|l| l["seq"].as_u64().expect("seq"))
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
        assert_eq!(lines[4]["event"], "StageExited");
        assert_eq!(lines[4]["stageExecutionId"], "r/w#1/1");
        assert_eq!(lines[5]["event"], "StageCancelled");
        assert_eq!(lines[5]["stageExecutionId"], "r/w#2/1");
    }

    #[test]
    fn a_broken_line_in_the_middle_is_an_error_not_a_repair() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.jsonl");
        let log = format!(
            "{}garbage\n{}",
            line(1, "StageEntered", "a"),
            line(2, "StageExited", "a")
        );
        std::fs::write(&path, log).expect("write");
        let err = scan(&path).expect_err("refused").to_string();
        assert!(err.contains("line 2 is not an audit event"), "{err}");
    }

    #[test]
    fn a_compact_log_cut_inside_a_block_keeps_its_whole_blocks_and_ends_closed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(auditlog::FILE);
        let file = std::fs::File::create(&path).expect("create");
        let mut log = Compressed::create(file).expect("a log");
        let mut first = String::new();
        first += &line(1, "StageEntered", "r/w#0/1");
        first += &line(2, "StageEntered", "r/w#1/1");
        first += &line(3, "StageExited", "r/w#0/1");
        log.write_lines(first.as_bytes()).expect("write");
        log.flush().expect("a block ends");
        log.write_lines(line(4, "StageExited", "r/w#1/1").as_bytes())
            .expect("write");
        log.flush().expect("a block ends");
        // Killed inside the second block: it never gets its end.
        drop(log);
        let len = std::fs::metadata(&path).expect("meta").len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(len - 3))
            .expect("cut");
        let scanned = scan(&path).expect("scan");
        assert!(scanned.torn());
        assert_eq!(scanned.last_seq, 3);
        assert_eq!(scanned.open.keys().collect::<Vec<_>>(), ["r/w#1/1"]);
        let (repaired, after) = repair(&path, scanned, &[], "r", "t").expect("repair");
        assert_eq!(
            repaired,
            Repaired {
                last_seq: 4,
                torn_cut: true,
                exits_restored: 0,
                cancels_added: 1
            }
        );
        // Every segment is closed (the stock zstd decoder reads every
        // frame), and seq goes on without a gap.
        let bytes = std::fs::read(&path).expect("read");
        zstd::decode_all(&bytes[..]).expect("closed frames");
        assert!(!scan(&path).expect("scan").torn());
        let text = auditlog::read_text(&path).expect("a whole log");
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).expect("a line")["seq"]
                    .as_u64()
                    .expect("seq")
            })
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
        assert!(
            text.lines()
                .last()
                .expect("a line")
                .contains("StageCancelled")
        );
        let again = scan(&path).expect("scan again");
        assert!(!again.torn(), "the repaired log ends whole");
        assert_eq!(after.end, again.end, "the repair knows where it ends");
    }
}
