//! The record format on its own: what the writer writes reads back, a
//! batch reads on its own, and bytes troupe did not write are reasons,
//! never panics. (Every kind of runtime event read back byte for byte is
//! tested with the runtime's events, `runtime/events/record_tests.rs`.)

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::auditlog::clock::rfc3339;

/// A sibling's exit, written as a record into `out`; its line as the
/// reader must write it.
pub(crate) fn exit(
    w: &mut RecordWriter,
    out: &mut Vec<u8>,
    seq: u64,
    run: &Arc<str>,
    exec: &Arc<str>,
) -> String {
    let stage: Arc<str> = Arc::from("worker");
    let micros = 1_795_000_000_000_000 + seq * 7;
    w.event(
        out,
        &EventHead {
            seq,
            micros,
            name: "StageExited",
            run,
            exec: Some(exec),
            stage: Some(&stage),
            tool: None,
            fields: 3,
        },
    );
    w.field_static(out, "verdict", "ok");
    w.field_bool(out, "capHit", false);
    w.field_usage(out, "usage", [119 + seq, 17, 2]);
    let ts = rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros));
    format!(
        "{{\"seq\":{seq},\"ts\":\"{ts}\",\"event\":\"StageExited\",\"workflowRunId\":\"{run}\",\"stageExecutionId\":\"{exec}\",\"stageId\":\"worker\",\"verdict\":\"ok\",\"capHit\":false,\"usage\":{{\"promptTokens\":{},\"completionTokens\":17,\"requests\":2}}}}\n",
        119 + seq
    )
}

/// `n` exits of siblings `0..n % siblings`, in batches of `batch`.
fn exits(n: u64, siblings: u64, batch: u64) -> (Vec<u8>, String) {
    let run: Arc<str> = Arc::from("01a2169c-ae47-74a5-8cb4-5df934e3f66c");
    let ids: Vec<Arc<str>> = (0..siblings)
        .map(|i| Arc::from(format!("{run}/worker#{i}/1")))
        .collect();
    let mut w = RecordWriter::new();
    let (mut records, mut lines) = (Vec::new(), String::new());
    for seq in 0..n {
        if seq % batch == 0 {
            w.begin(&mut records);
        }
        lines += &exit(
            &mut w,
            &mut records,
            seq + 1,
            &run,
            &ids[(seq % siblings) as usize],
        );
    }
    (records, lines)
}

#[test]
fn what_is_written_reads_back_in_pieces_of_any_size() {
    let (records, lines) = exits(40, 7, 9);
    assert_eq!(
        read_in_pieces(&records, &[]).expect("records"),
        lines.as_bytes()
    );
    let every: Vec<usize> = (0..records.len()).collect();
    assert_eq!(
        read_in_pieces(&records, &every).expect("records"),
        lines.as_bytes()
    );
    assert!(
        records.len() * 4 < lines.len(),
        "{} of {}",
        records.len(),
        lines.len()
    );
}

#[test]
fn a_siblings_ids_are_written_once_a_batch() {
    let id = "01a2169c-ae47-74a5-8cb4-5df934e3f66c/worker#3/1";
    let mentions = |records: &[u8]| {
        records
            .windows(id.len())
            .filter(|w| *w == id.as_bytes())
            .count()
    };
    // Twelve events of each of five siblings in one batch.
    let (records, lines) = exits(60, 5, 60);
    assert_eq!(mentions(&records), 1, "the execution's id is defined once");
    assert_eq!(
        read_in_pieces(&records, &[]).expect("records"),
        lines.as_bytes()
    );
    // Each batch defines it again: a batch reads on its own.
    let (records, _) = exits(60, 5, 30);
    assert_eq!(mentions(&records), 2);
    // The first batch is the records of the first thirty alone.
    let second = exits(30, 5, 30).0.len();
    assert_eq!(records[second], RESET);
    let alone = read_in_pieces(&records[second..], &[]).expect("the batch alone");
    assert_eq!(alone, lines.as_bytes()[lines.len() - alone.len()..]);
}

#[test]
fn a_shared_string_freed_and_made_again_at_its_address_is_not_taken_for_it() {
    // The writer numbers strings by address: a string freed inside a batch
    // and another made where it was must not read as the first.
    let run: Arc<str> = Arc::from("run");
    let mut w = RecordWriter::new();
    let (mut records, mut lines) = (Vec::new(), String::new());
    w.begin(&mut records);
    for i in 0..200u64 {
        let exec: Arc<str> = Arc::from(format!("run/worker#{i:03}/1"));
        lines += &exit(&mut w, &mut records, i + 1, &run, &exec);
        // `exec` is dropped here; the next id has the same length and is
        // likely made at the same address.
    }
    assert_eq!(
        String::from_utf8(read_in_pieces(&records, &[]).expect("records")).unwrap(),
        lines
    );
}

