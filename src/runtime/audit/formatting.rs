//! Audit lines formatted and compressed on several threads, written in
//! `seq` order.
//!
//! Formatting a line is most of the audit writer's work (about 6 µs of
//! its 7 per `fanout` sibling), compressing it most of the zstd thread's
//! (about 5 µs), and both threads are one per run: on a big machine they
//! set the pace of a wide run however many arbiters there are
//! (BENCHMARKS.md, "Every core"). With formatters the writer thread only
//! takes events off its queue and hands them on in batches:
//!
//! - each batch goes to whichever formatter is free, which formats it and
//!   compresses it as a segment of its own (a closed zstd frame,
//!   [`SegmentCompressor`]);
//! - a slot for that segment goes to the compressing thread, in the order
//!   the batches were made; that thread waits on each slot in turn and
//!   writes the segment, so the log is in `seq` order whatever order the
//!   formatters finish in.
//!
//! A formatter that panics drops its slot unfilled; the compressing
//! thread reports that as a failed write from the batch's first `seq`,
//! the same way as a full disk.

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded};

use troupe_actors::Delivery;

use super::Encoder;
use super::compressing::{Compressing, Segment};
use crate::auditlog::SegmentCompressor;
use crate::runtime::events::Event;

/// Events taken into one batch at most: about 140 KB of lines. Each batch
/// is a segment compressed on its own, and a larger one finds more of
/// the repeats the lines are made of (on a `fanout` log: 1.11× one
/// stream's size at this size, 1.20× at half of it, 1.05× at twice); a
/// batch is smaller when the run is slower than this many events per
/// 5 ms.
pub(super) const BATCH_EVENTS: usize = 512;

/// The formatters a run with `threads` arbiters gets. Below four
/// threads, none: the writer formats itself, as a thread more would
/// only compete for the same cores (formatting on other threads was
/// 15–25% slower on two cores). From four on, one per four threads, at
/// least two (one formatter would only move the serial work elsewhere)
/// and at most four (which bring the writer's share of a sibling below
/// the store writer's).
pub fn formatters_for(threads: usize) -> usize {
    match threads {
        0..4 => 0,
        t => (t / 4).clamp(2, 4),
    }
}

/// The formatters a run with `threads` arbiters gets on a machine with
/// `cores` cores: [`formatters_for`] its threads, or as many as
/// [`formatters_for`] the machine's cores where the cores its arbiters and
/// its three busy threads of its own (scheduler, store writer, audit
/// writer) leave allow them. The default thread count leaves just those
/// cores (`cli::launch::threads_for`): on 16 cores, 9 arbiters and 4
/// formatters, where `formatters_for(9)` started only 2, and those two
/// were busy all through a wide run's middle (BENCHMARKS.md, "Every core,
/// tenth round").
pub fn formatters_beside(threads: usize, cores: usize) -> usize {
    let spare = cores.saturating_sub(threads + 3);
    let room = formatters_for(cores).min(spare);
    // Never a single one (see `formatters_for`).
    formatters_for(threads).max(if room < 2 { 0 } else { room })
}

/// [`formatters_beside`] this machine's cores.
pub fn formatters_here(threads: usize) -> usize {
    formatters_beside(
        threads,
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
    )
}

/// How a formatter writes one delivery's line (with its newline) or
/// record.
pub(super) type Format =
    Arc<dyn Fn(Delivery<Event>, &mut Encoder, &mut Vec<u8>) -> io::Result<()> + Send + Sync>;

/// One batch of events and where its lines go.
struct Job {
    events: Vec<Delivery<Event>>,
    segment: Sender<Segment>,
}

/// The formatter threads and the writer's side of them.
pub(super) struct Formatters {
    work: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    /// The batch being gathered and the `seq` of its first event.
    held: Vec<Delivery<Event>>,
    from: Option<u64>,
}

