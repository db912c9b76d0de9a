use super::*;
use std::sync::Barrier;
use std::thread;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Audit(u32),
    Token(u32),
}

impl BusEvent for Ev {
    fn class(&self) -> EventClass {
        match self {
            Ev::Audit(_) => EventClass::Audit,
            Ev::Token(_) => EventClass::Observer,
        }
    }
}

fn event(delivery: Option<Delivery<Ev>>) -> Envelope<Ev> {
    match delivery {
        Some(Delivery::Event(env)) => env,
        other => panic!("expected an event, got {other:?}"),
    }
}

#[test]
fn seq_starts_at_one_and_increases_per_subscriber() {
    let bus = EventBus::new();
    let sub = bus.subscribe("all", 16);
    let audit = bus.subscribe_audit("audit", 16);
    let seqs: Vec<_> = [Ev::Audit(1), Ev::Token(2), Ev::Audit(3), Ev::Token(4)]
        .into_iter()
        .map(|ev| bus.publish(ev).unwrap())
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(bus.last_seq(), 4);
    assert_eq!(EventBus::<Ev>::new().last_seq(), 0);
    drop(bus);
    let got: Vec<(u64, u32)> = sub
        .iter()
        .map(|d| match d {
            Delivery::Event(env) => match *env.event {
                Ev::Audit(n) | Ev::Token(n) => (env.seq, n),
            },
            Delivery::Lagged { dropped, .. } => panic!("unexpected lag {dropped}"),
        })
        .collect();
    assert_eq!(got, vec![(1, 1), (2, 2), (3, 3), (4, 4)]);
    let audit_seqs: Vec<u64> = audit.into_iter().map(|d| event(Some(d)).seq).collect();
    assert_eq!(audit_seqs, vec![1, 3]);
}

#[test]
fn has_observers_follows_observer_subscribers() {
    let bus = EventBus::<Ev>::new();
    let audit = bus.subscribe_audit("audit", 4);
    assert!(
        !bus.has_observers(),
        "an audit-only subscriber is no observer"
    );
    let all = bus.subscribe("all", 4);
    assert!(bus.has_observers());
    drop(all);
    // Pruned on the next publish that reaches it.
    bus.publish(Ev::Token(1));
    assert!(!bus.has_observers());
    let again = bus.subscribe("again", 4);
    assert!(bus.has_observers());
    bus.close();
    assert!(!bus.has_observers());
    drop((audit, again));
}

#[test]
fn subscribers_share_one_allocation_per_event() {
    let bus = EventBus::new();
    let a = bus.subscribe("a", 4);
    let b = bus.subscribe("b", 4);
    bus.publish(Ev::Audit(7));
    let (ea, eb) = (event(a.try_recv()), event(b.try_recv()));
    assert!(Published::ptr_eq(&ea.event, &eb.event));
    assert_eq!(*ea.event, Ev::Audit(7));
}

