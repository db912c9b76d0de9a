//! Event bus: fans published events out to bounded per-subscriber queues, in sequence order.
//!
//! The bus is a projection: nothing authoritative flows through it, it only lets
//! observers (progress display, token streams) and recorders (the audit log)
//! see what happened.
//!
//! * Every [`EventBus::publish`] gets the next sequence number of this bus
//!   (strictly increasing, starting at 1) from an atomic counter, and every
//!   subscriber receives events in `seq` order.
//! * Publishing takes no lock that a publisher waits for. The publisher
//!   tries to become the *deliverer*: whoever holds the registry takes
//!   everything handed off, puts it back in `seq` order (an event whose
//!   publisher is still between taking its number and handing it off is
//!   waited for; the ones after it are held) and delivers it to every
//!   subscriber, its own event included. A publisher that finds another
//!   deliverer at work hands its event, with its `seq`, to a bounded
//!   hand-off queue (its thread's shard of it, `handoff.rs`) and
//!   returns: that one delivers it, because every
//!   holder of the registry looks at the hand-off queue again after
//!   letting it go. When no other thread holds the registry (another
//!   publisher, a subscribe, a close), an event is in every queue when
//!   `publish` returns; otherwise whoever holds it delivers it. A
//!   publisher preempted between drawing
//!   its number and handing its event off holds back the events drawn
//!   after it: they wait, in order, until it hands off (for the length of
//!   that preemption, the hand-off queue's bound does not bound them).
//!   (Before, the whole publish ran under one lock: on 16 threads that lock
//!   put a third of the runtime's time into futex waits.)
//! * [`EventBus::publish_all`] publishes a batch as its events published
//!   one after another would be, drawing their numbers in one step (so
//!   they are consecutive) and, uncontended, delivering them in one hold.
//!   Its events share one allocation ([`Published`]), freed with the last
//!   handle on any of them: a subscriber's, or the publisher's when no
//!   subscriber takes them.
//! * Each subscriber has its own bounded queue. An [`EventClass::Observer`]
//!   event meeting a full queue is dropped and counted; the next delivery that
//!   fits is preceded by [`Delivery::Lagged`] with the exact number dropped. An
//!   [`EventClass::Audit`] event is never dropped: the deliverer blocks until
//!   the subscriber has room, and once a publisher's shard of the
//!   hand-off queue is full it blocks with it (backpressure on every
//!   publisher, each once its own shard fills). A
//!   subscriber must therefore never publish on the bus it drains.
//! * What one holder of the registry delivers to a subscriber in a row goes
//!   into its queue as one parcel (at most [`PARCEL`] events), not event by
//!   event: under contention a deliverer takes dozens of handed-off events
//!   at a time, and a queue operation per event was the larger part of its
//!   time in the one-at-a-time section. A [`Subscription`] unpacks parcels
//!   and hands out deliveries one at a time, so nothing else changes for
//!   its reader. A parcel goes as such only while the subscriber keeps up
//!   (the events of its queued parcels and this one within its capacity);
//!   one that is behind is sent event by event as before, so a queue holds
//!   at most about twice its capacity in events, and the rules above
//!   (observer drops, audit waits) hold event by event for a lagging
//!   subscriber. Observer events riding in a parcel with an audit event
//!   wait with it rather than being dropped.
//! * A subscriber whose [`Subscription`] was dropped is removed on the next
//!   delivery; a deliverer blocked on it is woken up, so publish never
//!   blocks forever on a dead subscriber.
//! * When the last [`EventBus`] handle is dropped, or [`EventBus::close`] is
//!   called, every subscription ends once its queued items are drained: a
//!   writer thread looping over [`Subscription::iter`] terminates.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

/// The bit of [`Shared::next`] that says the bus is closed. A publisher
/// that draws a number with it set publishes nothing; `close` sets it and
/// learns in the same step which numbers were handed out before.
const CLOSED: u64 = 1 << 63;

