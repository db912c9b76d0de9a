//! Inputs the fuzz targets (fuzz/) found to crash or hang the library, kept
//! as tests of the normal suite: each is named after what it guards.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use serde_json::json;
use troupe::definition::expr::Expr;
use troupe::definition::{load_pipeline, load_pipeline_text};
use troupe::provider::openai::{Assembly, SseDecoder, SseError};
use troupe::provider::script::{Reply, Script};
use troupe::runtime::extract::extract_json;

/// fuzz target `openai_reply`: a call at index `usize::MAX`, then calls
/// without an index whose ids differ. The next free index was `last + 1`,
/// which overflowed (a panic in debug, and in release a wrap to 0 that
/// merged the third call into the second).
#[test]
fn tool_call_after_index_usize_max_gets_its_own_slot() {
    let chunks = [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":18446744073709551615,"id":"z","function":{"name":"A","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"a","function":{"name":"B","arguments":"{\"x\":1}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"b","function":{"name":"C","arguments":"{\"y\":2}"}}]}}]}"#,
    ];
    let mut a = Assembly::new();
    for chunk in chunks {
        a.apply_chunk(chunk, None).unwrap();
    }
    let calls = a.into_response().unwrap().tool_calls;
    let calls: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|c| (&*c.id, &*c.name, &*c.arguments))
        .collect();
    assert_eq!(
        calls,
        [
            ("a", "B", "{\"x\":1}"),
            ("b", "C", "{\"y\":2}"),
            ("z", "A", "{}")
        ]
    );
}

/// fuzz target `extract_json`: every `{` walked to the end of the text on
/// its own, so a reply of 1 MiB of `{` took over an hour (quadratic).
#[test]
fn unclosed_braces_are_scanned_in_linear_time() {
    let text = "{".repeat(1 << 20);
    assert_eq!(extract_json(&text), None);
}

/// The same scan with a real object behind the unclosed braces: the
/// linear scan still finds it.
#[test]
fn object_behind_many_unclosed_braces_is_still_found() {
    let text = format!("{}{{\"a\": 1}}", "{ ".repeat(100_000));
    assert_eq!(extract_json(&text), Some(json!({"a": 1})));
}

/// Deep nesting that never parses (serde_json stops at 128 levels): each
/// level was walked and parsed again.
#[test]
fn deep_unparsable_nesting_is_scanned_in_linear_time() {
    let text = format!("{}{}", "[1,".repeat(100_000), "]".repeat(100_000));
    assert_eq!(extract_json(&text), None);
}

/// Decodes `chunks` in turn; the events, or the first error.
fn decode_sse(chunks: &[&[u8]]) -> Result<Vec<String>, SseError> {
    let mut d = SseDecoder::new();
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(d.push(chunk)?);
    }
    events.extend(d.finish()?.map(|e| e.data));
    Ok(events)
}

/// Split invariance (fuzz target `sse_decoder`) past the size limit: a
/// line still open was counted together with the event's earlier data, so
/// a 7 MiB comment after 7 MiB of data was refused only when the stream
/// split inside the comment.
#[test]
fn long_comment_after_long_data_decodes_the_same_however_split() {
    let mut stream = b"data: ".to_vec();
    stream.extend(std::iter::repeat_n(b'x', 7 << 20));
    stream.extend(b"\n: ");
    stream.extend(std::iter::repeat_n(b'c', 7 << 20));
    stream.extend(b"\n\n");
    let whole = decode_sse(&[&stream]);
    assert_eq!(whole.as_ref().map(Vec::len), Ok(1));
    let (head, tail) = stream.split_at(stream.len() - 10);
    assert_eq!(decode_sse(&[head, tail]), whole);
}

/// The other side of the same limit: a line over 8 MiB is refused whether
/// it arrives in one chunk (it was accepted) or in pieces (it was refused).
#[test]
fn line_over_the_limit_is_refused_however_split() {
    let mut stream = b": ".to_vec();
    stream.extend(std::iter::repeat_n(b'c', 9 << 20));
    stream.extend(b"\ndata: ok\n\n");
    assert!(decode_sse(&[&stream]).is_err());
    let (head, tail) = stream.split_at(1 << 20);
    assert!(decode_sse(&[head, tail]).is_err());
}

/// fuzz target `script_file`: the `$range` limit held per range only, so
/// eight ranges of 10 000 000 in a 100-byte script.yaml took 2.4 GB when
/// the turn was rendered. The limit now holds for a whole turn.
#[test]
fn ranges_of_one_turn_share_one_element_limit() {
    let fanout = Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/fanout");
    let pipeline = load_pipeline(&fanout).unwrap();
    // Two ranges one element over the limit together: refused before the
    // second is built.
    let text = "stages:\n  plan:\n    - complete: [{$range: 1}, {$range: 10000000}]\n";
    let script = Script::parse_str(Path::new("script.yaml"), text, &pipeline).unwrap();
    let turn = &script.for_execution("plan", None).unwrap().turns[0];
    let Reply::Complete(value) = &turn.reply else {
        panic!("a complete turn: {:?}", turn.reply)
    };
    let err = value.render(&|_| Ok(json!(0))).unwrap_err();
    assert!(err.contains("in one turn"), "{err}");
    // One range of the whole limit still renders.
    let text = "stages:\n  plan:\n    - complete: {items: {$range: 3}, more: {$range: 2}}\n";
    let script = Script::parse_str(Path::new("script.yaml"), text, &pipeline).unwrap();
    let Reply::Complete(value) = &script.for_execution("plan", None).unwrap().turns[0].reply else {
        panic!("a complete turn")
    };
    assert_eq!(
        value.render(&|_| Ok(json!(0))).unwrap(),
        json!({"items": [0, 1, 2], "more": [0, 1]})
    );
}