impl Formatters {
    /// Starts `count` formatter threads. `format` writes one delivery's
    /// line or record (`records`: each batch is records, begun by its
    /// own `RESET`); buffers for the compressed segments come from
    /// `spare` when it has one, so the compressing thread's written
    /// buffers are used again.
    pub(super) fn start(
        count: usize,
        spare: Receiver<Vec<u8>>,
        records: bool,
        format: Format,
    ) -> io::Result<Formatters> {
        let (work, jobs) = bounded::<Job>(count * 2);
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let jobs = jobs.clone();
            let spare = spare.clone();
            let format = Arc::clone(&format);
            let thread = std::thread::Builder::new()
                .name(format!("troupe-format-{i}"))
                .spawn(move || {
                    // Without a compressor the slots stay empty, and the
                    // first one reports the loss.
                    let Ok(mut compressor) = SegmentCompressor::new() else {
                        return;
                    };
                    let mut text = Vec::with_capacity(256 * 1024);
                    let mut encoder = Encoder::new(records);
                    for job in jobs {
                        let Job { events, segment } = job;
                        let made = catch_unwind(AssertUnwindSafe(|| {
                            text.clear();
                            encoder.begin(&mut text);
                            let lines = events.len() as u64;
                            for delivery in events {
                                format(delivery, &mut encoder, &mut text)?;
                            }
                            let mut frame = spare.try_recv().unwrap_or_default();
                            compressor.compress(&text, &mut frame)?;
                            io::Result::Ok(Segment { frame, lines })
                        }));
                        // A panic or an error leaves the slot empty: the
                        // compressing thread reports the loss.
                        if let Ok(Ok(made)) = made {
                            let _ = segment.send(made);
                        }
                    }
                })?;
            threads.push(thread);
        }
        Ok(Formatters {
            work: Some(work),
            threads,
            held: Vec::with_capacity(BATCH_EVENTS),
            from: None,
        })
    }

    /// Takes one event (`seq` is its place in the log); true when the
    /// batch is full and should be handed on.
    pub(super) fn push(&mut self, seq: u64, delivery: Delivery<Event>) -> bool {
        self.from.get_or_insert(seq);
        self.held.push(delivery);
        self.held.len() >= BATCH_EVENTS
    }

    /// Hands the gathered batch on: its slot to `log`, its events to a
    /// formatter. Waits while the formatters or the compressing thread
    /// are behind; an error is the compressing thread's (it stopped),
    /// with the `seq` the loss starts at.
    pub(super) fn hand_on(&mut self, log: &mut Compressing) -> io::Result<()> {
        let Some(from) = self.from.take() else {
            return Ok(());
        };
        let events = std::mem::replace(&mut self.held, Vec::with_capacity(BATCH_EVENTS));
        let segment = log.slot(from)?;
        if let Some(work) = &self.work {
            // The formatters end only when `work` is dropped, so this
            // send finds them; were it refused, the dropped slot would be
            // reported by the compressing thread as a loss from `from`.
            let _ = work.send(Job { events, segment });
        }
        Ok(())
    }
}

/// Dropping ends the formatter threads once every batch handed on is
/// formatted.
impl Drop for Formatters {
    fn drop(&mut self) {
        self.work = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::auditlog::{Frames, LogDecoder};
    use crate::runtime::events::EventName;
    use troupe_actors::{Envelope, Published};

    /// An in-memory file the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn delivery(seq: u64) -> Delivery<Event> {
        Delivery::Event(Envelope {
            seq,
            event: Published::new(Event::new(EventName::StageEntered, "run").with("visit", seq)),
        })
    }