#[test]
fn slow_subscriber_keeps_audit_events_and_reports_exact_lag() {
    let bus = EventBus::new();
    let slow = bus.subscribe("slow", 2);
    let fast = bus.subscribe("fast", 64);
    bus.publish(Ev::Audit(1));
    bus.publish(Ev::Audit(2));
    for n in 0..3 {
        bus.publish(Ev::Token(n));
    }
    assert_eq!(slow.dropped_total(), 3);
    assert_eq!(bus.lagged_total(), 3);
    // The queue is full: this publish blocks until `slow` makes room.
    let publisher = {
        let bus = bus.clone();
        thread::spawn(move || bus.publish(Ev::Audit(3)))
    };
    assert_eq!(*event(slow.recv()).event, Ev::Audit(1));
    assert_eq!(*event(slow.recv()).event, Ev::Audit(2));
    assert!(matches!(
        slow.recv(),
        Some(Delivery::Lagged { dropped: 3, .. })
    ));
    let third = event(slow.recv());
    assert_eq!((third.seq, &*third.event), (6, &Ev::Audit(3)));
    assert_eq!(publisher.join().unwrap(), Some(6));
    // After the lag marker the subscriber is back to normal delivery.
    bus.publish(Ev::Token(9));
    assert_eq!(*event(slow.try_recv()).event, Ev::Token(9));
    assert_eq!(slow.dropped_total(), 3);
    drop(bus);
    let fast_seqs: Vec<u64> = fast.into_iter().map(|d| event(Some(d)).seq).collect();
    assert_eq!(fast_seqs, vec![1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn observer_lag_marker_waits_for_room() {
    let bus = EventBus::new();
    let sub = bus.subscribe("s", 1);
    bus.publish(Ev::Token(0));
    bus.publish(Ev::Token(1));
    bus.publish(Ev::Token(2));
    assert_eq!(*event(sub.try_recv()).event, Ev::Token(0));
    // Room for one item: the lag marker takes it and the event is dropped too.
    bus.publish(Ev::Token(3));
    assert!(matches!(
        sub.try_recv(),
        Some(Delivery::Lagged { dropped: 2, .. })
    ));
    assert!(sub.try_recv().is_none());
    bus.publish(Ev::Token(4));
    // Again the marker takes the only slot, so Token(4) is dropped as well.
    assert!(matches!(
        sub.try_recv(),
        Some(Delivery::Lagged { dropped: 1, .. })
    ));
    assert_eq!(sub.dropped_total(), 4);
    // An audit event waits for the marker to be read (from another thread).
    let publisher = {
        let bus = bus.clone();
        thread::spawn(move || bus.publish(Ev::Audit(5)))
    };
    assert!(matches!(
        sub.recv(),
        Some(Delivery::Lagged { dropped: 1, .. })
    ));
    assert_eq!(*event(sub.recv()).event, Ev::Audit(5));
    assert_eq!(publisher.join().unwrap(), Some(6));
}

#[test]
fn dropped_receiver_never_blocks_publish() {
    let bus = EventBus::new();
    let sub = bus.subscribe("gone", 1);
    let keep = bus.subscribe("kept", 64);
    drop(sub);
    for n in 0..10 {
        assert!(bus.publish(Ev::Audit(n)).is_some());
    }
    assert_eq!(bus.subscriber_count(), 1);
    assert_eq!(std::iter::from_fn(|| keep.try_recv()).count(), 10);
}

#[test]
fn dropping_a_full_receiver_unblocks_a_waiting_publisher() {
    let bus = EventBus::new();
    let sub = bus.subscribe("full", 1);
    bus.publish(Ev::Audit(0));
    let publisher = {
        let bus = bus.clone();
        thread::spawn(move || bus.publish(Ev::Audit(1)))
    };
    // Whether the publisher is already blocked or not, it must return.
    drop(sub);
    assert_eq!(publisher.join().unwrap(), Some(2));
    assert_eq!(bus.subscriber_count(), 0);
}

#[test]
fn close_ends_subscriptions_after_draining() {
    let bus = EventBus::new();
    let sub = bus.subscribe("s", 8);
    bus.publish(Ev::Audit(1));
    bus.close();
    assert!(bus.is_closed());
    assert_eq!(bus.publish(Ev::Audit(2)), None);
    let drained: Vec<_> = sub.iter().map(|d| event(Some(d)).seq).collect();
    assert_eq!(drained, vec![1]);
    let late = bus.subscribe("late", 8);
    assert!(late.recv().is_none());
}

#[test]
fn dropping_the_last_handle_ends_a_writer_thread() {
    let bus = EventBus::new();
    let sub = bus.subscribe_audit("writer", 2);
    let writer = thread::spawn(move || sub.into_iter().count());
    let clone = bus.clone();
    for n in 0..5 {
        clone.publish(Ev::Audit(n));
    }
    drop(clone);
    bus.publish(Ev::Audit(5));
    drop(bus);
    assert_eq!(writer.join().unwrap(), 6);
}

/// What a publisher that drew `seq` earlier does last: hands it off.
fn hand_off(bus: &EventBus<Ev>, seq: u64, ev: Ev) {
    let class = ev.class();
    bus.shared.handoff.send(Handed {
        seq,
        class,
        event: Published::new(ev),
    });
}

#[test]
fn an_event_handed_off_late_is_delivered_before_the_ones_drawn_after_it() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe_audit("audit", 16);
    // A publisher draws 1 and stalls before handing its event off;
    // two others draw 2 and 3 and publish.
    let stalled = bus.shared.next.fetch_add(1, Ordering::SeqCst);
    assert_eq!(stalled, 1);
    assert_eq!(bus.publish(Ev::Audit(2)), Some(2));
    assert_eq!(bus.publish(Ev::Audit(3)), Some(3));
    assert!(sub.try_recv().is_none(), "2 and 3 wait for 1");
    hand_off(&bus, 1, Ev::Audit(1));
    bus.deliver_handed();
    let got: Vec<_> = (0..3).map(|_| event(sub.try_recv())).collect();
    assert_eq!(
        got.iter().map(|e| (e.seq, &*e.event)).collect::<Vec<_>>(),
        [(1, &Ev::Audit(1)), (2, &Ev::Audit(2)), (3, &Ev::Audit(3))]
    );
}

/// Draws `seq` numbers 1 to `n`, as publishers do before they deliver
/// or hand off.
fn draw(bus: &EventBus<Ev>, n: u64) {
    for expected in 1..=n {
        assert_eq!(bus.shared.next.fetch_add(1, Ordering::SeqCst), expected);
    }
}

/// [`hand_off`] through shard `shard`, as a thread numbered so would.
fn hand_off_through(bus: &EventBus<Ev>, shard: usize, seq: u64, ev: Ev) {
    let class = ev.class();
    bus.shared.handoff.send_to(
        shard,
        Handed {
            seq,
            class,
            event: Published::new(ev),
        },
    );
}

#[test]
fn events_handed_off_through_several_shards_are_delivered_in_seq_order() {
    let bus: EventBus<Ev> = EventBus::with_shards(0, 3);
    let sub = bus.subscribe_audit("audit", 16);
    draw(&bus, 5);
    // Shard 0 holds 5 before 2; the deliverer reads shard 0 first, and 1
    // comes last, from shard 2.
    hand_off_through(&bus, 0, 5, Ev::Audit(5));
    hand_off_through(&bus, 0, 2, Ev::Audit(2));
    hand_off_through(&bus, 1, 4, Ev::Audit(4));
    hand_off_through(&bus, 1, 3, Ev::Audit(3));
    bus.deliver_handed();
    assert!(sub.try_recv().is_none(), "all wait for 1");
    hand_off_through(&bus, 2, 1, Ev::Audit(1));
    bus.deliver_handed();
    let got: Vec<_> = (0..5).map(|_| event(sub.try_recv()).seq).collect();
    assert_eq!(got, [1, 2, 3, 4, 5]);
    assert!(sub.try_recv().is_none());
    assert!(bus.shared.handoff.is_empty());
}

#[test]
fn close_waits_for_events_in_every_shard() {
    let bus: EventBus<Ev> = EventBus::with_shards(0, 4);
    let sub = bus.subscribe_audit("audit", 16);
    draw(&bus, 3);
    hand_off_through(&bus, 3, 3, Ev::Audit(3));
    hand_off_through(&bus, 2, 2, Ev::Audit(2));
    let late = {
        let bus = bus.clone();
        thread::spawn(move || {
            while !bus.is_closed() {
                thread::yield_now();
            }
            hand_off_through(&bus, 0, 1, Ev::Audit(1));
        })
    };
    bus.close();
    late.join().unwrap();
    assert_eq!(bus.last_seq(), 3);
    let got: Vec<_> = (0..3).map(|_| event(sub.recv()).seq).collect();
    assert_eq!(got, [1, 2, 3]);
    assert!(sub.recv().is_none(), "the subscription ends after them");
}

#[test]
fn close_waits_for_an_event_drawn_before_it() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe_audit("audit", 16);
    draw(&bus, 1);
    let late = {
        let bus = bus.clone();
        thread::spawn(move || {
            // Hands its event off only once close is waiting for it.
            while !bus.is_closed() {
                thread::yield_now();
            }
            hand_off(&bus, 1, Ev::Audit(1));
        })
    };
    bus.close();
    late.join().unwrap();
    assert_eq!(bus.publish(Ev::Audit(2)), None);
    assert_eq!(bus.last_seq(), 1);
    assert_eq!(event(sub.recv()).seq, 1);
    assert!(sub.recv().is_none(), "the subscription ends after it");
}

#[test]
fn a_second_close_after_a_refused_publish_returns_and_last_seq_stays() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe_audit("audit", 16);
    assert_eq!(bus.publish(Ev::Audit(1)), Some(1));
    bus.close();
    // A publisher that looked before the close and drew after it.
    let refused = bus.shared.next.fetch_add(1, Ordering::SeqCst);
    assert_ne!(refused & CLOSED, 0);
    let again = {
        let bus = bus.clone();
        thread::spawn(move || bus.close())
    };
    again.join().unwrap();
    assert_eq!(bus.publish(Ev::Audit(2)), None);
    assert_eq!(bus.last_seq(), 1, "refused draws publish nothing");
    assert_eq!(event(sub.recv()).seq, 1);
    assert!(sub.recv().is_none());
}