/// fuzz target `cel_expr`: the CEL parser recurses once per operator of a
/// chain with no limit, so `1+1+…` (20 000 terms, 40 KB) or `ctx[0][0]…`
/// overflowed the stack and aborted the process; nothing can catch that.
/// Such expressions are now refused before CEL sees them.
#[test]
fn long_operator_chains_are_refused_not_a_stack_overflow() {
    for source in [
        format!("1{}", "+1".repeat(20_000)),
        format!("ctx{}", "[0]".repeat(5_000)),
        format!("ctx{}", ".a".repeat(20_000)),
        format!("1{}", " in [1]".repeat(5_000)),
    ] {
        let err = Expr::compile(&source).unwrap_err();
        assert!(err.starts_with("too long"), "{err}");
    }
    // Everyday expressions are far below the limit.
    Expr::compile("size(parsed.items) == int(ctx.width) && ctx.upstream[0].parsed.ok").unwrap();
}

/// Slow input for fuzz target `cel_expr`: each macro nested in another's
/// predicate multiplies the work by its list's length, and CEL cannot stop
/// an evaluation. Twenty nested `[1, 2].map(…)` took 43 s and 500 MB.
#[test]
fn deeply_nested_macros_are_refused_before_evaluation() {
    let nested = |n: usize| format!("{}x{}", "[1, 2].map(x, ".repeat(n), ")".repeat(n));
    // Four levels, not twenty: a debug build's CEL parser needs more stack
    // per level than a test thread's 2 MiB holds for twenty.
    let err = Expr::compile(&nested(4)).unwrap_err();
    assert!(err.contains("nest deeper than 3"), "{err}");
    // Three levels, and macros one after another, are fine.
    let ctx = json!({"a": [[[1]]]});
    let three = Expr::compile("ctx.a.all(x, x.all(y, y.all(z, z == 1)))").unwrap();
    assert_eq!(three.eval(&[("ctx", &ctx)]).unwrap(), json!(true));
    let chained = "[1, 2].map(a, a).map(b, b).map(c, c).filter(d, d > 1).exists(e, e == 2)";
    assert_eq!(
        Expr::compile(chained).unwrap().eval(&[]).unwrap(),
        json!(true)
    );
}

/// Slow input for stage files: every bad placeholder's position was found
/// by rescanning the body from its start, so a body of 200 000 `{{a}}`
/// (1 MiB, one line) took quadratic time to validate.
#[test]
fn many_bad_placeholders_are_located_in_one_pass() {
    let head = "---\nid: a\nname: A\nallowedTools: [Read]\ncompletionTool: submit_a\ncompletionSchema: {type: object}\nretryPolicy: {maxAttempts: 1, backoff: none}\nturnCap: 5\nresolutionPolicy: fail\n---\n";
    let n = 100_000;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.md"),
        format!("{head}{}", "{{a}}".repeat(n)),
    )
    .unwrap();
    let yaml = "id: demo\nentry: a\nstages:\n  a: a.md\n";
    let diags = load_pipeline_text(dir.path(), &dir.path().join("pipeline.yaml"), yaml, &|t| {
        t == "Read"
    })
    .unwrap_err()
    .0;
    assert_eq!(diags.len(), n);
    let last = &diags[n - 1];
    assert_eq!(
        (last.line, last.column),
        (Some(11), Some(5 * (n as u64 - 1) + 1))
    );
}

/// fuzz target `extract_json` (checked against the old scan): a work budget
/// that stopped the scan early lost the `{}` near the end of this bracket
/// soup. The scan now needs no budget and finds what the old one found.
#[test]
fn bracket_soup_yields_what_the_plain_scan_found() {
    let text = include_str!("fixtures/fuzz/extract_json_bracket_soup.txt");
    assert_eq!(extract_json(text), Some(json!({})));
}

/// Escaped quotes outside strings make walks from different brackets read
/// the same text in different string states; one walk per bracket was
/// quadratic again (a walk reads each position in each state once now).
#[test]
fn escaped_quote_soup_is_scanned_in_linear_time() {
    let text = "[\"\\\"".repeat(1 << 18);
    assert_eq!(extract_json(&text), None);
    let closed = "[\"\\\"]".repeat(1 << 17);
    assert_eq!(extract_json(&closed), None);
}

/// The fix above made each index-less call after `usize::MAX` search for
/// the lowest free index from 0: quadratic in the number of calls (a 1.6 MB
/// stream of 20 000 such calls took 32 s in the fuzz build).
#[test]
fn many_calls_after_index_usize_max_assemble_in_linear_time() {
    let mut a = Assembly::new();
    a.apply_chunk(
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":18446744073709551615,"id":"z","function":{"name":"A"}}]}}]}"#,
        None,
    )
    .unwrap();
    let n = 20_000;
    for i in 0..n {
        let chunk = format!(
            r#"{{"choices":[{{"delta":{{"tool_calls":[{{"id":"c{i}","function":{{"name":"B"}}}}]}}}}]}}"#
        );
        a.apply_chunk(&chunk, None).unwrap();
    }
    let calls = a.into_response().unwrap().tool_calls;
    assert_eq!(calls.len(), n + 1);
    assert_eq!(&*calls[n - 1].id, format!("c{}", n - 1));
    assert_eq!(&*calls[n].id, "z");
}
