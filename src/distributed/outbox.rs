//! A worker's reports, sent in batches. Every report a worker makes (a
//! task accepted, a sibling exited, cancelled, refused, never started)
//! goes through one outbox; what is waiting when the outbox gets to it is
//! published as one message on the run's report subject (framed, below,
//! or a JSON array), stored by JetStream once, and acknowledged once. A worker that settles 200
//! siblings at the same moment therefore makes one round trip and the
//! server stores one message, where it used to be 200 of each; a worker
//! with one report to send sends it at once (nothing waits for a batch to
//! fill). Reports of one run keep their order: the outbox publishes one
//! batch at a time and the next only after the server stored the last.
//!
//! A batch of at least [`COMPRESS_FROM`] bytes goes compressed with zstd
//! when the run's coordinator reads that (its tasks say so): an exited
//! sibling's report carries its audit events, which repeat themselves
//! (3.4 KB as JSON lines), and the server would otherwise take them in,
//! store them for the stream's week, and hand them out again. [`decode`]
//! tells the forms apart by zstd's magic number and [`FRAMED`]'s, which
//! no JSON text starts with.
//!
//! A coordinator that reads relayed records (its tasks say so) gets a
//! batch framed instead of an array: [`FRAMED`], then each report as the
//! length of its JSON, the JSON, the length of its events' records and
//! the records ([`crate::runtime::events::Relaying`]). A sibling's events
//! so travel as the log's records rather than JSON lines inside the
//! report, which the coordinator would read back character by character.

use async_nats::HeaderMap;
use tokio::sync::{mpsc, oneshot};

use std::io::Read;

use super::nats::{Nats, publish_acked};
use super::wire::{EventLine, Report, Task, line_by_line, report_subject};
use crate::auditlog::records::scan::{read_len, write_len};
use crate::runtime::events::{Event, RelayBudget};

/// The most reports in one batch.
pub const MAX_REPORTS: usize = 512;

/// The most relayed records one framed batch carries: what they make is
/// bounded on the coordinator for the whole message (`RelayBudget`, 64
/// MiB counted with what reading holds, up to about fifty times the
/// records of an execution's smallest events), and a batch this size
/// stays well inside it. An execution with more sends its events as
/// lines instead when they fit in a message (`Collected::take`).
pub const MAX_FRAMED_RECORDS: usize = 512 << 10;

/// The smallest batch sent compressed: below it (a lone `Accepted`) the
/// saving is a few bytes and the frame's own cost is not worth it.
pub const COMPRESS_FROM: usize = 1024;

/// zstd's level for report batches: its fastest standard level; level 3
/// saved another tenth of the bytes for twice the worker's time.
const LEVEL: i32 = 1;

/// The most a compressed batch may expand to. A worker compresses no
/// batch larger (a batch of several is at most half the server's message
/// limit, 64 MiB being the largest limit a server takes; a lone report
/// past this goes as it is, and the server refuses it as it did before
/// batches were compressed): more is no batch a worker made.
const MAX_EXPANDED: u64 = 64 << 20;

/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// The first bytes of a framed batch (before compression): a NUL, which
/// starts no JSON text and no zstd frame, then `trb` and the version.
pub const FRAMED: [u8; 4] = [0x00, b't', b'r', 1];

/// Hands reports to the worker's publisher task; cloned by everything
/// that reports.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Outgoing>,
    /// The server's message budget ([`Nats::message_budget`]) when the
    /// outbox started: a report alone must fit in it.
    budget: usize,
}

#[derive(Debug)]
struct Outgoing {
    run_id: String,
    /// Whether the run's coordinator reads compressed batches.
    zstd: bool,
    /// Whether it reads framed batches (and `records`).
    framed: bool,
    /// The report as JSON, encoded by whoever sent it.
    body: Vec<u8>,
    /// Its events as records, when framed (else in `body`).
    records: Vec<u8>,
    /// `true` once the server stored the batch that carried it.
    stored: oneshot::Sender<bool>,
}

impl Outbox {
    /// Starts the publisher on the current runtime; it ends when every
    /// `Outbox` is dropped. `worker` names the batches' `Nats-Msg-Id`
    /// (with a nonce of this process, so a restarted worker's batches are
    /// not taken for retries of its predecessor's).
    pub fn start(nats: Nats, worker: &str) -> Outbox {
        let (tx, rx) = mpsc::unbounded_channel();
        let prefix = format!("{worker}:{}", uuid::Uuid::now_v7().simple());
        let budget = nats.message_budget();
        actix::spawn(publish_batches(nats, rx, prefix));
        Outbox { tx, budget }
    }

