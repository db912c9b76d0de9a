//! Event sinks on their own threads: the JSON-lines audit log (audit events
//! only, never dropped, flushed when the bus closes) and the `--events`
//! stream (every event; observer events may be dropped under load, which is
//! reported as `SubscriberLagged`).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use troupe_actors::{Delivery, EventBus, Subscription};

use super::events::Event;

/// Queue length of the audit subscriber; publishers wait when it is full.
const AUDIT_QUEUE: usize = 65_536;
/// Queue length of the `--events` subscriber.
const STREAM_QUEUE: usize = 8_192;

/// A sink thread; `finish` waits for it to drain and flush.
#[derive(Debug)]
pub struct Sink {
    handle: JoinHandle<io::Result<u64>>,
    pub path: Option<PathBuf>,
}

impl Sink {
    /// Wraps a thread that drains a subscription.
    pub fn from_thread(handle: JoinHandle<io::Result<u64>>) -> Sink {
        Sink { handle, path: None }
    }

    /// Waits until the bus is closed and everything is written; returns the
    /// number of lines.
    pub fn finish(self) -> io::Result<u64> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("event sink thread panicked")))
    }
}

/// Starts the audit log writer at `path` (parent folders are created).
pub fn start_audit_log(bus: &EventBus<Event>, path: &Path) -> io::Result<Sink> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = File::create(path)?;
    let sub = bus.subscribe_audit("audit-log", AUDIT_QUEUE);
    let handle = std::thread::Builder::new()
        .name("troupe-audit".into())
        .spawn(move || write_lines(sub, BufWriter::with_capacity(1 << 16, file)))?;
    Ok(Sink {
        handle,
        path: Some(path.to_owned()),
    })
}

/// Streams every event as JSON lines to `out` (e.g. stdout).
pub fn start_event_stream<W: Write + Send + 'static>(
    bus: &EventBus<Event>,
    out: W,
) -> io::Result<Sink> {
    let sub = bus.subscribe("events-stream", STREAM_QUEUE);
    let handle = std::thread::Builder::new()
        .name("troupe-events".into())
        .spawn(move || write_lines(sub, BufWriter::new(out)))?;
    Ok(Sink::from_thread(handle))
}

/// The longest a written line waits in the buffer before it is flushed: a
/// burst becomes one `write` instead of one per line (the kernel's share of
/// the audit thread was a quarter of it), while a reader tailing the file —
/// or a process killed outright — misses at most this much.
const FLUSH_LINGER: Duration = Duration::from_millis(5);

fn write_lines<W: Write>(sub: Subscription<Event>, mut out: W) -> io::Result<u64> {
    let rx = sub.receiver();
    let mut lines = 0u64;
    let mut buf = Vec::with_capacity(512);
    // When the oldest line not yet flushed must be flushed by.
    let mut flush_by: Option<Instant> = None;
    loop {
        let next = match flush_by {
            Some(deadline) => rx.recv_deadline(deadline),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let delivery = match next {
            Ok(d) => d,
            Err(RecvTimeoutError::Timeout) => {
                out.flush()?;
                flush_by = None;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        buf.clear();
        match delivery {
            Delivery::Event(env) => env.event.write_json(env.seq, &mut buf)?,
            Delivery::Lagged { dropped } => serde_json::to_writer(
                &mut buf,
                &serde_json::json!({"event": "SubscriberLagged", "subscriber": sub.name(), "dropped": dropped}),
            )?,
        }
        buf.push(b'\n');
        out.write_all(&buf)?;
        lines += 1;
        match flush_by {
            // Under a steady stream the queue is never empty: flush here.
            Some(deadline) if Instant::now() >= deadline => {
                out.flush()?;
                flush_by = None;
            }
            Some(_) => {}
            None => flush_by = Some(Instant::now() + FLUSH_LINGER),
        }
    }
    out.flush()?;
    Ok(lines)
}
