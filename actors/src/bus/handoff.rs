//! The hand-off queue, in shards: where a publisher that finds another
//! deliverer at work leaves its event. Each publishing thread keeps to
//! one shard (a bus numbers the threads in the order they first hand off
//! to it, so up to sixteen get shards of their own), so the
//! arbiters of a wide run do not all write the one queue's tail: on 16
//! cores the single queue's `send`, spinning on that tail, was the
//! busiest function of the arbiters' threads. The deliverer takes from
//! every shard and puts the events back in `seq` order as before (the
//! bus's `early` list): an event's place in the log is its number, not
//! the shard it came through. While one thread's shard is backed up,
//! the events drawn after its first one wait in that list, so it can hold
//! as many as the shards together (it is let go to a small size once
//! empty).
//!
//! A shard is made when a thread first sends to it: crossbeam writes
//! every place of a bounded queue when it makes one, and a bus made and
//! dropped unused (a run's specification builds one, a worker's task run
//! and a resume each replace it) paid for all sixteen.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use crossbeam_channel::{Receiver, Sender};

/// The fewest places a shard has: room for one arbiter's share of a
/// fail-fast burst even when a run uses two threads on a machine of many
/// cores (5 000 `StageCancelled` each for 10 000 siblings in flight); a
/// full shard makes its publisher wait, and the deliverer then wakes it
/// for every event it takes (the tenth round's 40 ms cancellations). A
/// shard takes 768 KiB (48 bytes a place: a `Handed`, 40, and crossbeam's
/// stamp) once a thread hands off to it: a run on 16 threads makes up to
/// all 16, 12 MiB.
const SHARD_MIN: usize = 16_384;

/// The most shards a queue is cut into.
const SHARDS_MAX: usize = 16;

/// How many items the deliverer takes from one shard before it looks at
/// the next: a shard its publisher keeps filling does not hold back the
/// lower numbers waiting in the others.
const TAKE_RUN: usize = 256;

thread_local! {
    /// The hand-off queue this thread last sent to (its address) and the
    /// shard it got there. A thread sends to one bus, its run's, nearly
    /// always; one that moves between buses gets a new number at each
    /// move, which costs a shard's sharing, never an event.
    static LAST: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// One shard per core (at most [`SHARDS_MAX`]): what a bus gets where its
/// constructor is not told.
pub(super) fn shards_here() -> usize {
    // Asked once: it reads the cgroup's files each time.
    static HERE: OnceLock<usize> = OnceLock::new();
    *HERE.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, SHARDS_MAX)
    })
}

/// A value alone on its cache line (and the next, which Intel's cores
/// fetch in pairs): a field one thread writes often does not take the
/// line from the threads that read its neighbours.
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// One shard: a bounded queue's two ends.
type Shard<T> = (Sender<T>, Receiver<T>);

pub(super) struct Handoff<T> {
    /// Each made on its first send, with `each` places.
    shards: Box<[OnceLock<Shard<T>>]>,
    each: usize,
    /// Numbers the threads that hand off here, in the order they first do.
    threads: AtomicUsize,
    /// A bit per shard that may hold items. A sender sets its shard's bit
    /// after its item is in (where it is not set already); the deliverer
    /// clears the bits before it takes from their shards. So emptiness is
    /// one load, and the deliverer looks only into the shards that were
    /// sent to: with one checked each time a publisher delivers its own
    /// event, one thread on 16 cores paid 32 empty-queue checks an event.
    marked: Padded<AtomicU64>,
}

impl<T> Handoff<T> {
    /// `total` places cut into `shards` (one to [`SHARDS_MAX`]; each at
    /// least [`SHARD_MIN`]).
    pub(super) fn new(shards: usize, total: usize) -> Handoff<T> {
        let shards = shards.clamp(1, SHARDS_MAX);
        let each = (total / shards).max(SHARD_MIN);
        Handoff {
            shards: (0..shards).map(|_| OnceLock::new()).collect(),
            each,
            threads: AtomicUsize::new(0),
            marked: Padded(AtomicU64::new(0)),
        }
    }

    /// Leaves `item` in this thread's shard, waiting while it is full.
    /// The queue holds both ends, so it cannot be disconnected.
    pub(super) fn send(&self, item: T) {
        self.send_to(self.shard_here(), item);
    }

    /// This thread's shard here. A queue dropped and another made at the
    /// same address may find the old one's number: any number is a
    /// shard, taken modulo their count.
    fn shard_here(&self) -> usize {
        let here = std::ptr::from_ref(self) as usize;
        let number = LAST.with(|last| match last.get() {
            (queue, number) if queue == here => number,
            _ => {
                let number = self.threads.fetch_add(1, Ordering::Relaxed);
                last.set((here, number));
                number
            }
        });
        number % self.shards.len()
    }

    /// [`Handoff::send`] to shard `shard` (less than the shards' count).
    pub(super) fn send_to(&self, shard: usize, item: T) {
        let (tx, _) = self.shards[shard].get_or_init(|| crossbeam_channel::bounded(self.each));
        let _ = tx.send(item);
        // The item is in before the mark is read: a deliverer that cleared
        // the mark after this read takes the item, and one that cleared it
        // before is seen here to have done so.
        fence(Ordering::SeqCst);
        let bit = 1 << shard;
        if self.marked.load(Ordering::SeqCst) & bit == 0 {
            self.marked.fetch_or(bit, Ordering::SeqCst);
        }
    }

