//! [`EventBus::publish_all`]: a batch's numbering and delivery, behind a
//! stalled number, meeting a busy deliverer, larger than its shard, on a
//! closed bus. (The concurrent-publishers property with batches is with
//! the other one, in the parent module.)

use super::*;

fn seqs_and_events(sub: &Subscription<Ev>) -> Vec<(u64, Ev)> {
    std::iter::from_fn(|| sub.try_recv())
        .map(|d| {
            let env = event(Some(d));
            (env.seq, *env.event)
        })
        .collect()
}

/// A batch's events reach a subscriber in one allocation, and the next
/// batch in another (`Published`).
#[test]
fn a_batch_is_delivered_in_one_allocation() {
    let bus: EventBus<Ev> = EventBus::new();
    let audit = bus.subscribe_audit("audit", 16);
    bus.publish_all(&mut vec![Ev::Audit(1), Ev::Audit(2), Ev::Audit(3)]);
    bus.publish(Ev::Audit(4));
    let got: Vec<Envelope<Ev>> = std::iter::from_fn(|| audit.try_recv())
        .map(|d| event(Some(d)))
        .collect();
    assert_eq!(got.len(), 4);
    assert!(Published::same_batch(&got[0].event, &got[1].event));
    assert!(Published::same_batch(&got[0].event, &got[2].event));
    assert!(!Published::same_batch(&got[2].event, &got[3].event));
    // What each place of the hand-off queue holds (its size is in
    // `handoff.rs`'s and `HANDOFF`'s documentation), and of a
    // subscriber's queue (8 bytes more a place than with an `Arc`).
    assert_eq!(std::mem::size_of::<Handed<Ev>>(), 40);
    assert_eq!(std::mem::size_of::<super::queue::Parcel<Ev>>(), 40);
}

#[test]
fn a_batch_takes_consecutive_numbers_and_is_delivered_in_order() {
    let bus: EventBus<Ev> = EventBus::new();
    let all = bus.subscribe("all", 16);
    let audit = bus.subscribe_audit("audit", 16);
    assert_eq!(bus.publish(Ev::Audit(0)), Some(1));
    let mut batch = vec![Ev::Audit(1), Ev::Token(2), Ev::Audit(3)];
    let kept = batch.capacity();
    assert_eq!(bus.publish_all(&mut batch), Some(4));
    assert!(batch.is_empty());
    assert_eq!(batch.capacity(), kept, "the batch's allocation is kept");
    assert_eq!(bus.publish_all(&mut batch), None, "nothing to publish");
    batch.push(Ev::Audit(4));
    assert_eq!(bus.publish_all(&mut batch), Some(5));
    assert_eq!(
        seqs_and_events(&all),
        [
            (1, Ev::Audit(0)),
            (2, Ev::Audit(1)),
            (3, Ev::Token(2)),
            (4, Ev::Audit(3)),
            (5, Ev::Audit(4))
        ]
    );
    assert_eq!(seqs_of(&audit), [1, 2, 4, 5]);
}

#[test]
fn a_batch_behind_a_stalled_number_waits_for_it() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe_audit("audit", 16);
    let stalled = bus.shared.next.fetch_add(1, Ordering::SeqCst);
    let mut batch = vec![Ev::Audit(2), Ev::Audit(3)];
    assert_eq!(bus.publish_all(&mut batch), Some(3));
    assert!(sub.try_recv().is_none(), "2 and 3 wait for 1");
    hand_off(&bus, stalled, Ev::Audit(1));
    bus.deliver_handed();
    assert_eq!(seqs_of(&sub), [1, 2, 3]);
}

#[test]
fn a_batch_meeting_a_busy_deliverer_is_handed_off_and_delivered_by_it() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe_audit("audit", 16);
    let holder = bus.try_deliver().expect("free");
    let mut batch = vec![Ev::Audit(1), Ev::Audit(2), Ev::Audit(3)];
    assert_eq!(bus.publish_all(&mut batch), Some(3));
    assert!(sub.try_recv().is_none(), "left with the holder");
    assert!(!bus.shared.handoff.is_empty());
    drop(holder);
    bus.deliver_handed();
    assert_eq!(seqs_of(&sub), [1, 2, 3]);
}

#[test]
fn a_batch_larger_than_its_shard_meeting_a_busy_deliverer_is_delivered_whole() {
    // Shards of 16 384 places (the least a shard has); the batch is
    // 50 000 events, and no one subscribes, so that taking an event is
    // quicker than handing one off and the holder's drain below ends
    // while the publisher still has most of its batch to hand off.
    let bus: EventBus<Ev> = EventBus::with_shards(0, 16);
    let mut holder = bus.try_deliver().expect("free");
    let (done_tx, done) = std::sync::mpsc::channel();
    let publisher = {
        let bus = bus.clone();
        thread::spawn(move || {
            let mut batch: Vec<Ev> = (0..50_000).map(Ev::Audit).collect();
            done_tx.send(bus.publish_all(&mut batch)).unwrap();
        })
    };
    // The holder takes what the publisher has handed off so far and lets
    // go without looking again, as one does that found the queue empty
    // on its way out a moment before; no one else publishes.
    while bus.shared.handoff.is_empty() {
        thread::yield_now();
    }
    bus.take_handed(&mut holder);
    drop(holder);
    // A bound on a wait that hangs if the publisher waits for room no
    // one makes, not a pause.
    let last = done
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the batch's publisher is stuck on its full shard");
    assert_eq!(last, Some(50_000));
    publisher.join().unwrap();
    assert_eq!(bus.shared.registry.lock().unwrap().next_seq, 50_001);
}

#[test]
fn a_batch_on_a_closed_bus_is_refused_whole() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe_audit("audit", 16);
    bus.publish(Ev::Audit(0));
    bus.close();
    let mut batch = vec![Ev::Audit(1), Ev::Audit(2)];
    assert_eq!(bus.publish_all(&mut batch), None);
    assert!(batch.is_empty());
    assert_eq!(bus.last_seq(), 1);
    assert_eq!(seqs_of(&sub), [1]);
}
