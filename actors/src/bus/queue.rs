//! A subscriber's queue, both ends: what the bus keeps of a subscriber
//! (its sending end, its lag count, the deliveries of the current hold)
//! and how they are sent, as a parcel or event by event; and the
//! [`Subscription`] that receives them and unpacks the parcels. The rules
//! (which events wait, which are dropped, the parcels' bound) are in the
//! bus's module documentation.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};

use super::{Delivery, Envelope, EventClass};

/// Which events a subscriber receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interest {
    All,
    AuditOnly,
}

/// Counters a subscriber shares with the bus.
#[derive(Debug, Default)]
pub(super) struct SubscriberStats {
    pub(super) dropped_total: AtomicU64,
    /// Deliveries in parcels of several that are queued and not yet
    /// taken: the deliverer adds a parcel's before sending it, the
    /// subscription takes them off when it receives it.
    pub(super) parcelled: AtomicUsize,
}

/// What a subscriber's queue carries: one delivery, or several a deliverer
/// made in a row (never fewer than two).
pub(super) enum Parcel<E> {
    One(Delivery<E>),
    Many(Vec<Delivery<E>>),
}

/// A subscriber as the bus keeps it: the sending end of its queue, and
/// what it was delivered and not yet sent.
pub(super) struct Subscriber<E> {
    pub(super) name: String,
    pub(super) interest: Interest,
    /// The first `seq` it receives: the number the next publish would
    /// have drawn when it subscribed.
    pub(super) from: u64,
    pub(super) sender: Sender<Parcel<E>>,
    /// The queue's capacity, in events.
    pub(super) capacity: usize,
    /// Dropped since the last successful delivery; reported as `Lagged`.
    pub(super) pending_dropped: u64,
    /// The seq of the last of those.
    pub(super) pending_last_seq: u64,
    pub(super) stats: Arc<SubscriberStats>,
    /// What the holder of the registry delivered to it and has not sent
    /// yet: sent as one parcel when it fills or the holder lets go.
    pub(super) outgoing: Vec<(Envelope<E>, EventClass)>,
}

impl<E> Subscriber<E> {
    /// Whether the event numbered `seq` is one this subscriber receives.
    pub(super) fn takes(&self, seq: u64, class: EventClass) -> bool {
        seq >= self.from && (class == EventClass::Audit || self.interest == Interest::All)
    }
}

/// A new queue of `capacity` events (at least one): the bus's end, which
/// receives from `from` on once set, and the subscriber's.
pub(super) fn pair<E>(
    name: &str,
    capacity: usize,
    interest: Interest,
) -> (Subscriber<E>, Subscription<E>) {
    let capacity = capacity.max(1);
    let (sender, receiver) = crossbeam_channel::bounded(capacity);
    let stats = Arc::new(SubscriberStats::default());
    let subscriber = Subscriber {
        name: name.to_owned(),
        interest,
        from: 0,
        sender,
        capacity,
        pending_dropped: 0,
        pending_last_seq: 0,
        stats: Arc::clone(&stats),
        outgoing: Vec::new(),
    };
    let subscription = Subscription {
        name: name.to_owned(),
        receiver,
        stats,
        unpacked: RefCell::new(Vec::new().into_iter()),
    };
    (subscriber, subscription)
}

