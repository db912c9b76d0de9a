//! The store's packs: how executions' ends are kept on disk.
//!
//! Each transaction of the store's writer stores what it commits for a
//! run as one row of `packs`: the records in the order they came, each
//! encoded by the execution that made it, on its own thread
//! ([`encode_exit`], [`encode_cancel`]). A row per execution made the
//! writer, which every finished sibling waits for before its slot frees,
//! do SQLite's whole insert (statement program, B-tree seeks and splits)
//! once per sibling: about 5 µs a sibling on a 16-core machine, and the
//! pace of a wide run there. A pack is one insert per transaction.
//!
//! Readers fold a run's records in the order they were stored ([`Fold`]):
//! a later record of the same execution replaces an earlier one unless the
//! earlier one exited with a verdict other than `fail` — the rule the
//! writer's upsert applied when executions were rows.
//!
//! The format is troupe's own, byte for byte, so that a damaged pack is
//! found and named, never half read: a pack is a format byte, then
//! records, each a 4-byte little-endian length and that many bytes.
//! Inside a record, numbers are LEB128 varints and strings a varint length
//! and UTF-8. An exit:
//!
//! ```text
//! 'E' exec stage sibling+1 visit attempts prompt completion requests
//!     entered+1 ended verdict(0 ok, 1 fail, 2 skipped) cap_hit(0|1)
//!     reason? parsed output?
//! ```
//!
//! and a cancellation:
//!
//! ```text
//! 'C' exec stage sibling+1 visit attempts prompt completion requests
//!     entered+1 ended reason phase turn tool_calls
//! ```
//!
//! where `x+1` is 0 for none, `x?` a 0 byte for none or a 1 byte and the
//! string, `parsed` and `output` are JSON text and `exec` is the
//! execution's id without the run's (`worker#7/1`).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::provider::Usage;
use crate::runtime::ledger::{CancelRecord, ExitRecord};
use crate::runtime::result::Verdict;

/// Unix milliseconds of `t`.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// An execution's key within its run: its `stageExecutionId` without the
/// leading `<workflowRunId>/`, which every record of the run would repeat.
pub fn exec_key<'a>(run_id: &str, stage_execution_id: &'a str) -> &'a str {
    stage_execution_id
        .strip_prefix(run_id)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(stage_execution_id)
}

/// The first byte of every pack this troupe writes.
pub const FORMAT: u8 = 1;

/// A pack grows to about this size before the writer starts another row
/// for the same transaction (a single record may be larger).
pub const PACK_BYTES: usize = 1 << 20;

const EXIT: u8 = b'E';
const CANCEL: u8 = b'C';

/// A pack's first bytes, before any record.
pub fn start(pack: &mut Vec<u8>) {
    pack.push(FORMAT);
}

/// An exit, encoded as a pack's record.
pub fn encode_exit(record: &ExitRecord) -> Vec<u8> {
    let mut out = Vec::new();
    encode_exit_into(record, &mut out);
    out
}

/// An exit, encoded as a pack's record at the end of `out` (the records
/// an arbiter holds for the writer, back to back).
pub fn encode_exit_into(record: &ExitRecord, out: &mut Vec<u8>) {
    let result = &record.result;
    let (parsed, output) = result.json_text();
    encode_into(
        &Stored {
            exec: exec_key(&record.run_id, &record.stage_execution_id),
            stage_id: &record.stage_id,
            index: record.index.map(|i| i as u64),
            visit: record.visit,
            attempts: result.attempt_count(),
            usage: result.usage(),
            entered_at: known_ms(record.entered_at),
            ended_at: unix_ms(record.exited_at),
            end: End::Exited {
                verdict: result.verdict(),
                cap_hit: result.cap_hit(),
                reason: result.reason(),
                parsed: &parsed,
                output: output.as_deref(),
            },
        },
        out,
    );
}

