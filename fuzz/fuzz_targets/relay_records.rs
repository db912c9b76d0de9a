//! Fuzzes `Event::read_relayed`, the coordinator's reading of the records
//! a worker relays a sibling's events in (distributed runs): arbitrary
//! bytes must give events, `None`s and a fault, never a panic; every event
//! read writes a line that is JSON (the coordinator's log writes it as it
//! stands); and an event read, relayed again, reads back as itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::runtime::events::{Event, Relaying};

fuzz_target!(|data: &[u8]| {
    let (events, _fault) = Event::read_relayed(data);
    for event in events.into_iter().flatten() {
        let mut line = Vec::new();
        event.write_json(1, &mut line);
        if let Err(e) = serde_json::from_slice::<serde_json::Value>(&line) {
            panic!("{e}: {}", String::from_utf8_lossy(&line));
        }
        let mut relaying = Relaying::default();
        relaying.push(&event);
        let (again, fault) = Event::read_relayed(&relaying.into_bytes());
        assert_eq!(fault, None);
        let [Some(again)] = &again[..] else {
            panic!("one event relayed, {again:?} read");
        };
        let mut second = Vec::new();
        again.write_json(1, &mut second);
        assert_eq!(
            String::from_utf8_lossy(&line),
            String::from_utf8_lossy(&second),
            "relayed again"
        );
    }
});