/// Events handed off and not yet taken by a deliverer, over all the
/// hand-off queue's shards (`handoff.rs`). Publishers wait when their
/// shard is full (a deliverer is waiting on a full audit queue). It
/// holds a burst as large as the audit log's queue: when a fail-fast
/// cancels 10 000 siblings on 16 threads at once, their `StageCancelled`
/// events filled 4 096 places, the publishers blocked, and the deliverer
/// then woke one of them (a system call) for every event it took, which
/// stretched the cancellation from 8 ms to over 40 on some runs. A
/// shard of it costs 48 bytes a place, once a thread first hands off to
/// it (`handoff.rs`).
const HANDOFF: usize = 1 << 16;

/// Room for events held back behind a late hand-off that stays allocated.
const EARLY_KEPT: usize = 64;

/// The most events one parcel carries (module documentation).
pub const PARCEL: usize = 64;

/// The largest `seq` a bus continues after ([`EventBus::continuing_after`]):
/// the largest integer every JSON reader keeps exact, and far below the
/// closed bit.
pub const MAX_LAST_SEQ: u64 = (1 << 53) - 1;

/// Whether an event may be dropped under backpressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventClass {
    /// Must be recorded: never dropped, publish waits for room.
    Audit,
    /// Informational (tokens, progress): dropped when a subscriber lags.
    Observer,
}

/// An event that can travel on an [`EventBus`].
///
/// Events are shared between subscribers ([`Published`]), hence `Sync`.
pub trait BusEvent: Send + Sync + 'static {
    /// How the bus must treat this event under backpressure.
    fn class(&self) -> EventClass;
}

/// A published event with its bus sequence number.
#[derive(Debug)]
pub struct Envelope<E> {
    /// Sequence number assigned by the bus (strictly increasing, from 1).
    pub seq: u64,
    /// The event, shared by every subscriber (and, in one allocation,
    /// with the events published beside it: [`Published`]).
    pub event: Published<E>,
}

impl<E> Clone for Envelope<E> {
    fn clone(&self) -> Self {
        Self {
            seq: self.seq,
            event: self.event.clone(),
        }
    }
}

/// One item received by a subscriber.
#[derive(Debug)]
pub enum Delivery<E> {
    /// A published event.
    Event(Envelope<E>),
    /// This many observer events were dropped for this subscriber since its
    /// previous delivery (the `SubscriberLagged` diagnostic).
    Lagged {
        /// Number of events dropped.
        dropped: u64,
        /// The sequence number of the last event dropped: the diagnostic
        /// takes its place in the subscriber's sequence.
        last_seq: u64,
    },
}

/// The registry held by a publisher that delivers. The `delivering` mark
/// is cleared before the lock is let go (on a panic too): `drop` runs
/// before the guard, a field, is dropped.
struct Deliverer<'a, E> {
    guard: MutexGuard<'a, Registry<E>>,
    mark: &'a AtomicBool,
}

impl<E> std::ops::Deref for Deliverer<'_, E> {
    type Target = Registry<E>;

    fn deref(&self) -> &Registry<E> {
        &self.guard
    }
}

impl<E> std::ops::DerefMut for Deliverer<'_, E> {
    fn deref_mut(&mut self) -> &mut Registry<E> {
        &mut self.guard
    }
}

impl<E> Drop for Deliverer<'_, E> {
    fn drop(&mut self) {
        self.mark.store(false, Ordering::Relaxed);
    }
}

/// An event handed off by its publisher, waiting for a deliverer.
struct Handed<E> {
    seq: u64,
    class: EventClass,
    event: Published<E>,
}

/// The deliverer's state: whoever holds it delivers.
struct Registry<E> {
    /// The next `seq` to deliver.
    next_seq: u64,
    closed: bool,
    subscribers: Vec<Subscriber<E>>,
    /// Events taken off the hand-off queue ahead of their turn, at
    /// `seq - next_seq`: the front is `None` while the publisher of
    /// `next_seq` has not handed it off yet.
    early: VecDeque<Option<Handed<E>>>,
}