#[test]
fn a_run_id_copied_per_execution_is_defined_once_a_batch() {
    // Each execution holds a copy of its own of the run's id and its
    // stage's: by content the writer still defines each once a batch.
    let run = "01a2169c-ae47-74a5-8cb4-5df934e3f66c";
    let mut w = RecordWriter::new();
    let (mut records, mut lines) = (Vec::new(), String::new());
    let execs: Vec<Arc<str>> = (0..4)
        .map(|i| Arc::from(format!("{run}/worker#{i}/1")))
        .collect();
    w.begin(&mut records);
    for i in 0..40u64 {
        // `exit` makes the stage's id afresh for each event too.
        let copy: Arc<str> = Arc::from(run);
        lines += &exit(&mut w, &mut records, i + 1, &copy, &execs[(i % 4) as usize]);
    }
    // A definition is the string after its length byte (the execution ids
    // hold both, after other bytes).
    let definitions = |text: &str| {
        let defined = [&[u8::try_from(text.len()).unwrap()][..], text.as_bytes()].concat();
        records
            .windows(defined.len())
            .filter(|w| *w == defined)
            .count()
    };
    assert_eq!(definitions(run), 1);
    assert_eq!(definitions("worker"), 1);
    assert_eq!(
        String::from_utf8(read_in_pieces(&records, &[]).expect("records")).unwrap(),
        lines
    );
}

#[test]
fn a_head_string_of_other_content_at_the_same_address_reads_as_itself() {
    // Runs, stages and tools are matched by content: a string freed and
    // another of the same length made where it was, with other bytes,
    // is its own string, though no address lookup is made for it.
    let mut w = RecordWriter::new();
    let (mut records, mut lines) = (Vec::new(), String::new());
    w.begin(&mut records);
    for i in 0..60u64 {
        let run: Arc<str> = Arc::from(if i % 3 == 0 { "run-a" } else { "run-b" });
        let exec: Arc<str> = Arc::from(format!("run/worker#{i:03}/1"));
        lines += &exit(&mut w, &mut records, i + 1, &run, &exec);
        // `run` is dropped here: the next, of the same length, is likely
        // made at the same address.
    }
    assert_eq!(
        String::from_utf8(read_in_pieces(&records, &[]).expect("records")).unwrap(),
        lines
    );
}

#[test]
fn damaged_records_are_reasons_never_panics() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown record tag", vec![RESET, 9]),
        ("unknown event flags", vec![RESET, EVENT, 0, 0, 0x40]),
        (
            "a reference to string 4, of 0",
            vec![RESET, EVENT, 2, 2, 0, 5, 0, 1, b'r', 0],
        ),
        (
            "not UTF-8",
            vec![RESET, EVENT, 2, 2, 0, 0, 2, 0xff, 0xfe, 0, 1, b'r', 0],
        ),
        (
            "holds a newline",
            [vec![RESET, LINE, 3], b"{\n}".to_vec()].concat(),
        ),
        (
            "past 64 bits",
            vec![
                RESET, EVENT, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ],
        ),
        ("a text of", vec![RESET, LINE, 0xff, 0xff, 0xff, 0xff, 0x7f]),
        (
            "fields",
            vec![
                RESET, EVENT, 2, 2, 0, 0, 1, b'E', 0, 1, b'r', 0xff, 0xff, 0x7f,
            ],
        ),
        (
            "unknown value tag",
            vec![
                RESET, EVENT, 2, 2, 0, 0, 1, b'E', 0, 1, b'r', 1, 42, 0, 1, b'k',
            ],
        ),
        (
            "empty or holds a newline",
            vec![
                RESET, EVENT, 2, 2, 0, 0, 1, b'E', 0, 1, b'r', 1, V_JSON, 0, 1, b'k', 0,
            ],
        ),
    ];
    for (want, bytes) in cases {
        let err = read_in_pieces(&bytes, &[]).expect_err(want);
        assert!(err.contains(want), "{want}: {err}");
    }
    // Every single-byte change of a good stream: a reason, fewer lines or
    // other lines, never a panic.
    let (good, _) = exits(12, 3, 5);
    for i in 0..good.len() {
        for flip in [1u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] ^= flip;
            let _ = read_in_pieces(&bad, &[i]);
        }
    }
}

