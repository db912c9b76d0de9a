//! Fuzzes the chat-completions reply: the input as one plain completion
//! body, and its lines as a stream of chunks, each assembled into a turn.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::provider::ModelResponse;
use troupe::provider::openai::Assembly;

fn check(response: &ModelResponse) {
    for call in &response.tool_calls {
        assert!(!call.id.is_empty(), "every call has an id");
        assert!(
            !call.arguments.trim().is_empty(),
            "arguments are never empty"
        );
    }
}

fuzz_target!(|bytes: &[u8]| {
    if let Ok(a) = Assembly::from_completion(bytes)
        && let Ok(r) = a.into_response()
    {
        check(&r);
    }
    let text = String::from_utf8_lossy(bytes);
    let mut a = Assembly::new();
    for line in text.lines() {
        if a.apply_chunk(line, None).is_err() {
            return;
        }
    }
    let _ = a.finished();
    if let Ok(r) = a.into_response() {
        check(&r);
    }
});