/// A cancellation, encoded as a pack's record.
pub fn encode_cancel(record: &CancelRecord) -> Vec<u8> {
    let tool_calls = record.tool_calls.to_string();
    encode(&Stored {
        exec: exec_key(&record.run_id, &record.stage_execution_id),
        stage_id: &record.stage_id,
        index: record.index.map(|i| i as u64),
        visit: record.visit,
        attempts: record.attempt,
        usage: record.usage,
        entered_at: known_ms(record.entered_at),
        ended_at: unix_ms(record.cancelled_at),
        end: End::Cancelled {
            reason: &record.reason,
            phase: record.phase,
            turn: record.turn,
            tool_calls: &tool_calls,
        },
    })
}

/// Unix milliseconds of a time that is set (after 1970).
fn known_ms(t: SystemTime) -> Option<i64> {
    (t > SystemTime::UNIX_EPOCH).then(|| unix_ms(t))
}

/// A record as a pack holds it: its length (4 bytes, little-endian),
/// then its fields. Times before 1970 are stored as 1970.
pub fn encode(stored: &Stored<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(stored, &mut out);
    out
}

/// [`encode`], at the end of `out`.
fn encode_into(stored: &Stored<'_>, out: &mut Vec<u8>) {
    let texts = match &stored.end {
        End::Exited {
            reason,
            parsed,
            output,
            ..
        } => reason.map_or(0, str::len) + parsed.len() + output.map_or(0, str::len),
        End::Cancelled {
            reason,
            phase,
            tool_calls,
            ..
        } => reason.len() + phase.len() + tool_calls.len(),
    };
    out.reserve(48 + stored.exec.len() + stored.stage_id.len() + texts);
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut out = Record { out, start };
    out.byte(match stored.end {
        End::Exited { .. } => EXIT,
        End::Cancelled { .. } => CANCEL,
    });
    out.text(stored.exec);
    out.text(stored.stage_id);
    out.number(stored.index.map_or(0, |i| i.saturating_add(1)));
    out.number(u64::from(stored.visit));
    out.number(u64::from(stored.attempts));
    out.number(stored.usage.prompt_tokens);
    out.number(stored.usage.completion_tokens);
    out.number(stored.usage.requests);
    out.number(
        stored
            .entered_at
            .map_or(0, |ms| ms.clamp(0, i64::MAX - 1) as u64 + 1),
    );
    out.number(stored.ended_at.max(0) as u64);
    match stored.end {
        End::Exited {
            verdict,
            cap_hit,
            reason,
            parsed,
            output,
        } => {
            out.byte(match verdict {
                Verdict::Ok => 0,
                Verdict::Fail => 1,
                Verdict::Skipped => 2,
            });
            out.byte(u8::from(cap_hit));
            out.optional(reason);
            out.text(parsed);
            out.optional(output);
        }
        End::Cancelled {
            reason,
            phase,
            turn,
            tool_calls,
        } => {
            out.text(reason);
            out.text(phase);
            out.number(u64::from(turn));
            out.text(tool_calls);
        }
    }
    out.end()
}

/// A record being encoded at `start` of `out`: its length's four bytes
/// are filled in last.
struct Record<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl Record<'_> {
    fn byte(&mut self, b: u8) {
        self.out.push(b);
    }

    fn number(&mut self, mut n: u64) {
        loop {
            let low = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                self.out.push(low);
                return;
            }
            self.out.push(low | 0x80);
        }
    }

    fn text(&mut self, s: &str) {
        self.number(s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
    }

    fn optional(&mut self, s: Option<&str>) {
        match s {
            None => self.byte(0),
            Some(s) => {
                self.byte(1);
                self.text(s);
            }
        }
    }

    fn end(self) {
        let at = self.start;
        let len = u32::try_from(self.out.len() - at - 4).unwrap_or(u32::MAX);
        self.out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// One stored record, read in place from its pack.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<'a> {
    /// The execution's id without the run's.
    pub exec: &'a str,
    pub stage_id: &'a str,
    pub index: Option<u64>,
    pub visit: u32,
    pub attempts: u32,
    pub usage: Usage,
    /// Unix milliseconds, when known.
    pub entered_at: Option<i64>,
    pub ended_at: i64,
    pub end: End<'a>,
}

/// How a stored execution ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End<'a> {
    Exited {
        verdict: Verdict,
        cap_hit: bool,
        reason: Option<&'a str>,
        /// JSON text.
        parsed: &'a str,
        /// JSON text; `None` when it is `parsed`.
        output: Option<&'a str>,
    },
    Cancelled {
        reason: &'a str,
        phase: &'a str,
        turn: u32,
        /// JSON text: the tool calls in flight.
        tool_calls: &'a str,
    },
}