#[test]
fn a_bus_continued_after_an_absurd_seq_still_publishes_and_closes() {
    let bus: EventBus<Ev> = EventBus::continuing_after(u64::MAX);
    let sub = bus.subscribe_audit("audit", 4);
    assert!(!bus.is_closed());
    assert_eq!(bus.publish(Ev::Audit(1)), Some(MAX_LAST_SEQ + 1));
    bus.close();
    assert_eq!(bus.last_seq(), MAX_LAST_SEQ + 1);
    assert_eq!(event(sub.recv()).seq, MAX_LAST_SEQ + 1);
    assert!(sub.recv().is_none());
}

#[test]
fn a_subscriber_joining_under_load_gets_every_event_from_its_first_on() {
    const THREADS: u32 = 4;
    const PER_THREAD: u32 = 2_000;
    let bus: EventBus<Ev> = EventBus::new();
    let start = Arc::new(Barrier::new(THREADS as usize + 1));
    let publishers: Vec<_> = (0..THREADS)
        .map(|t| {
            let bus = bus.clone();
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                for _ in 0..PER_THREAD {
                    bus.publish(Ev::Audit(t));
                }
            })
        })
        .collect();
    start.wait();
    let sub = bus.subscribe_audit("late", 1 << 16);
    let joined_after = bus.last_seq();
    for p in publishers {
        p.join().unwrap();
    }
    let last = bus.last_seq();
    drop(bus);
    let seqs: Vec<u64> = sub.iter().map(|d| event(Some(d)).seq).collect();
    let first = seqs.first().copied().unwrap_or(last + 1);
    assert!(
        first <= joined_after + 1,
        "nothing published after joining is missed"
    );
    assert_eq!(
        seqs,
        (first..=last).collect::<Vec<_>>(),
        "no gaps, in order"
    );
}