#[test]
fn a_string_referred_to_many_times_cannot_make_a_line_past_the_limit() {
    // A 1 KiB string defined once, then referred to by a byte per field:
    // 8 KiB of record, 4 MiB of line.
    let mut record = vec![RESET, EVENT, 2, 2, 0, 0, 1, b'E', 0, 1, b'r', 0x80, 0x20];
    record.extend_from_slice(&[V_STR, 0, 1, b'k', 0, 0x80, 0x08]);
    record.extend(std::iter::repeat_n(b'x', 1024));
    for _ in 1..4096 {
        record.extend_from_slice(&[V_STR, 3, 4]);
    }
    let mut reader = RecordReader::with_line_limit(1 << 20);
    let mut out = Vec::new();
    assert_eq!(reader.read(&record, &mut out), Ok(Some(1)), "the RESET");
    let err = reader
        .read(&record[1..], &mut out)
        .expect_err("too long a line");
    assert!(err.contains("passes 1 MiB"), "{err}");
    assert!(out.is_empty(), "nothing of it is handed out");
    // Within the limit, the same record reads.
    let mut reader = RecordReader::with_line_limit(8 << 20);
    assert_eq!(reader.read(&record, &mut out), Ok(Some(1)));
    let n = reader
        .read(&record[1..], &mut out)
        .expect("a line")
        .expect("whole");
    assert_eq!(n, record.len() - 1);
    assert!(out.len() > 4 << 20);
}

#[test]
fn a_record_cut_short_asks_for_more_and_remembers_nothing_of_it() {
    let (records, lines) = exits(20, 3, 8);
    let mut reader = RecordReader::default();
    let mut out = Vec::new();
    let mut at = 0;
    while at < records.len() {
        // Every cut inside the next record: more is needed, nothing kept.
        let n = (1..=records.len() - at)
            .find_map(|end| {
                let before = out.len();
                match reader.read(&records[at..at + end], &mut out) {
                    Ok(None) => {
                        assert_eq!(out.len(), before, "nothing of a cut record");
                        None
                    }
                    Ok(Some(n)) => Some(n),
                    Err(e) => panic!("a cut is not damage: {e}"),
                }
            })
            .expect("a whole record");
        at += n;
    }
    assert_eq!(out, lines.as_bytes());
}

#[test]
fn the_first_seq_of_a_batch_is_found_in_either_format() {
    let (records, lines) = exits(3, 1, 3);
    assert_eq!(first_seq(&records), Some(1));
    assert_eq!(first_seq(lines.as_bytes()), Some(1));
    let mut resumed = Vec::new();
    lines_as_records(
        b"{\"seq\":41,\"event\":\"X\"}\n{\"seq\":42}\n",
        &mut resumed,
    );
    assert_eq!(first_seq(&resumed), Some(41));
    assert_eq!(
        read_in_pieces(&resumed, &[5]).expect("lines"),
        b"{\"seq\":41,\"event\":\"X\"}\n{\"seq\":42}\n"
    );
    assert_eq!(first_seq(&[9, 9]), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Bytes troupe did not write: a reason or lines, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = read_in_pieces(&bytes, &[bytes.len() / 2]);
    }
}

/// What the reader hands out for `bytes` fed in pieces cut at `cuts` (as
/// the log's decoder feeds what zstd gives it): the JSON lines, or the
/// reason it stopped.
pub(crate) fn read_in_pieces(bytes: &[u8], cuts: &[usize]) -> Result<Vec<u8>, String> {
    read_in_pieces_with(RecordReader::default(), bytes, cuts)
}

/// [`read_in_pieces`] with `reader`.
pub(crate) fn read_in_pieces_with(
    mut reader: RecordReader,
    bytes: &[u8],
    cuts: &[usize],
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut partial = Vec::new();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut from = 0;
    for cut in cuts.into_iter().chain([bytes.len()]) {
        partial.extend_from_slice(&bytes[from..cut.max(from)]);
        from = cut.max(from);
        let mut at = 0;
        while let Some(n) = reader.read(&partial[at..], &mut out)? {
            at += n;
        }
        partial.drain(..at);
    }
    if !partial.is_empty() {
        return Err(format!("{} bytes left over", partial.len()));
    }
    Ok(out)
}