impl Stored<'_> {
    /// How it ended: its verdict when it exited, `None` when cancelled.
    pub fn verdict(&self) -> Option<Verdict> {
        match self.end {
            End::Exited { verdict, .. } => Some(verdict),
            End::Cancelled { .. } => None,
        }
    }

    /// Whether no later record of the execution replaces this one: it
    /// exited with a verdict other than `fail`.
    pub fn stays(&self) -> bool {
        matches!(self.end, End::Exited { verdict, .. } if verdict != Verdict::Fail)
    }
}

/// Why a pack cannot be read, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The byte of the pack where reading stopped.
    pub at: usize,
    pub what: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte {}: {}", self.at, self.what)
    }
}

/// The records of one pack, in the order they were stored; the first
/// damage found ends the reading.
pub fn records(pack: &[u8]) -> Records<'_> {
    Records {
        pack,
        at: 0,
        failed: false,
    }
}

/// See [`records`].
#[derive(Debug)]
pub struct Records<'a> {
    pack: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Stored<'a>, Damage>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.read();
        if matches!(next, Some(Err(_))) {
            self.failed = true;
        }
        next
    }
}

impl<'a> Records<'a> {
    fn read(&mut self) -> Option<Result<Stored<'a>, Damage>> {
        if self.at == 0 {
            match self.pack.first() {
                None => return Some(Err(self.damage(0, "the pack is empty".to_owned()))),
                Some(&FORMAT) => self.at = 1,
                Some(&other) => {
                    return Some(Err(self.damage(
                        0,
                        format!("format {other} is not one this troupe reads (it reads {FORMAT})"),
                    )));
                }
            }
        }
        if self.at == self.pack.len() {
            return None;
        }
        let Some(len) = self.pack.get(self.at..self.at + 4) else {
            return Some(Err(
                self.damage(self.at, "a record's length is cut off".to_owned())
            ));
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let start = self.at + 4;
        let Some(body) = start
            .checked_add(len)
            .and_then(|end| self.pack.get(start..end))
        else {
            return Some(Err(self.damage(
                self.at,
                format!(
                    "a record of {len} bytes runs past the pack's end ({} bytes)",
                    self.pack.len()
                ),
            )));
        };
        let mut reader = Reader {
            bytes: body,
            at: 0,
            base: start,
        };
        let record = reader.record().and_then(|stored| {
            if reader.at == body.len() {
                Ok(stored)
            } else {
                Err(reader.damage(format!(
                    "{} bytes left over after the record",
                    body.len() - reader.at
                )))
            }
        });
        self.at = start + len;
        Some(record)
    }

    fn damage(&self, at: usize, what: String) -> Damage {
        Damage { at, what }
    }
}

/// Reads one record's fields.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Where `bytes` starts in the pack, for the damage's place.
    base: usize,
}

impl<'a> Reader<'a> {
    fn damage(&self, what: String) -> Damage {
        Damage {
            at: self.base + self.at,
            what,
        }
    }