#[test]
fn concurrent_publishers_keep_seq_order_without_audit_gaps() {
    concurrent_publishers_in(false);
}

/// As above, each thread publishing batches of one to four events
/// ([`EventBus::publish_all`]) rather than one at a time.
#[test]
fn concurrent_batches_keep_seq_order_without_audit_gaps() {
    concurrent_publishers_in(true);
}

fn concurrent_publishers_in(batched: bool) {
    // Queues too small for parcels: every event goes on its own.
    concurrent_publishers(3, 1, 1, batched);
    // Queues with room: holds send parcels (27 in one run on 2 cores),
    // and the observer queue still fills and lags now and then.
    concurrent_publishers(64, 1 << 16, 1, batched);
    // Hand-offs through shards, a thread to each and threads sharing one:
    // the deliverer merges them back into `seq` order.
    for shards in [3, 8] {
        concurrent_publishers(3, 1, shards, batched);
        concurrent_publishers(64, 1 << 16, shards, batched);
    }
}

fn concurrent_publishers(all_capacity: usize, audit_capacity: usize, shards: usize, batched: bool) {
    const THREADS: u32 = 4;
    const PER_THREAD: u32 = 300;
    let bus: EventBus<Ev> = EventBus::with_shards(0, shards);
    let all = bus.subscribe("all", all_capacity);
    let audit = bus.subscribe_audit("audit", audit_capacity);
    let start = Arc::new(Barrier::new(THREADS as usize));
    let readers: Vec<_> = [all, audit]
        .into_iter()
        .map(|sub| {
            thread::spawn(move || {
                let mut seqs = Vec::new();
                let mut dropped = 0;
                for delivery in sub {
                    match delivery {
                        Delivery::Event(env) => seqs.push((env.seq, env.event.class())),
                        Delivery::Lagged { dropped: n, .. } => dropped += n,
                    }
                }
                (seqs, dropped)
            })
        })
        .collect();
    let publishers: Vec<_> = (0..THREADS)
        .map(|t| {
            let bus = bus.clone();
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                let mut audit_seqs = Vec::new();
                let mut every_seq = Vec::new();
                let mut batch = Vec::new();
                let mut classes = Vec::new();
                for n in 0..PER_THREAD {
                    let ev = if n % 3 == 0 {
                        Ev::Token(t)
                    } else {
                        Ev::Audit(t)
                    };
                    classes.push(ev.class());
                    batch.push(ev);
                    // Batches of 1, 2, 3, 4 events in turn (the last may
                    // be shorter), or one event at a time.
                    let size = if batched { (n / 10) % 4 + 1 } else { 1 };
                    if batch.len() < size as usize && n + 1 < PER_THREAD {
                        continue;
                    }
                    let last = if batched {
                        bus.publish_all(&mut batch).unwrap()
                    } else {
                        bus.publish(batch.pop().unwrap()).unwrap()
                    };
                    let first = last + 1 - classes.len() as u64;
                    for (seq, class) in (first..=last).zip(classes.drain(..)) {
                        every_seq.push(seq);
                        if class == EventClass::Audit {
                            audit_seqs.push(seq);
                        }
                    }
                }
                (audit_seqs, every_seq)
            })
        })
        .collect();
    let mut audit_published = Vec::new();
    let mut every_published = Vec::new();
    for publisher in publishers {
        let (audit_seqs, every_seq) = publisher.join().unwrap();
        audit_published.extend(audit_seqs);
        every_published.extend(every_seq);
    }
    audit_published.sort_unstable();
    every_published.sort_unstable();
    let total = u64::from(THREADS * PER_THREAD);
    // Every publish has returned, so every event is delivered: none is
    // left in a hand-off shard waiting for a deliverer.
    assert_eq!(bus.shared.registry.lock().unwrap().next_seq, total + 1);
    let lagged = bus.lagged_total();
    drop(bus);
    let mut results = readers.into_iter().map(|r| r.join().unwrap());
    let (all_seqs, all_dropped) = results.next().unwrap();
    let (audit_seqs, audit_dropped) = results.next().unwrap();

    for seqs in [&all_seqs, &audit_seqs] {
        assert!(
            seqs.windows(2).all(|w| w[0].0 < w[1].0),
            "seq not increasing"
        );
    }
    let audit_of = |seqs: &[(u64, EventClass)]| -> Vec<u64> {
        seqs.iter()
            .filter(|(_, c)| *c == EventClass::Audit)
            .map(|(s, _)| *s)
            .collect()
    };
    assert_eq!(audit_of(&all_seqs), audit_published);
    assert_eq!(audit_of(&audit_seqs), audit_published);
    assert_eq!(audit_seqs.len(), audit_published.len());
    assert_eq!(audit_dropped, 0);
    // Every drop is counted; markers report the drops followed by a delivery.
    assert_eq!(all_seqs.len() as u64 + lagged, total);
    assert!(all_dropped <= lagged);
    // Publishers got every number from 1 to total exactly once.
    assert_eq!(every_published, (1..=total).collect::<Vec<_>>());
    let observer_count = u64::from(THREADS * PER_THREAD.div_ceil(3));
    assert_eq!(audit_published.len() as u64, total - observer_count);
}