/// The fields every publisher writes or reads each time sit on cache lines
/// of their own ([`Padded`]): the counter every publish draws from, the
/// mark every publisher reads, the registry a deliverer writes.
struct Shared<E> {
    /// The next `seq` to hand out, with [`CLOSED`] once closed.
    next: Padded<AtomicU64>,
    handoff: Handoff<Handed<E>>,
    registry: Padded<Mutex<Registry<E>>>,
    /// Set while a publisher delivers (holds the registry through
    /// [`EventBus::try_deliver`]). Publishers read it before trying the
    /// registry's lock: on 16 threads their failed attempts, each taking
    /// the lock's cache line from the deliverer, were a good part of the
    /// bus's cost. Only a hint: a holder may not have set it yet, or have
    /// cleared it already; the fences in `publish` and `deliver_handed`
    /// make sure a handed-off event is still seen.
    delivering: Padded<AtomicBool>,
    lagged_total: AtomicU64,
    /// Live subscribers that receive observer events; read without the lock
    /// so publishers can skip building observer events no one would see.
    observers: AtomicUsize,
}

/// Cheap cloneable handle to an event bus. See the module documentation.
pub struct EventBus<E> {
    shared: Arc<Shared<E>>,
}

impl<E> Clone for EventBus<E> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<E: BusEvent> fmt::Debug for EventBus<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (next_seq, closed, names) = self.with_registry(|registry| {
            let names: Vec<String> = registry
                .subscribers
                .iter()
                .map(|s| s.name.clone())
                .collect();
            (registry.next_seq, registry.closed, names)
        });
        f.debug_struct("EventBus")
            .field("next_seq", &next_seq)
            .field("closed", &closed)
            .field("subscribers", &names)
            .field("lagged_total", &self.lagged_total())
            .finish()
    }
}

impl<E: BusEvent> Default for EventBus<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: BusEvent> EventBus<E> {
    /// A new, open bus with no subscribers.
    #[must_use]
    pub fn new() -> Self {
        Self::continuing_after(0)
    }

    /// A bus whose first event gets `last_seq + 1`: a sequence continued
    /// from an earlier one (a resumed run's audit log). `last_seq` is
    /// taken at most as [`MAX_LAST_SEQ`]: a log beyond it is no log troupe
    /// wrote (its reader refuses it), and a counter started near the
    /// closed bit would read as a bus that is closed and never finishes
    /// closing.
    pub fn continuing_after(last_seq: u64) -> Self {
        Self::with_shards(last_seq, handoff::shards_here())
    }

    /// [`EventBus::continuing_after`], its hand-off queue in `shards`.
    fn with_shards(last_seq: u64, shards: usize) -> Self {
        let last_seq = last_seq.min(MAX_LAST_SEQ);
        Self {
            shared: Arc::new(Shared {
                next: Padded(AtomicU64::new(last_seq + 1)),
                handoff: Handoff::new(shards, HANDOFF),
                registry: Padded(Mutex::new(Registry {
                    next_seq: last_seq + 1,
                    closed: false,
                    subscribers: Vec::new(),
                    early: VecDeque::new(),
                })),
                delivering: Padded(AtomicBool::new(false)),
                lagged_total: AtomicU64::new(0),
                observers: AtomicUsize::new(0),
            }),
        }
    }

    /// Subscribes to every event, with a queue of `capacity` items (at least 1).
    /// Only events published after this call are received. It first
    /// delivers what other publishers handed off, so it may wait, as a
    /// publisher does, for room in an audit subscriber's queue.
    #[must_use]
    pub fn subscribe(&self, name: &str, capacity: usize) -> Subscription<E> {
        self.add_subscriber(name, capacity, Interest::All)
    }

    /// Subscribes to audit events only (e.g. the audit log writer). Such a
    /// subscriber never lags; its sequence numbers skip the observer events.
    #[must_use]
    pub fn subscribe_audit(&self, name: &str, capacity: usize) -> Subscription<E> {
        self.add_subscriber(name, capacity, Interest::AuditOnly)
    }