    fn byte(&mut self) -> Result<u8, Damage> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| self.damage("the record ends early".to_owned()))?;
        self.at += 1;
        Ok(b)
    }

    fn number(&mut self) -> Result<u64, Damage> {
        // Most numbers of a record (a visit, an attempt, a flag-like
        // count) fit in one byte.
        if let Some(&b) = self.bytes.get(self.at)
            && b < 0x80
        {
            self.at += 1;
            return Ok(u64::from(b));
        }
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(self.damage("a number is too large".to_owned()));
            }
            n |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(self.damage("a number is too long".to_owned()))
    }

    fn small(&mut self, what: &str) -> Result<u32, Damage> {
        let n = self.number()?;
        u32::try_from(n).map_err(|_| self.damage(format!("{what} {n} is too large")))
    }

    fn signed(&mut self, what: &str) -> Result<i64, Damage> {
        let n = self.number()?;
        i64::try_from(n).map_err(|_| self.damage(format!("{what} {n} is too large")))
    }

    fn text(&mut self) -> Result<&'a str, Damage> {
        let len = self.number()?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| self.at.checked_add(len))
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.damage(format!("a text of {len} bytes runs past the record")))?;
        let text = std::str::from_utf8(&self.bytes[self.at..end])
            .map_err(|e| self.damage(format!("a text is not UTF-8 ({e})")))?;
        self.at = end;
        Ok(text)
    }

    fn optional(&mut self) -> Result<Option<&'a str>, Damage> {
        match self.byte()? {
            0 => Ok(None),
            1 => self.text().map(Some),
            other => Err(self.damage(format!("{other} marks neither none (0) nor a text (1)"))),
        }
    }

    fn flag(&mut self) -> Result<bool, Damage> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.damage(format!("{other} is no flag (0 or 1)"))),
        }
    }

    fn record(&mut self) -> Result<Stored<'a>, Damage> {
        let kind = self.byte()?;
        if kind != EXIT && kind != CANCEL {
            self.at -= 1;
            return Err(self.damage(format!("{kind} is no kind of record")));
        }
        let exec = self.text()?;
        let stage_id = self.text()?;
        let index = self.number()?.checked_sub(1);
        let visit = self.small("a visit")?;
        let attempts = self.small("an attempt count")?;
        let usage = Usage {
            prompt_tokens: self.number()?,
            completion_tokens: self.number()?,
            requests: self.number()?,
        };
        let entered_at = match self.signed("an entry time")? {
            0 => None,
            ms => Some(ms - 1),
        };
        let ended_at = self.signed("an end time")?;
        let end = if kind == EXIT {
            let verdict = match self.byte()? {
                0 => Verdict::Ok,
                1 => Verdict::Fail,
                2 => Verdict::Skipped,
                other => return Err(self.damage(format!("{other} is no verdict"))),
            };
            End::Exited {
                verdict,
                cap_hit: self.flag()?,
                reason: self.optional()?,
                parsed: self.text()?,
                output: self.optional()?,
            }
        } else {
            End::Cancelled {
                reason: self.text()?,
                phase: self.text()?,
                turn: self.small("a turn")?,
                tool_calls: self.text()?,
            }
        };
        Ok(Stored {
            exec,
            stage_id,
            index,
            visit,
            attempts,
            usage,
            entered_at,
            ended_at,
            end,
        })
    }
}

/// A run's records folded into what stands for each execution: fed in the
/// order they were stored, it keeps what `keep` makes of each execution's
/// standing record. See the module documentation for the rule.
#[derive(Debug)]
pub struct Fold<T> {
    /// Hashed with foldhash, the project's hasher of short keys: SipHash
    /// was a fifth of the instructions `troupe runs` spent counting a
    /// run's executions, and its resistance to chosen keys buys nothing
    /// against a store file, whose writer could as well write anything
    /// else into it.
    standing: HashMap<Box<str>, (bool, T), foldhash::fast::RandomState>,
}

impl<T> Default for Fold<T> {
    fn default() -> Self {
        Fold {
            standing: HashMap::default(),
        }
    }
}