/// Publishes `events` in one hold of the registry: the first number is
/// drawn and stalls, the events after it are held back behind it, and its
/// late hand-off delivers them all at once, as a deliverer under load does.
fn in_one_hold(bus: &EventBus<Ev>, events: impl IntoIterator<Item = Ev>, first: Ev) {
    let stalled = bus.shared.next.fetch_add(1, Ordering::SeqCst);
    for ev in events {
        bus.publish(ev);
    }
    hand_off(bus, stalled, first);
    bus.deliver_handed();
}

fn seqs_of(sub: &Subscription<Ev>) -> Vec<u64> {
    std::iter::from_fn(|| sub.try_recv())
        .map(|d| event(Some(d)).seq)
        .collect()
}

#[test]
fn one_hold_sends_its_deliveries_as_parcels_in_order() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe_audit("audit", 1_000);
    in_one_hold(&bus, (2..=200).map(Ev::Audit), Ev::Audit(1));
    // 200 events: three full parcels and one of 8, not 200 queue items.
    assert_eq!(sub.receiver.len(), 200usize.div_ceil(PARCEL));
    assert_eq!(sub.stats.parcelled.load(Ordering::Relaxed), 200);
    assert_eq!(seqs_of(&sub), (1..=200).collect::<Vec<_>>());
    assert_eq!(sub.stats.parcelled.load(Ordering::Relaxed), 0);
}

#[test]
fn a_subscriber_without_room_for_a_parcel_gets_its_events_one_by_one() {
    let bus: EventBus<Ev> = EventBus::new();
    let audit = bus.subscribe_audit("audit", 1_000);
    let small = bus.subscribe("small", 10);
    // 30 observer events do not fit a queue of 10: sent one by one, the
    // first 10 kept and 20 dropped, counted exactly, as without parcels.
    in_one_hold(&bus, (2..=30).map(Ev::Token), Ev::Token(1));
    assert_eq!(small.receiver.len(), 10);
    assert_eq!(small.dropped_total(), 20);
    assert_eq!(seqs_of(&small), (1..=10).collect::<Vec<_>>());
    // The audit-only subscriber took none of them.
    assert!(audit.try_recv().is_none());
    // Its next delivery says what it missed.
    bus.publish(Ev::Audit(31));
    assert!(matches!(
        small.try_recv(),
        Some(Delivery::Lagged {
            dropped: 20,
            last_seq: 30
        })
    ));
    assert_eq!(event(small.try_recv()).seq, 31);
}

