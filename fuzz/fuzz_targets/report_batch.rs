//! Fuzzes `outbox::decode`, the coordinator's reading of one message of a
//! run's report stream (distributed runs): a worker's batch as JSON,
//! framed with its events' records, or either compressed with zstd.
//! Arbitrary bytes, as they come and behind zstd's magic number or the
//! framed batch's (which the fuzzer would seldom find on its own), must
//! give reports or errors, never a panic; and every event read from them
//! writes a line that is JSON, since the coordinator's log writes it as it
//! stands.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::distributed::outbox::{FRAMED, decode};
use troupe::distributed::wire::{EventLine, Report};

fn check(payload: &[u8]) {
    for report in decode(payload).into_iter().flatten() {
        if let Report::Exited { events, .. } | Report::Cancelled { events, .. } = report {
            for event in events.into_iter().filter_map(EventLine::into_event) {
                let mut line = Vec::new();
                event.write_json(1, &mut line);
                if let Err(e) = serde_json::from_slice::<serde_json::Value>(&line) {
                    panic!("{e}: {}", String::from_utf8_lossy(&line));
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    for magic in [&[0x28, 0xB5, 0x2F, 0xFD][..], &FRAMED[..]] {
        let mut behind = magic.to_vec();
        behind.extend_from_slice(data);
        check(&behind);
    }
});
