//! Fuzzes `outbox::decode`, the coordinator's reading of one message of a
//! run's report stream (distributed runs): a worker's batch as JSON, or
//! compressed with zstd. Arbitrary bytes, as they come and behind zstd's
//! magic number (which the fuzzer would seldom find on its own), must give
//! reports or errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::distributed::outbox::decode;

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    let mut framed = vec![0x28, 0xB5, 0x2F, 0xFD];
    framed.extend_from_slice(data);
    let _ = decode(&framed);
});
