//! Fuzzes `Event::from_line`, the coordinator's reading of the audit lines
//! workers send it (distributed runs): arbitrary text must give an event
//! or `None`, never a panic; and an event read back writes a line that
//! reads back to the same line (what the coordinator relays is what it
//! was sent, field for field).
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::distributed::wire::EventLine;
use troupe::runtime::events::Event;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    // Read inside a report (the coordinator's one pass), the line gives
    // what it gives alone; a line without a timestamp is stamped when
    // read, so the stamps are left out of the comparison.
    let embedded: Result<Vec<EventLine>, _> = serde_json::from_str(&format!("[{line}]"));
    if let Ok(read) = embedded
        && read.len() == 1
    {
        let unstamped = |e: Option<Event>| {
            e.map(|mut e| {
                e.ts = std::time::UNIX_EPOCH;
                e
            })
        };
        let read = read.into_iter().next().and_then(EventLine::into_event);
        assert_eq!(unstamped(read), unstamped(Event::from_line(line)));
    }
    let Some(event) = Event::from_line(line) else {
        return;
    };
    let mut first = Vec::new();
    event.write_json(7, &mut first);
    let first = String::from_utf8(first).expect("a written line is UTF-8");
    let again = Event::from_line(&first).expect("a written line reads back");
    let mut second = Vec::new();
    again.write_json(7, &mut second);
    assert_eq!(first.as_bytes(), &second[..], "written, read and written again");
    serde_json::from_str::<serde_json::Value>(&first).expect("a written line is JSON");
});