    fn add_subscriber(&self, name: &str, capacity: usize, interest: Interest) -> Subscription<E> {
        let (mut subscriber, subscription) = queue::pair(name, capacity, interest);
        self.with_registry(|registry| {
            // On a closed bus the sender is dropped here, so the
            // subscription ends at once.
            if registry.closed {
                return;
            }
            if interest == Interest::All {
                self.shared.observers.fetch_add(1, Ordering::Relaxed);
            }
            // No one delivers while the registry is held: events drawn
            // before this are not received, the ones after are.
            subscriber.from = self.shared.next.load(Ordering::SeqCst) & !CLOSED;
            registry.subscribers.push(subscriber);
        });
        subscription
    }

    /// Publishes `event` to every subscriber and returns its sequence number,
    /// or `None` if the bus is closed. Blocks while it delivers an audit
    /// event that waits for room in a subscriber's queue, or while the
    /// hand-off queue is full.
    pub fn publish(&self, event: E) -> Option<u64> {
        let class = event.class();
        let shared = &*self.shared;
        // A draw refused after the close moves the counter and nothing
        // else: `last_seq` of a closed bus reads what was delivered.
        let seq = shared.next.fetch_add(1, Ordering::SeqCst);
        if seq & CLOSED != 0 {
            return None;
        }
        let handed = Handed {
            seq,
            class,
            event: Published::new(event),
        };
        // Uncontended, the publisher delivers its own event without the
        // hand-off queue; only one that finds the registry held hands off.
        let Some(registry) = self.try_deliver() else {
            shared.handoff.send(handed);
            self.deliver_handed();
            return Some(seq);
        };
        self.deliver_own(registry, std::iter::once(handed));
        Some(seq)
    }

    /// Delivers, holding the registry, what was handed off and then the
    /// holder's own events (in `seq` order), lets go, and delivers what
    /// others handed off meanwhile (the fence pairs with theirs, as in
    /// `deliver_handed`).
    fn deliver_own(
        &self,
        mut registry: Deliverer<'_, E>,
        own: impl IntoIterator<Item = Handed<E>>,
    ) {
        self.take_handed(&mut registry);
        for one in own {
            self.place(&mut registry, one);
        }
        self.send_parcels(&mut registry);
        drop(registry);
        fence(Ordering::SeqCst);
        if !self.shared.handoff.is_empty() {
            self.deliver_handed();
        }
    }

    /// Publishes `events`, in order, as [`EventBus::publish`] would one by
    /// one, and leaves `events` empty with its allocation kept: their
    /// numbers are drawn in one step, so they are consecutive, and an
    /// uncontended publisher delivers them in one hold of the registry
    /// (one parcel a subscriber). Returns the last one's number, or `None`
    /// if there were none or the bus is closed. For what one poll of a
    /// stage execution emits: a dozen publishes a fan-out sibling, each
    /// drawing from the one counter every thread writes.
    pub fn publish_all(&self, events: &mut Vec<E>) -> Option<u64> {
        let n = events.len() as u64;
        if n <= 1 {
            return events.pop().and_then(|event| self.publish(event));
        }
        let shared = &*self.shared;
        let first = shared.next.fetch_add(n, Ordering::SeqCst);
        if first & CLOSED != 0 {
            events.clear();
            return None;
        }
        let handed = Published::batch(events)
            .zip(first..)
            .map(|(event, seq)| Handed {
                seq,
                class: event.class(),
                event,
            });
        match self.try_deliver() {
            None => {
                // Delivering every so often, as each publish does after
                // its one hand-off: a batch larger than the room left in
                // this thread's shard would otherwise wait for room no one
                // makes once the holder has let go.
                for (i, one) in handed.enumerate() {
                    shared.handoff.send(one);
                    if (i + 1) % PARCEL == 0 {
                        self.deliver_handed();
                    }
                }
                self.deliver_handed();
            }
            Some(registry) => self.deliver_own(registry, handed),
        }
        Some(first + n - 1)
    }

