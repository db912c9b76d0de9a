//! Fuzzes the SSE decoder: the same bytes fed whole and split at fuzzed
//! boundaries must decode to the same events (or the same error).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use troupe::provider::openai::{SseDecoder, SseError};

#[derive(Debug, Arbitrary)]
struct Input {
    /// Chunk lengths, used in turn (0 sends an empty chunk).
    splits: Vec<u8>,
    bytes: Vec<u8>,
}

fn decode<'a>(chunks: impl Iterator<Item = &'a [u8]>) -> Result<Vec<String>, SseError> {
    let mut d = SseDecoder::new();
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(d.push(chunk)?);
    }
    events.extend(d.finish()?.map(|e| e.data));
    Ok(events)
}

fuzz_target!(|input: Input| {
    let whole = decode(std::iter::once(input.bytes.as_slice()));
    let mut pieces = Vec::new();
    let mut rest = input.bytes.as_slice();
    let mut sizes = input.splits.iter().cycle();
    while !rest.is_empty() {
        let size = if input.splits.is_empty() {
            rest.len()
        } else {
            usize::from(*sizes.next().unwrap_or(&1)).min(rest.len())
        };
        let (head, tail) = rest.split_at(size);
        pieces.push(head);
        rest = tail;
        if pieces.len() > 100_000 {
            return;
        }
    }
    if input.splits.is_empty() {
        return;
    }
    let split = decode(pieces.into_iter());
    assert_eq!(whole, split);
});
