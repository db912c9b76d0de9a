//! Inputs the fuzz targets (fuzz/) found to crash or hang the library, kept
//! as tests of the normal suite: each is named after what it guards.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

use troupe::provider::openai::Assembly;

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
        .map(|c| (&*c.id, &*c.name, c.arguments.as_str()))
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