    /// Closes the bus: later publishes are ignored and every subscription ends
    /// once its queued items are drained. Waits for the publishes in
    /// progress: every event that drew its number before is delivered.
    pub fn close(&self) {
        let drawn = self.shared.next.fetch_or(CLOSED, Ordering::SeqCst);
        if drawn & CLOSED != 0 {
            // Another close set the bit (and the draws refused since have
            // moved the counter on): wait for it to finish, without
            // holding the registry it needs.
            loop {
                if self.lock().closed {
                    return;
                }
                std::thread::yield_now();
            }
        }
        let before = drawn;
        let mut registry = self.lock();
        loop {
            self.take_handed(&mut registry);
            if registry.next_seq >= before {
                break;
            }
            // A publisher drew a number and has not handed its event off
            // yet: it is between two instructions.
            std::thread::yield_now();
        }
        self.send_parcels(&mut registry);
        registry.closed = true;
        registry.subscribers.clear();
        registry.early.clear();
        self.shared.observers.store(0, Ordering::Relaxed);
    }

    /// Whether `self` and `other` are handles on the same bus.
    #[must_use]
    pub fn same(&self, other: &EventBus<E>) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether any live subscriber receives observer events. Publishers of
    /// observer events (progress, phase markers) check this first and skip
    /// building events no one would see. A subscriber that was dropped counts
    /// until a delivery prunes it, so this errs on the side of `true`.
    #[must_use]
    pub fn has_observers(&self) -> bool {
        self.shared.observers.load(Ordering::Relaxed) > 0
    }

    /// The sequence number of the last event published, 0 before the
    /// first. A publish has its number when it returns, so a caller on the
    /// publishing thread can place what it does between two events. On a
    /// closed bus it is the last event delivered: publishes refused after
    /// the close move the counter but publish nothing.
    #[must_use]
    pub fn last_seq(&self) -> u64 {
        let next = self.shared.next.load(Ordering::SeqCst);
        if next & CLOSED == 0 {
            return next - 1;
        }
        // Closing: once done, every number drawn before it is delivered,
        // so the last delivered is the last published.
        loop {
            let registry = self.lock();
            if registry.closed {
                return registry.next_seq - 1;
            }
            drop(registry);
            std::thread::yield_now();
        }
    }

    /// Whether [`EventBus::close`] was called.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.shared.next.load(Ordering::SeqCst) & CLOSED != 0
    }

    /// Number of live subscribers (dropped ones are pruned when an event
    /// is delivered).
    #[must_use]
    pub fn subscriber_count(&self) -> usize {
        self.with_registry(|registry| registry.subscribers.len())
    }
}

impl<E: BusEvent> EventBus<E> {
    /// Total observer events dropped across all subscribers since creation.
    #[must_use]
    pub fn lagged_total(&self) -> u64 {
        self.shared.lagged_total.load(Ordering::Relaxed)
    }

    /// Delivers what is handed off, unless another holder of the registry
    /// is at it. The recheck after letting go closes the gap in which a
    /// publisher hands an event off, finds the registry held and returns,
    /// while the holder has already looked at the queue.
    fn deliver_handed(&self) {
        loop {
            // Pairs with the fence after a holder lets go: either this
            // publisher sees the registry free, or that holder sees the
            // event in the queue.
            fence(Ordering::SeqCst);
            let Some(mut registry) = self.try_deliver() else {
                return;
            };
            self.take_handed(&mut registry);
            self.send_parcels(&mut registry);
            drop(registry);
            fence(Ordering::SeqCst);
            if self.shared.handoff.is_empty() {
                return;
            }
        }
    }

    /// Takes everything handed off and delivers, in `seq` order, every
    /// event whose turn has come.
    fn take_handed(&self, registry: &mut Registry<E>) {
        let mut taken = 0;
        self.shared.handoff.drain(|handed| {
            self.place(registry, handed);
            taken += 1;
            // Under steady contention a hold can go on for long: a
            // subscriber that gets few of the events (audit-only among
            // token streams) is not kept waiting for its end.
            if taken % PARCEL == 0 {
                self.send_parcels(registry);
            }
        });
        // What a preempted publisher held back is not kept allocated.
        if registry.early.is_empty() && registry.early.capacity() > EARLY_KEPT {
            registry.early.shrink_to(EARLY_KEPT);
        }
    }