    fn decoded(file: &Shared) -> Vec<u64> {
        let mut lines = Vec::new();
        let mut decoder = LogDecoder::compact();
        decoder
            .feed_all(&file.0.lock().unwrap(), &mut lines)
            .unwrap();
        lines
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let v: serde_json::Value = serde_json::from_slice(l).unwrap();
                v["seq"].as_u64().unwrap()
            })
            .collect()
    }

    /// Events as the audit writer writes them.
    fn plain() -> Format {
        Arc::new(|d, encoder: &mut Encoder, out: &mut Vec<u8>| {
            if let Delivery::Event(env) = d {
                match encoder {
                    Encoder::Lines => {
                        env.event.write_json(env.seq, out);
                        out.push(b'\n');
                    }
                    Encoder::Records(w) => env.event.write_record(env.seq, w, out),
                }
            }
            Ok(())
        })
    }

    /// Pushes `n` events through `count` formatters into a compressed
    /// log; the error `finish` gives, if any.
    fn run(count: usize, n: u64, format: Format, file: &Shared) -> io::Result<()> {
        let mut log = Compressing::start(Frames::create(file.clone()), 1024, count, |_| {})?;
        let mut formatters = Formatters::start(count, log.spare(), true, format)?;
        for seq in 1..=n {
            if formatters.push(seq, delivery(seq)) {
                formatters.hand_on(&mut log)?;
            }
        }
        formatters.hand_on(&mut log)?;
        drop(formatters);
        log.finish()
    }

    #[test]
    fn batches_finished_out_of_order_are_written_in_seq_order() {
        // The first batch's formatter waits until the second batch is
        // formatted, so the second is done first.
        let (second_done, first_may_go) = crossbeam_channel::bounded::<()>(1);
        let last_of_second = 2 * BATCH_EVENTS as u64;
        let inner = plain();
        let format: Format = Arc::new(move |d, encoder: &mut Encoder, out: &mut Vec<u8>| {
            let seq = match &d {
                Delivery::Event(env) => env.seq,
                Delivery::Lagged { last_seq, .. } => *last_seq,
            };
            if seq == 1 {
                first_may_go.recv().unwrap();
            }
            inner(d, encoder, out)?;
            if seq == last_of_second {
                second_done.send(()).unwrap();
            }
            Ok(())
        });
        let file = Shared::default();
        let n = 3 * BATCH_EVENTS as u64 + 17;
        run(2, n, format, &file).unwrap();
        assert_eq!(decoded(&file), (1..=n).collect::<Vec<_>>());
    }

    #[test]
    fn a_formatter_that_panics_loses_its_batch_and_says_from_which_seq() {
        let inner = plain();
        let format: Format = Arc::new(move |d, encoder: &mut Encoder, out: &mut Vec<u8>| {
            // An event of the second batch.
            if matches!(&d, Delivery::Event(env) if env.seq == BATCH_EVENTS as u64 + 44) {
                panic!("a formatting bug");
            }
            inner(d, encoder, out)
        });
        let file = Shared::default();
        let error = run(2, 4 * BATCH_EVENTS as u64, format, &file).unwrap_err();
        let lost = super::super::LostFrom::of(&error).expect("a loss");
        let second = BATCH_EVENTS as u64 + 1;
        assert_eq!(lost.seq, Some(second), "{error}");
        assert!(error.to_string().contains("formatter panicked"), "{error}");
        // The batch before it is on disk, nothing after it.
        assert_eq!(decoded(&file), (1..second).collect::<Vec<_>>());
    }

    #[test]
    fn no_formatters_below_four_threads_then_one_per_four_from_two_to_four() {
        let got: Vec<usize> = [1, 2, 3, 4, 7, 8, 12, 16, 64]
            .into_iter()
            .map(formatters_for)
            .collect();
        assert_eq!(got, [0, 0, 0, 2, 2, 2, 3, 4, 4]);
    }

    #[test]
    fn spare_cores_take_the_formatters_the_machine_would_have() {
        // The default on 16 cores: 9 arbiters and the 4 formatters that
        // `threads_for` left the cores for.
        assert_eq!(formatters_beside(9, 16), 4);
        // No cores to spare: as many as the threads would have.
        assert_eq!(formatters_beside(16, 16), 4);
        assert_eq!(formatters_beside(12, 16), 3);
        assert_eq!(formatters_beside(2, 2), 0);
        assert_eq!(formatters_beside(4, 4), 2);
        // Few threads on a big machine: the machine's share.
        assert_eq!(formatters_beside(1, 16), 4);
        // 8 cores: 4 arbiters by default, with the 2 they had before;
        // 3 arbiters leave room for those 2 as well.
        assert_eq!(formatters_beside(4, 8), 2);
        assert_eq!(formatters_beside(3, 8), 2);
        // Room for only one is room for none: one formatter would only
        // move the writer's work to another thread.
        assert_eq!(formatters_beside(3, 7), 0);
    }
}