#[test]
fn an_observer_parcel_meeting_a_full_queue_is_dropped_and_counted_whole() {
    let bus: EventBus<Ev> = EventBus::new();
    let sub = bus.subscribe("s", 4);
    for n in 0..4 {
        bus.publish(Ev::Token(n));
    }
    // The queue holds four single events; a parcel of three has room by
    // count but no place: all three are dropped.
    in_one_hold(&bus, (6..=7).map(Ev::Token), Ev::Token(5));
    assert_eq!(sub.dropped_total(), 3);
    assert_eq!(bus.lagged_total(), 3);
    assert_eq!(sub.stats.parcelled.load(Ordering::Relaxed), 0);
    assert_eq!(seqs_of(&sub), vec![1, 2, 3, 4]);
    // An audit parcel waits for room instead, its observer events with it.
    in_one_hold(&bus, [Ev::Token(9), Ev::Audit(10)], Ev::Audit(8));
    assert!(matches!(
        sub.try_recv(),
        Some(Delivery::Lagged {
            dropped: 3,
            last_seq: 7
        })
    ));
    assert_eq!(seqs_of(&sub), vec![8, 9, 10]);
    assert_eq!(sub.dropped_total(), 3);
}

#[test]
fn a_full_audit_parcel_waits_for_room_and_loses_nothing() {
    let bus: EventBus<Ev> = EventBus::new();
    let full = u32::try_from(2 * PARCEL).unwrap();
    let sub = bus.subscribe_audit("audit", 2 * PARCEL);
    for n in 0..full {
        bus.publish(Ev::Audit(n));
    }
    // The queue is full of single events: the hold's parcel must wait.
    let holder = {
        let bus = bus.clone();
        thread::spawn(move || {
            // 40 more, one stalled and 39 behind it.
            let first = full + 1;
            in_one_hold(
                &bus,
                (first + 1..first + 40).map(Ev::Audit),
                Ev::Audit(first),
            );
        })
    };
    let got: Vec<u64> = (0..full + 40).map(|_| event(sub.recv()).seq).collect();
    holder.join().unwrap();
    assert_eq!(got, (1..=u64::from(full) + 40).collect::<Vec<_>>());
    assert!(sub.try_recv().is_none());
}

#[test]
fn a_full_shard_holds_its_publisher_until_the_audit_log_catches_up() {
    let bus: EventBus<Ev> = EventBus::with_shards(0, 2);
    let sub = bus.subscribe_audit("audit", 1);
    // The audit queue is full.
    assert_eq!(bus.publish(Ev::Audit(1)), Some(1));
    // A deliverer holds the registry, waiting for room for event 2.
    let deliverer = {
        let bus = bus.clone();
        thread::spawn(move || bus.publish(Ev::Audit(2)))
    };
    while !bus.shared.delivering.load(Ordering::Relaxed) {
        thread::yield_now();
    }
    // A publisher hands off more than its shard has room for.
    let places = bus.shared.handoff.shard_places();
    let more = u32::try_from(places + 10).unwrap();
    let publisher = {
        let bus = bus.clone();
        thread::spawn(move || {
            for n in 0..more {
                bus.publish(Ev::Audit(3 + n));
            }
        })
    };
    // It fills its shard and waits there.
    while bus.shared.handoff.queued() < places {
        thread::yield_now();
    }
    assert!(!publisher.is_finished());
    // The log catches up: everything arrives, in order, and both return.
    let total = 2 + u64::from(more);
    // (A lost event would leave this waiting: the guard makes it a failure.)
    let guard = std::time::Duration::from_secs(30);
    let got: Vec<u64> = (0..total)
        .map(|_| event(sub.recv_timeout(guard).ok()).seq)
        .collect();
    assert_eq!(got, (1..=total).collect::<Vec<_>>());
    assert_eq!(deliverer.join().unwrap(), Some(2));
    publisher.join().unwrap();
    assert!(sub.try_recv().is_none());
    assert!(bus.shared.handoff.is_empty());
}

mod batches;