    /// Delivers `handed` if its turn has come, and then every event held
    /// back behind it; otherwise holds it back.
    fn place(&self, registry: &mut Registry<E>, handed: Handed<E>) {
        if handed.seq == registry.next_seq && registry.early.is_empty() {
            // In order, as nearly every event arrives.
            self.deliver_next(registry, handed);
            return;
        }
        // Numbers are drawn once each and handed off once each, and
        // `next_seq` passes only numbers that were taken: a number below
        // it cannot arrive.
        debug_assert!(handed.seq >= registry.next_seq, "seq {} twice", handed.seq);
        let Some(at) = handed.seq.checked_sub(registry.next_seq) else {
            return;
        };
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        if at >= registry.early.len() {
            registry.early.resize_with(at + 1, || None);
        }
        registry.early[at] = Some(handed);
        while registry.early.front().is_some_and(Option::is_some) {
            if let Some(Some(next)) = registry.early.pop_front() {
                self.deliver_next(registry, next);
            }
        }
    }

    /// Delivers the event whose turn it is to every subscriber's parcel,
    /// sending a parcel that is full. The last subscriber that takes it is
    /// given the publisher's reference rather than a copy of it: with one
    /// subscriber (the audit log) the deliverer then never touches the
    /// event's reference count, a cache line the publisher's core wrote
    /// last.
    fn deliver_next(&self, registry: &mut Registry<E>, next: Handed<E>) {
        let shared = &*self.shared;
        registry.next_seq += 1;
        // Subscribers still to take it: the last one gets `event` itself.
        let mut left = registry
            .subscribers
            .iter()
            .filter(|sub| sub.takes(next.seq, next.class))
            .count();
        let mut event = Some(next.event);
        registry.subscribers.retain_mut(|sub| {
            if !sub.takes(next.seq, next.class) {
                return true;
            }
            left -= 1;
            let own = if left == 0 {
                event.take()
            } else {
                event.clone()
            };
            let Some(own) = own else {
                return true;
            };
            let envelope = Envelope {
                seq: next.seq,
                event: own,
            };
            sub.outgoing.push((envelope, next.class));
            if sub.outgoing.len() < PARCEL {
                return true;
            }
            let live = send_parcel(sub, &shared.lagged_total);
            if !live && sub.interest == Interest::All {
                shared.observers.fetch_sub(1, Ordering::Relaxed);
            }
            live
        });
    }

    /// Sends every subscriber what it was delivered in this hold of the
    /// registry; called before the registry is let go.
    fn send_parcels(&self, registry: &mut Registry<E>) {
        let shared = &*self.shared;
        registry.subscribers.retain_mut(|sub| {
            let live = send_parcel(sub, &shared.lagged_total);
            if !live && sub.interest == Interest::All {
                shared.observers.fetch_sub(1, Ordering::Relaxed);
            }
            live
        });
    }

    /// The registry, if no one else holds it, with the `delivering` mark
    /// set for as long as it is held.
    fn try_deliver(&self) -> Option<Deliverer<'_, E>> {
        let shared = &*self.shared;
        if shared.delivering.load(Ordering::Relaxed) {
            return None;
        }
        let guard = match shared.registry.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        shared.delivering.store(true, Ordering::Relaxed);
        Some(Deliverer {
            guard,
            mark: &shared.delivering,
        })
    }

    /// Runs `f` on the registry once everything handed off so far is
    /// delivered, then delivers what was handed off meanwhile.
    fn with_registry<T>(&self, f: impl FnOnce(&mut Registry<E>) -> T) -> T {
        let mut registry = self.lock();
        self.take_handed(&mut registry);
        self.send_parcels(&mut registry);
        let out = f(&mut registry);
        drop(registry);
        self.deliver_handed();
        out
    }

    fn lock(&self) -> MutexGuard<'_, Registry<E>> {
        // The registry is never left half-updated: no code path panics while
        // holding the lock, so a poisoned lock still guards consistent data.
        self.shared
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

mod handoff;
mod published;
mod queue;

use handoff::{Handoff, Padded};

pub use published::Published;
use queue::{Interest, Subscriber, send_parcel};
pub use queue::{IntoIter, Iter, Subscription};

#[cfg(test)]
mod tests;