/// Sends `sub` what it was delivered in this hold: as one parcel while it
/// keeps up, else event by event. Returns `false` if it disconnected.
pub(super) fn send_parcel<E>(sub: &mut Subscriber<E>, lagged_total: &AtomicU64) -> bool {
    let n = sub.outgoing.len();
    if n == 0 {
        return true;
    }
    let parcelled = sub.stats.parcelled.load(Ordering::Relaxed);
    if n == 1 || parcelled + n > sub.capacity {
        let mut outgoing = std::mem::take(&mut sub.outgoing);
        let mut live = true;
        for (envelope, class) in outgoing.drain(..) {
            // Once disconnected, the rest is dropped with the subscriber.
            live = live && deliver(sub, envelope, class, lagged_total);
        }
        sub.outgoing = outgoing;
        return live;
    }
    let audit = sub.outgoing.iter().any(|(_, c)| *c == EventClass::Audit);
    let last_seq = sub.outgoing[n - 1].0.seq;
    let lag = sub.pending_dropped;
    let mut parcel = Vec::with_capacity(n + usize::from(lag > 0));
    if lag > 0 {
        parcel.push(Delivery::Lagged {
            dropped: lag,
            last_seq: sub.pending_last_seq,
        });
    }
    parcel.extend(sub.outgoing.drain(..).map(|(e, _)| Delivery::Event(e)));
    let size = parcel.len();
    sub.stats.parcelled.fetch_add(size, Ordering::Relaxed);
    let sent = if audit {
        // An audit event is never dropped: wait for room.
        sub.sender
            .send(Parcel::Many(parcel))
            .map_err(|_| TrySendError::Disconnected(()))
    } else {
        sub.sender
            .try_send(Parcel::Many(parcel))
            .map_err(|e| match e {
                TrySendError::Full(_) => TrySendError::Full(()),
                TrySendError::Disconnected(_) => TrySendError::Disconnected(()),
            })
    };
    if sent.is_err() {
        sub.stats.parcelled.fetch_sub(size, Ordering::Relaxed);
    }
    match sent {
        Ok(()) => {
            sub.pending_dropped = 0;
            true
        }
        Err(TrySendError::Full(())) => {
            // Observer events only, and no room: every one of them dropped.
            record_drops(sub, n as u64, last_seq, lagged_total);
            true
        }
        Err(TrySendError::Disconnected(())) => false,
    }
}

/// Delivers one event to one subscriber; returns `false` if it disconnected.
fn deliver<E>(
    sub: &mut Subscriber<E>,
    envelope: Envelope<E>,
    class: EventClass,
    lagged_total: &AtomicU64,
) -> bool {
    let seq = envelope.seq;
    let item = Parcel::One(Delivery::Event(envelope));
    match class {
        EventClass::Audit => {
            if sub.pending_dropped > 0 {
                let lagged = Delivery::Lagged {
                    dropped: sub.pending_dropped,
                    last_seq: sub.pending_last_seq,
                };
                if sub.sender.send(Parcel::One(lagged)).is_err() {
                    return false;
                }
                sub.pending_dropped = 0;
            }
            sub.sender.send(item).is_ok()
        }
        EventClass::Observer => {
            if sub.pending_dropped > 0 {
                let lagged = Delivery::Lagged {
                    dropped: sub.pending_dropped,
                    last_seq: sub.pending_last_seq,
                };
                match sub.sender.try_send(Parcel::One(lagged)) {
                    Ok(()) => sub.pending_dropped = 0,
                    Err(TrySendError::Full(_)) => {
                        record_drops(sub, 1, seq, lagged_total);
                        return true;
                    }
                    Err(TrySendError::Disconnected(_)) => return false,
                }
            }
            match sub.sender.try_send(item) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    record_drops(sub, 1, seq, lagged_total);
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        }
    }
}

/// Counts `n` observer events dropped for `sub`, the last numbered `seq`.
fn record_drops<E>(sub: &mut Subscriber<E>, n: u64, seq: u64, lagged_total: &AtomicU64) {
    sub.pending_dropped += n;
    sub.pending_last_seq = seq;
    sub.stats.dropped_total.fetch_add(n, Ordering::Relaxed);
    lagged_total.fetch_add(n, Ordering::Relaxed);
}

/// The receiving end of one subscriber. Dropping it unsubscribes. It
/// unpacks the parcels its queue carries and hands out one delivery at a
/// time; it is read by one thread (it is `Send`, not `Sync`).
pub struct Subscription<E> {
    pub(super) name: String,
    pub(super) receiver: Receiver<Parcel<E>>,
    pub(super) stats: Arc<SubscriberStats>,
    /// The rest of the last parcel taken.
    unpacked: RefCell<std::vec::IntoIter<Delivery<E>>>,
}

