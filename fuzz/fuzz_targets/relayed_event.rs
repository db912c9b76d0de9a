//! Fuzzes `Event::from_line`, the coordinator's reading of the audit lines
//! workers send it (distributed runs): arbitrary text must give an event
//! or `None`, never a panic; and an event read back writes a line that
//! reads back to the same line (what the coordinator relays is what it
//! was sent, field for field), and relayed as records writes it again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::distributed::wire::{EventLine, Report};
use troupe::runtime::events::Event;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    // Read inside a report, as the coordinator reads a worker's batch,
    // the line gives what it gives alone, and any single JSON value keeps
    // its report. A line without a timestamp is stamped when read, so the
    // stamps are left out of the comparison.
    let batch = format!(
        r#"[{{"kind":"cancelled","body":{{"stageExecutionId":"r/w#1/1","turn":1,"unit":1,"worker":"w","usage":{{"promptTokens":0,"completionTokens":0,"requests":0}},"events":[{line}]}}}}]"#
    );
    let one_value = serde_json::from_str::<&serde_json::value::RawValue>(line).is_ok();
    match troupe::distributed::outbox::decode(batch.as_bytes())
        .into_iter()
        .next()
    {
        // Text that is more than one value can close the report around it
        // and go on as other reports: only one value is compared.
        Some(Ok(Report::Cancelled { events, .. })) if events.len() == 1 && one_value => {
            let unstamped = |e: Option<Event>| {
                e.map(|mut e| {
                    e.ts = std::time::UNIX_EPOCH;
                    e
                })
            };
            let read = events.into_iter().next().and_then(EventLine::into_event);
            assert_eq!(unstamped(read), unstamped(Event::from_line(line)));
        }
        _ => assert!(!one_value, "a single JSON value lost its report: {line}"),
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
    assert_eq!(
        first.as_bytes(),
        &second[..],
        "written, read and written again"
    );
    serde_json::from_str::<serde_json::Value>(&first).expect("a written line is JSON");
    // Relayed as records instead, the event writes the same line.
    let mut relaying = troupe::runtime::events::Relaying::default();
    relaying.push(&event);
    let (back, fault) = Event::read_relayed(&relaying.into_bytes());
    assert_eq!(fault, None);
    let [Some(back)] = &back[..] else {
        panic!("one event relayed, {back:?} read");
    };
    let mut third = Vec::new();
    back.write_json(7, &mut third);
    assert_eq!(first.as_bytes(), &third[..], "relayed as records");
});