impl<T> Fold<T> {
    /// Takes the next stored record; `keep` runs only when it stands.
    pub fn add(&mut self, record: &Stored<'_>, keep: impl FnOnce(&Stored<'_>) -> T) {
        let stays = record.stays();
        match self.standing.entry(record.exec.into()) {
            Entry::Occupied(mut held) => {
                if !held.get().0 {
                    held.insert((stays, keep(record)));
                }
            }
            Entry::Vacant(place) => {
                place.insert((stays, keep(record)));
            }
        }
    }

    /// What stands, by execution (its id without the run's), in no order.
    pub fn into_standing(self) -> impl Iterator<Item = (Box<str>, T)> {
        self.standing
            .into_iter()
            .map(|(exec, (_, kept))| (exec, kept))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use serde_json::json;

    use super::*;
    use crate::runtime::result::{Kept, StageResult};

    fn exit(index: usize, verdict: Verdict) -> ExitRecord {
        exit_of("run-1", index, verdict)
    }

    /// Sibling `index`'s exit in run `run` (the store's other tests use it
    /// too).
    pub(crate) fn exit_of(run: &str, index: usize, verdict: Verdict) -> ExitRecord {
        let id = format!("{run}/worker#{index}/1");
        let parsed = Arc::new(json!({ "item": index, "é": "\u{2028}" }));
        ExitRecord {
            run_id: run.into(),
            stage_execution_id: id.as_str().into(),
            stage_id: "worker".into(),
            index: Some(index),
            visit: 1,
            result: Kept::Whole(Arc::new(StageResult {
                stage_id: "worker".to_owned(),
                stage_execution_id: id,
                verdict,
                reason: (verdict == Verdict::Fail).then(|| "Test/Failed: no".to_owned()),
                parsed: Arc::clone(&parsed),
                output: Arc::new(json!("said")),
                cap_hit: true,
                attempt_count: 3,
                usage: Usage {
                    prompt_tokens: 300,
                    completion_tokens: 1 << 40,
                    requests: 2,
                },
            })),
            entered_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
            exited_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        }
    }

    fn cancel(index: usize) -> CancelRecord {
        CancelRecord {
            run_id: "run-1".into(),
            stage_execution_id: format!("run-1/worker#{index}/1").into(),
            stage_id: "worker".into(),
            index: None,
            visit: 2,
            reason: "Session/Cancelled: a sibling failed".into(),
            phase: "Execute",
            attempt: 1,
            turn: 4,
            tool_calls: json!([{ "callId": "c1", "tool": "shell" }]),
            usage: Usage::default(),
            entered_at: UNIX_EPOCH,
            cancelled_at: UNIX_EPOCH + Duration::from_millis(5),
        }
    }

    fn pack(records: &[Vec<u8>]) -> Vec<u8> {
        let mut pack = Vec::new();
        start(&mut pack);
        for r in records {
            pack.extend_from_slice(r);
        }
        pack
    }

    #[test]
    fn records_read_back_as_they_were_written() {
        let body = pack(&[
            encode_exit(&exit(7, Verdict::Fail)),
            encode_cancel(&cancel(8)),
        ]);
        let read: Vec<Stored<'_>> = records(&body).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            read[0],
            Stored {
                exec: "worker#7/1",
                stage_id: "worker",
                index: Some(7),
                visit: 1,
                attempts: 3,
                usage: Usage {
                    prompt_tokens: 300,
                    completion_tokens: 1 << 40,
                    requests: 2,
                },
                entered_at: Some(1_700_000_000_000),
                ended_at: 1_700_000_000_123,
                end: End::Exited {
                    verdict: Verdict::Fail,
                    cap_hit: true,
                    reason: Some("Test/Failed: no"),
                    parsed: "{\"item\":7,\"é\":\"\u{2028}\"}",
                    output: Some(r#""said""#),
                },
            }
        );
        assert_eq!(
            read[1],
            Stored {
                exec: "worker#8/1",
                stage_id: "worker",
                index: None,
                visit: 2,
                attempts: 1,
                usage: Usage::default(),
                entered_at: None,
                ended_at: 5,
                end: End::Cancelled {
                    reason: "Session/Cancelled: a sibling failed",
                    phase: "Execute",
                    turn: 4,
                    tool_calls: r#"[{"callId":"c1","tool":"shell"}]"#,
                },
            }
        );
        assert_eq!(read.len(), 2);
    }

    #[test]
    fn an_output_that_is_the_parsed_value_is_stored_once() {
        let mut record = exit(1, Verdict::Ok);
        let Kept::Whole(result) = &record.result else {
            unreachable!()
        };
        let mut result = (**result).clone();
        result.output = Arc::clone(&result.parsed);
        record.result = Kept::Whole(Arc::new(result));
        let body = pack(&[encode_exit(&record)]);
        let stored = records(&body).next().unwrap().unwrap();
        assert!(matches!(stored.end, End::Exited { output: None, .. }));
        assert!(stored.stays());
    }

    /// Every way a pack can be damaged is named with its place, and
    /// reading stops there.
    #[test]
    fn a_damaged_pack_is_named_with_where_never_half_read() {
        let whole = pack(&[
            encode_exit(&exit(1, Verdict::Ok)),
            encode_cancel(&cancel(2)),
        ]);
        let first_len = encode_exit(&exit(1, Verdict::Ok)).len();
        let damaged = |pack: &[u8]| -> Damage {
            let mut read = records(pack);
            let damage = read.find_map(Result::err).expect("the damage is found");
            assert!(read.next().is_none(), "reading stops at the damage");
            damage
        };
        // Cut anywhere but between records: the damage is found.
        // (A pack of its format byte alone holds no record.)
        for cut in 2..whole.len() {
            if cut == 1 + first_len {
                continue;
            }
            let d = damaged(&whole[..cut]);
            assert!(d.at <= cut, "{cut}: {d}");
        }
        assert!(damaged(&[]).what.contains("empty"));
        assert!(damaged(&[2]).what.contains("format 2"));
        // A kind of record that does not exist.
        let mut kind = whole.clone();
        kind[5] = b'X';
        assert_eq!(damaged(&kind).at, 5);
        // Text that is not UTF-8 (inside the exec id).
        let mut text = whole.clone();
        text[7] = 0xff;
        assert!(damaged(&text).what.contains("UTF-8"));
        // A record longer than what is left.
        let mut long = whole.clone();
        long[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(damaged(&long).what.contains("past the pack's end"));
        // A record whose fields end before its length says.
        let mut spare = whole[..1 + first_len].to_vec();
        let len = u32::try_from(first_len - 4 + 1).unwrap();
        spare[1..5].copy_from_slice(&len.to_le_bytes());
        spare.push(0);
        assert!(damaged(&spare).what.contains("left over"));
        // A varint of eleven bytes.
        let mut varint = vec![FORMAT, 14, 0, 0, 0, EXIT];
        varint.extend_from_slice(&[0xff; 10]);
        varint.extend_from_slice(&[0, 0, 0]);
        assert!(damaged(&varint).what.contains("too"));
    }

    /// The fold's keys and `troupe runs`' one-record-each check rely on
    /// the hasher telling an execution's keys apart (a multiply-and-rotate
    /// hash, FxHash, tried first, hashed `worker#92/1` and `worker#19/1`
    /// alike).
    #[test]
    fn the_key_hasher_tells_a_wide_run_s_keys_apart() {
        use std::hash::BuildHasher;
        let hasher = foldhash::fast::RandomState::default();
        let mut seen = std::collections::HashSet::new();
        for i in 0..200_000 {
            for key in [format!("worker#{i}/1"), format!("w#{i}/2"), format!("{i}")] {
                assert!(seen.insert(hasher.hash_one(&*key)), "{key}");
            }
        }
        assert_ne!(hasher.hash_one("abc"), hasher.hash_one("abc\0"));
        assert_ne!(hasher.hash_one(""), hasher.hash_one("\0\0\0\0\0\0\0\0"));
    }

    #[test]
    fn a_record_stands_unless_an_earlier_one_exited_other_than_failed() {
        let exits = [
            (0, Verdict::Ok),
            (0, Verdict::Ok),
            (1, Verdict::Fail),
            (1, Verdict::Skipped),
            (2, Verdict::Fail),
        ];
        let mut records: Vec<Vec<u8>> = exits
            .iter()
            .map(|&(i, v)| encode_exit(&exit(i, v)))
            .collect();
        records.insert(0, encode_cancel(&cancel(3)));
        records.push(encode_cancel(&cancel(0)));
        records.push(encode_cancel(&cancel(2)));
        let body = pack(&records);
        let mut fold = Fold::default();
        for (n, r) in super::records(&body).enumerate() {
            fold.add(&r.unwrap(), |_| n);
        }
        let mut standing: Vec<(Box<str>, usize)> = fold.into_standing().collect();
        standing.sort();
        let standing: Vec<(&str, usize)> = standing.iter().map(|(e, n)| (&**e, *n)).collect();
        assert_eq!(
            standing,
            [
                ("worker#0/1", 1),
                ("worker#1/1", 4),
                ("worker#2/1", 7),
                ("worker#3/1", 0)
            ]
        );
    }
}