impl<E> fmt::Debug for Subscription<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.name)
            .field("queued_parcels", &self.receiver.len())
            .field("dropped_total", &self.dropped_total())
            .finish()
    }
}

impl<E> Subscription<E> {
    /// The name given at subscription.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for the next item; `None` once the bus is closed or dropped and
    /// the queue is drained.
    #[must_use]
    pub fn recv(&self) -> Option<Delivery<E>> {
        self.next_with(|rx| rx.recv().map_err(|_| RecvTimeoutError::Disconnected))
            .ok()
    }

    /// The next item if one is queued now.
    #[must_use]
    pub fn try_recv(&self) -> Option<Delivery<E>> {
        self.poll().ok()
    }

    /// The next item if one is queued now; `Disconnected` once the bus is
    /// closed or dropped and the queue is drained.
    pub fn poll(&self) -> Result<Delivery<E>, TryRecvError> {
        self.next_with(|rx| {
            rx.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            })
        })
        .map_err(|e| match e {
            RecvTimeoutError::Timeout => TryRecvError::Empty,
            RecvTimeoutError::Disconnected => TryRecvError::Disconnected,
        })
    }

    /// Waits for the next item until `deadline`.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<Delivery<E>, RecvTimeoutError> {
        self.next_with(|rx| rx.recv_deadline(deadline))
    }

    /// Waits for the next item for at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery<E>, RecvTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.recv_deadline(deadline),
            None => self.next_with(|rx| rx.recv().map_err(|_| RecvTimeoutError::Disconnected)),
        }
    }

    /// The next delivery: the rest of the last parcel first, then parcels
    /// taken with `take`.
    fn next_with(
        &self,
        mut take: impl FnMut(&Receiver<Parcel<E>>) -> Result<Parcel<E>, RecvTimeoutError>,
    ) -> Result<Delivery<E>, RecvTimeoutError> {
        let mut unpacked = self.unpacked.borrow_mut();
        loop {
            if let Some(delivery) = unpacked.next() {
                return Ok(delivery);
            }
            match take(&self.receiver)? {
                Parcel::One(delivery) => return Ok(delivery),
                Parcel::Many(deliveries) => {
                    self.stats
                        .parcelled
                        .fetch_sub(deliveries.len(), Ordering::Relaxed);
                    *unpacked = deliveries.into_iter();
                }
            }
        }
    }

    /// Blocking iterator that ends when the bus is closed or dropped.
    pub fn iter(&self) -> Iter<'_, E> {
        Iter { sub: self }
    }

    /// Observer events dropped for this subscriber since it subscribed.
    #[must_use]
    pub fn dropped_total(&self) -> u64 {
        self.stats.dropped_total.load(Ordering::Relaxed)
    }
}

/// [`Subscription::iter`]: deliveries until the bus is closed or dropped.
#[derive(Debug)]
pub struct Iter<'a, E> {
    sub: &'a Subscription<E>,
}

impl<E> Iterator for Iter<'_, E> {
    type Item = Delivery<E>;

    fn next(&mut self) -> Option<Delivery<E>> {
        self.sub.recv()
    }
}

/// A [`Subscription`] taken by value as an iterator.
#[derive(Debug)]
pub struct IntoIter<E> {
    sub: Subscription<E>,
}

impl<E> Iterator for IntoIter<E> {
    type Item = Delivery<E>;

    fn next(&mut self) -> Option<Delivery<E>> {
        self.sub.recv()
    }
}

impl<E> IntoIterator for Subscription<E> {
    type Item = Delivery<E>;
    type IntoIter = IntoIter<E>;

    fn into_iter(self) -> IntoIter<E> {
        IntoIter { sub: self }
    }
}

impl<'a, E> IntoIterator for &'a Subscription<E> {
    type Item = Delivery<E>;
    type IntoIter = Iter<'a, E>;

    fn into_iter(self) -> Iter<'a, E> {
        self.iter()
    }
}