    /// The most a batch of reports holds: a report larger goes alone, and
    /// the server may refuse it.
    pub fn message_budget(&self) -> usize {
        self.budget
    }

    /// Sends one report about `task`; resolves to whether the server
    /// stored it.
    pub async fn send(&self, task: &Task, report: &Report) -> bool {
        self.send_relayed(task, report, Vec::new()).await
    }

    /// [`Outbox::send`] of a report whose events travel as `records`
    /// beside it (`task.relay_records`; its `events` are then empty).
    pub async fn send_relayed(&self, task: &Task, report: &Report, records: Vec<u8>) -> bool {
        let mut body = Vec::with_capacity(report.size_hint());
        if report.write_json(&mut body).is_err() {
            return false;
        }
        let (stored, answer) = oneshot::channel();
        let outgoing = Outgoing {
            run_id: task.run_id.clone(),
            zstd: task.zstd_reports,
            framed: task.relay_records,
            body,
            records,
            stored,
        };
        if self.tx.send(outgoing).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

/// The publisher: one batch at a time, each the reports waiting for the
/// same run, in the order they were sent.
async fn publish_batches(nats: Nats, mut rx: mpsc::UnboundedReceiver<Outgoing>, prefix: String) {
    let max_bytes = nats.message_budget();
    // The report that ended the last batch (another run's, or too heavy
    // for it): the first of the next.
    let mut held: Option<Outgoing> = None;
    let mut number = 0u64;
    let mut packer = packer();
    loop {
        let first = match held.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let run_id = first.run_id.clone();
        let (zstd, framed) = (first.zstd, first.framed);
        // The batch's reports first, then its body made at its size: grown
        // report by report, copying it as it doubled was a thirtieth of a
        // worker's instructions.
        let weight = |o: &Outgoing| {
            if framed {
                // Two lengths of at most ten bytes each.
                o.body.len() + o.records.len() + 20
            } else {
                // The comma or bracket before it.
                o.body.len() + 1
            }
        };
        // The magic number, or the array's closing bracket.
        let mut size = weight(&first) + if framed { FRAMED.len() } else { 1 };
        let mut records = first.records.len();
        let mut batch = vec![first];
        while batch.len() < MAX_REPORTS {
            let Some(next) = rx.try_recv().ok() else {
                break;
            };
            // Another run's report, or one that would make the batch too
            // heavy, starts the next batch.
            if next.run_id != run_id
                || next.framed != framed
                || size + weight(&next) > max_bytes
                || records + next.records.len() > MAX_FRAMED_RECORDS
            {
                held = Some(next);
                break;
            }
            records += next.records.len();
            size += weight(&next);
            batch.push(next);
        }
        let mut body = Vec::with_capacity(size);
        let mut waiting = Vec::with_capacity(batch.len());
        if framed {
            body.extend_from_slice(&FRAMED);
        }
        for (i, report) in batch.into_iter().enumerate() {
            if framed {
                frame(&mut body, &report.body, &report.records);
            } else {
                body.push(if i == 0 { b'[' } else { b',' });
                body.extend_from_slice(&report.body);
            }
            waiting.push(report.stored);
        }
        if !framed {
            body.push(b']');
        }
        // Exact for an array; the lengths of a framed batch may be shorter.
        debug_assert!(body.len() == size || (framed && body.len() < size));
        if zstd
            && body.len() >= COMPRESS_FROM
            && body.len() as u64 <= MAX_EXPANDED
            && let Some(packer) = packer.as_mut()
            // Should compressing fail (it does not on memory it was
            // given), the batch goes as it is: the coordinator reads both.
            && let Ok(packed) = packer.compress(&body)
        {
            body = packed;
        }
        number += 1;
        // A retried publish carries the same id: the stream keeps one copy.
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{prefix}:{number}").as_str());
        let stored = publish_acked(
            &nats.js,
            report_subject(&run_id),
            headers,
            body.into(),
            None,
        )
        .await
        .is_ok();
        for tell in waiting {
            let _ = tell.send(stored);
        }
    }
}

/// One report of a framed batch: its JSON and its events' records, each
/// after its length.
fn frame(body: &mut Vec<u8>, json: &[u8], records: &[u8]) {
    write_len(body, json.len());
    body.extend_from_slice(json);
    write_len(body, records.len());
    body.extend_from_slice(records);
}

/// The batches' compressor, kept from batch to batch: zstd at [`LEVEL`],
/// each frame with a checksum, so that a damaged batch is refused whole
/// rather than read as other text. `None` if zstd cannot make one:
/// batches then go as they are.
fn packer() -> Option<zstd::bulk::Compressor<'static>> {
    let mut packer = zstd::bulk::Compressor::new(LEVEL).ok()?;
    packer
        .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
        .ok()?;
    Some(packer)
}

/// The reports in one message of a run's report subject: a batch (a JSON
/// array, or framed) from a worker, or a single report (the coordinator's
/// barrier).
/// A report that cannot be read is an error in its place, and costs only
/// itself: the others of its batch are read (a batch of 500 settled
/// siblings must not be lost to one report a newer worker worded
/// differently).
pub fn decode(payload: &[u8]) -> Vec<Result<Report, serde_json::Error>> {
    if payload.starts_with(&ZSTD_MAGIC) {
        return match expand(payload) {
            Ok(text) => decode_expanded(&text),
            Err(why) => vec![Err(serde::de::Error::custom(format!(
                "a compressed report batch cannot be read: {why}"
            )))],
        };
    }
    decode_expanded(payload)
}

fn decode_expanded(payload: &[u8]) -> Vec<Result<Report, serde_json::Error>> {
    match payload.strip_prefix(&FRAMED) {
        Some(frames) => decode_framed(frames),
        None => decode_text(payload),
    }
}

/// [`decode`] of a framed batch: each report read on its own, its events
/// from its records. A report that cannot be read costs only itself; a
/// frame that does not hold together ends the batch with an error (what
/// follows it cannot be found).
fn decode_framed(frames: &[u8]) -> Vec<Result<Report, serde_json::Error>> {
    let mut reports = Vec::new();
    // One for the whole message: what its records may make is bounded as
    // a message of JSON lines was.
    let mut budget = RelayBudget::default();
    let mut at = 0;
    let piece = |at: &mut usize| -> Option<&[u8]> {
        let len = read_len(frames, at)?;
        let piece = frames.get(*at..at.checked_add(len)?)?;
        *at += len;
        Some(piece)
    };
    while at < frames.len() {
        if reports.len() == MAX_REPORTS {
            reports.push(Err(serde::de::Error::custom(format!(
                "a framed report batch of more than {MAX_REPORTS} reports, more than a worker sends"
            ))));
            break;
        }
        let (Some(json), Some(records)) = (piece(&mut at), piece(&mut at)) else {
            reports.push(Err(serde::de::Error::custom(format!(
                "a framed report batch is cut short or damaged at byte {}",
                FRAMED.len() + at
            ))));
            break;
        };
        reports.push(framed_report(json, records, &mut budget));
    }
    reports
}

/// One framed report: its JSON, then its events from `records`. Events
/// past damage in the records read as `None`, as a line that is no event
/// does: the report and the events before are kept.
fn framed_report(
    json: &[u8],
    records: &[u8],
    budget: &mut RelayBudget,
) -> Result<Report, serde_json::Error> {
    // Its events travel as lines here when there were too many records
    // for a batch (`Collected::take`): read as a batch's report is.
    let read = match std::str::from_utf8(json) {
        Ok(text) => one(text),
        Err(_) => serde_json::from_slice::<Report>(json),
    };
    let mut report = read.or_else(|e| unreadable(json, e))?;
    if let Report::Exited {
        events,
        stage_execution_id,
        worker,
        ..
    }
    | Report::Cancelled {
        events,
        stage_execution_id,
        worker,
        ..
    } = &mut report
        && !records.is_empty()
    {
        let (read, fault) = Event::read_relayed_within(records, budget);
        let whole = read.len();
        events.extend(read.into_iter().map(EventLine::Read));
        if let Some(why) = fault {
            events.push(EventLine::Read(None));
            say!(
                "warning: the events worker {worker} relayed for {stage_execution_id} are damaged after the first {whole}, which the log keeps: {why}"
            );
        }
    }
    Ok(report)
}

/// A compressed batch's text: at most [`MAX_EXPANDED`] bytes, and the
/// frame whole and checked. A worker's frame says its size, and is
/// expanded in one call into a buffer of that size (through a stream it
/// cost twice the instructions, a fifth of the coordinator's decoding);
/// a frame that does not say it is read as a stream, up to the bound.
fn expand(payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let too_large = || {
        std::io::Error::other(format!(
            "it expands past {} MiB, more than any batch a worker makes",
            MAX_EXPANDED >> 20
        ))
    };
    match zstd::zstd_safe::get_frame_content_size(payload) {
        Ok(Some(size)) if size > MAX_EXPANDED => Err(too_large()),
        Ok(Some(size)) => {
            // At most MAX_EXPANDED, which fits any usize troupe builds for.
            let size = usize::try_from(size).map_err(|_| too_large())?;
            DECOMPRESSOR.with(|kept| {
                let mut kept = kept.borrow_mut();
                let decompressor = match kept.as_mut() {
                    Some(d) => d,
                    None => kept.insert(zstd::bulk::Decompressor::new()?),
                };
                let text = decompressor.decompress(payload, size)?;
                if text.len() == size {
                    Ok(text)
                } else {
                    Err(std::io::Error::other(format!(
                        "its frame says {size} bytes and holds {}",
                        text.len()
                    )))
                }
            })
        }
        Ok(None) => {
            let mut text = Vec::new();
            let decoder = zstd::stream::read::Decoder::new(payload)?;
            decoder.take(MAX_EXPANDED + 1).read_to_end(&mut text)?;
            if text.len() as u64 > MAX_EXPANDED {
                return Err(too_large());
            }
            Ok(text)
        }
        Err(_) => Err(std::io::Error::other("its frame header is damaged")),
    }
}

thread_local! {
    /// A decompression context per decoding thread, made on first use.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// [`decode`] of a batch's JSON text.
fn decode_text(payload: &[u8]) -> Vec<Result<Report, serde_json::Error>> {
    let batch = payload
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'[');
    if !batch {
        return vec![serde_json::from_slice(payload).or_else(|e| unreadable(payload, e))];
    }
    // The whole batch at once, as it nearly always reads; one by one only
    // when it does not. Read as text checked once: read from bytes,
    // serde_json checks each string and each event's raw member values
    // again (an eighth of the coordinator's reading).
    let whole = match std::str::from_utf8(payload) {
        Ok(text) => serde_json::from_str::<Vec<Report>>(text),
        // Bytes that are not UTF-8 may still sit in members a report
        // ignores.
        Err(_) => serde_json::from_slice::<Vec<Report>>(payload),
    };
    if let Ok(reports) = whole {
        return reports.into_iter().map(Ok).collect();
    }
    // Still whole, each event line read on its own; then report by report
    // (which needs every report valid UTF-8 on its own).
    if let Ok(reports) = line_by_line(|| serde_json::from_slice::<Vec<Report>>(payload)) {
        return reports.into_iter().map(Ok).collect();
    }
    match serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(payload) {
        Ok(items) => items
            .into_iter()
            .map(|raw| one(raw.get()).or_else(|e| unreadable(raw.get().as_bytes(), e)))
            .collect(),
        Err(e) => vec![Err(e)],
    }
}

/// One report: in one pass, or else with its event lines read one by one,
/// so that a line the one pass cannot read (no JSON object, a head value
/// that is no string, a name with a lone surrogate) costs only itself.
fn one(text: &str) -> Result<Report, serde_json::Error> {
    serde_json::from_str(text).or_else(|_| line_by_line(|| serde_json::from_str(text)))
}

/// The code of a sibling whose last report its coordinator cannot read.
pub const REPORT_UNREADABLE: &str = "Distributed/ReportUnreadable";

/// A report that could not be read (`error`), as what settles its sibling
/// when it was the sibling's last (exited, cancelled, refused) and its
/// ids can still be read: refused with [`REPORT_UNREADABLE`], so the
/// sibling fails with the reason rather than its run waiting for a report
/// that came and was skipped. Any other stays `error` (skipped: an
/// `accepted` report changes nothing the last will not).
///
/// The ids are read with every other member skipped, which serde_json
/// does without nesting: a result nested deeper than its reader allows
/// (a model's answer 125 levels deep, three more inside a report) is one
/// way to get here.
fn unreadable(json: &[u8], error: serde_json::Error) -> Result<Report, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Ids {
        kind: String,
        body: Body,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Body {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
    }
    let Ok(Ids { kind, body }) = serde_json::from_slice::<Ids>(json) else {
        return Err(error);
    };
    if !matches!(kind.as_str(), "exited" | "cancelled" | "refused") {
        return Err(error);
    }
    Ok(Report::Refused {
        stage_execution_id: body.stage_execution_id,
        turn: body.turn,
        unit: body.unit,
        worker: body.worker,
        code: REPORT_UNREADABLE.to_owned(),
        message: format!("its {kind} report could not be read by the coordinator: {error}"),
    })
}

#[cfg(test)]
mod tests;