    /// Takes every item left so far, handing each to `take`: passes over
    /// the marked shards until the mark is clear. Within a pass the
    /// shards give an item each in turn, so that events published at
    /// about the same time from different threads come out nearly in
    /// `seq` order (taken a shard at a time, most waited in the
    /// deliverer's `early` list for the other shards' numbers). A shard
    /// gives at most [`TAKE_RUN`] items a pass, and is marked again if it
    /// has more.
    pub(super) fn drain(&self, mut take: impl FnMut(T)) {
        while self.marked.load(Ordering::SeqCst) != 0 {
            let marked = self.marked.swap(0, Ordering::SeqCst);
            // Pairs with the sender's: an item whose sender read its bit
            // set before this swap is in its shard for the reads below.
            fence(Ordering::SeqCst);
            // The marked shards, as (bit, queue), kept on the stack: a
            // drain runs in every publish that finds something handed off.
            let mut open: [Option<(u64, &Receiver<T>)>; SHARDS_MAX] = [None; SHARDS_MAX];
            let mut count = 0;
            for (shard, made) in self.shards.iter().enumerate() {
                let bit = 1 << shard;
                // A shard is marked only after a send, which made it.
                if let Some((_, rx)) = made.get().filter(|_| marked & bit != 0) {
                    open[count] = Some((bit, rx));
                    count += 1;
                }
            }
            for _ in 0..TAKE_RUN {
                let mut kept = 0;
                for at in 0..count {
                    let Some((bit, rx)) = open[at] else {
                        continue;
                    };
                    if let Ok(item) = rx.try_recv() {
                        take(item);
                        open[kept] = Some((bit, rx));
                        kept += 1;
                    }
                }
                count = kept;
                if count == 0 {
                    break;
                }
            }
            // Shards still giving after their run: looked at again.
            for (bit, _) in open[..count].iter().flatten() {
                self.marked.fetch_or(*bit, Ordering::SeqCst);
            }
        }
    }

    /// Items waiting in the shards made so far.
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.shards
            .iter()
            .filter_map(|made| made.get().map(|(_, rx)| rx.len()))
            .sum()
    }

    /// The places a shard has.
    #[cfg(test)]
    pub(super) fn shard_places(&self) -> usize {
        self.each
    }

    /// Whether no shard is marked: every item sent before a deliverer's
    /// last [`Handoff::drain`] began was taken by it, and every one sent
    /// after has marked its shard (or is being sent, and its sender will).
    pub(super) fn is_empty(&self) -> bool {
        self.marked.load(Ordering::SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    #[test]
    fn threads_get_shards_of_their_own_in_the_order_they_first_send() {
        let queue = Arc::new(Handoff::<usize>::new(4, 4 * SHARD_MIN));
        for round in 0..2 {
            // One at a time, so the order of their first sends is known;
            // the second round's threads are new ones, numbered on.
            for t in 0..4 {
                let queue = Arc::clone(&queue);
                std::thread::spawn(move || {
                    queue.send(t);
                    queue.send(t);
                })
                .join()
                .unwrap();
            }
            let mut by_shard = Vec::new();
            for made in &*queue.shards {
                let (_, rx) = made.get().expect("every shard was sent to");
                by_shard.push(rx.try_iter().collect::<Vec<_>>());
            }
            assert_eq!(by_shard, [[0, 0], [1, 1], [2, 2], [3, 3]], "round {round}");
            queue.drain(|item| panic!("item {item} left"));
        }
    }

    #[test]
    fn a_drain_takes_an_item_from_each_shard_in_turn() {
        let queue = Handoff::<u32>::new(3, 3 * SHARD_MIN);
        // Two threads' numbers, interleaved as they drew them; shard 2
        // never sent to.
        for n in [1, 3, 5, 7] {
            queue.send_to(0, n);
        }
        for n in [2, 4, 6] {
            queue.send_to(1, n);
        }
        let mut taken = Vec::new();
        queue.drain(|n| taken.push(n));
        assert_eq!(taken, [1, 2, 3, 4, 5, 6, 7]);
        assert!(queue.is_empty());
        // A shard with more than a run's worth is looked at again.
        for n in 0..u32::try_from(TAKE_RUN).unwrap() + 3 {
            queue.send_to(2, n);
        }
        let mut taken = 0;
        queue.drain(|_| taken += 1);
        assert_eq!(taken, TAKE_RUN + 3);
        assert!(queue.is_empty());
    }

    #[test]
    fn every_item_from_every_thread_is_taken_once() {
        const THREADS: usize = 6;
        const EACH: usize = 20_000;
        // Fewer shards than threads, and shards smaller than what each
        // thread sends: threads share shards and wait for room.
        let queue = Arc::new(Handoff::<usize>::new(4, 4 * SHARD_MIN));
        let start = Arc::new(Barrier::new(THREADS + 1));
        let senders: Vec<_> = (0..THREADS)
            .map(|t| {
                let queue = Arc::clone(&queue);
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    for n in 0..EACH {
                        queue.send(t * EACH + n);
                    }
                })
            })
            .collect();
        start.wait();
        let mut seen = vec![0u8; THREADS * EACH];
        let mut last_of = [None::<usize>; THREADS];
        let mut count = 0;
        while count < THREADS * EACH {
            queue.drain(|item| {
                seen[item] += 1;
                count += 1;
                // One thread's items come out in the order it sent them.
                let (t, n) = (item / EACH, item % EACH);
                assert!(
                    last_of[t].is_none_or(|last| last < n),
                    "thread {t} out of order"
                );
                last_of[t] = Some(n);
            });
        }
        for sender in senders {
            sender.join().unwrap();
        }
        // A sender may mark its shard after its last item was taken: one
        // more drain clears that mark and finds nothing.
        queue.drain(|item| panic!("item {item} left after all were taken"));
        assert!(queue.is_empty());
        assert!(seen.iter().all(|&n| n == 1), "an item taken twice or never");
    }
}
