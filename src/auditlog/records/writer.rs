//! Writing events as records (see the parent module for the format): the
//! audit writer's, numbering strings within a batch, and a relay's, for
//! one execution.

use super::*;

/// Places in the audit writer's cache of recent strings: 2^10, room for
/// the ids of a cap of 256 running siblings beside the names and keys.
const CACHE_BITS: u32 = 10;

/// Places in a relay's cache ([`RecordWriter::for_one_execution`]): one
/// execution's events name a few dozen strings.
const SMALL_CACHE_BITS: u32 = 6;

/// Writes events as records, numbering strings within a batch.
pub struct RecordWriter {
    /// Strings defined in this batch by `(address, length)`.
    strings: HashMap<(usize, usize), u64, foldhash::fast::RandomState>,
    /// `(address, length, number + 1)` of strings looked up lately, by
    /// address: the event names, keys, run id and current execution ids
    /// a batch repeats are found here without hashing (0: empty).
    recent: Box<[(usize, usize, u64)]>,
    /// `recent` holds 2^`cache_bits` places.
    cache_bits: u32,
    /// Shared strings numbered in this batch, held so that no other
    /// string is made at their address before the batch ends.
    held: Vec<Arc<str>>,
    /// The last run, stage and tool an event head named, by content
    /// ([`Same`]).
    same: [Same; 3],
    seq: u64,
    micros: u64,
    /// A JSON value's text before its length is known.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for RecordWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("strings", &self.strings.len())
            .finish_non_exhaustive()
    }
}

/// The head of an event record: [`Head`] with the strings as the writer
/// numbers them.
#[derive(Debug, Clone, Copy)]
pub struct EventHead<'a> {
    pub seq: u64,
    pub micros: u64,
    pub name: &'static str,
    pub run: &'a Arc<str>,
    pub exec: Option<&'a Arc<str>>,
    pub stage: Option<&'a Arc<str>>,
    pub tool: Option<&'a Arc<str>>,
    pub fields: usize,
}

impl Default for RecordWriter {
    fn default() -> RecordWriter {
        RecordWriter::with_cache_bits(CACHE_BITS)
    }
}

impl RecordWriter {
    pub fn new() -> RecordWriter {
        RecordWriter::default()
    }

    /// A writer for one execution's events, as a worker relays them
    /// ([`scan`]): a small cache, since one execution names few strings
    /// and a worker keeps a writer for each execution in flight.
    pub fn for_one_execution() -> RecordWriter {
        RecordWriter::with_cache_bits(SMALL_CACHE_BITS)
    }

    fn with_cache_bits(cache_bits: u32) -> RecordWriter {
        RecordWriter {
            // As many as the cache has places: grown from nothing, an
            // execution's map was rehashed four times.
            strings: HashMap::with_capacity_and_hasher(1 << cache_bits, Default::default()),
            recent: vec![(0, 0, 0); 1 << cache_bits].into_boxed_slice(),
            cache_bits,
            held: Vec::new(),
            same: Default::default(),
            seq: 0,
            micros: 0,
            scratch: Vec::new(),
        }
    }

    /// Starts a batch: writes `RESET` and forgets what the last batch
    /// numbered.
    pub fn begin(&mut self, out: &mut Vec<u8>) {
        self.strings.clear();
        self.recent.fill((0, 0, 0));
        self.held.clear();
        for same in &mut self.same {
            same.number = 0;
        }
        self.seq = 0;
        self.micros = 0;
        out.push(RESET);
    }

    /// An event's head; its `fields` follow, each with one of the
    /// `field_*` calls (or [`RecordWriter::members`]).
    pub fn event(&mut self, out: &mut Vec<u8>, head: &EventHead<'_>) {
        out.push(EVENT);
        write_varint(out, zigzag(head.seq.wrapping_sub(self.seq)));
        write_varint(out, zigzag(head.micros.wrapping_sub(self.micros)));
        self.seq = head.seq;
        self.micros = head.micros;
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let flags = flag(head.exec.is_some(), HAS_EXEC)
            | flag(head.stage.is_some(), HAS_STAGE)
            | flag(head.tool.is_some(), HAS_TOOL);
        out.push(flags);
        self.static_ref(out, head.name);
        self.same_ref(out, RUN, head.run);
        if let Some(exec) = head.exec {
            self.shared_ref(out, exec);
        }
        if let Some(stage) = head.stage {
            self.same_ref(out, STAGE, stage);
        }
        if let Some(tool) = head.tool {
            self.same_ref(out, TOOL, tool);
        }
        write_varint(out, head.fields as u64);
    }

    /// A whole JSON line (`line` writes it, without its newline, which it
    /// must not contain: JSON written compactly has none).
    pub fn line(&mut self, out: &mut Vec<u8>, line: impl FnOnce(&mut Vec<u8>)) {
        out.push(LINE);
        self.text(out, line);
    }

    pub fn field_static(&mut self, out: &mut Vec<u8>, key: &'static str, value: &'static str) {
        out.push(V_STR);
        self.static_ref(out, key);
        self.static_ref(out, value);
    }

    pub fn field_shared(&mut self, out: &mut Vec<u8>, key: &'static str, value: &Arc<str>) {
        out.push(V_STR);
        self.static_ref(out, key);
        self.shared_ref(out, value);
    }

    /// A string seen once (written in place, not numbered).
    pub fn field_text(&mut self, out: &mut Vec<u8>, key: &'static str, value: &str) {
        out.push(V_TEXT);
        self.static_ref(out, key);
        write_bytes(out, value.as_bytes());
    }

    pub fn field_u64(&mut self, out: &mut Vec<u8>, key: &'static str, value: u64) {
        out.push(V_U64);
        self.static_ref(out, key);
        write_varint(out, value);
    }

    pub fn field_bool(&mut self, out: &mut Vec<u8>, key: &'static str, value: bool) {
        out.push(if value { V_TRUE } else { V_FALSE });
        self.static_ref(out, key);
    }

    pub fn field_usage(&mut self, out: &mut Vec<u8>, key: &'static str, usage: [u64; 3]) {
        out.push(V_USAGE);
        self.static_ref(out, key);
        for n in usage {
            write_varint(out, n);
        }
    }

    /// Any other JSON value: `json` writes its compact text.
    pub fn field_json(
        &mut self,
        out: &mut Vec<u8>,
        key: &'static str,
        json: impl FnOnce(&mut Vec<u8>),
    ) {
        out.push(V_JSON);
        self.static_ref(out, key);
        self.text(out, json);
    }

    /// A relayed event's members, as they were written.
    pub fn members(&mut self, out: &mut Vec<u8>, members: &str) {
        out.push(V_MEMBERS);
        write_bytes(out, members.as_bytes());
    }

    /// Text `write` makes, after its length.
    fn text(&mut self, out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
        self.scratch.clear();
        write(&mut self.scratch);
        write_bytes(out, &self.scratch);
    }

    fn static_ref(&mut self, out: &mut Vec<u8>, s: &'static str) {
        self.reference(out, s, None);
    }

    fn shared_ref(&mut self, out: &mut Vec<u8>, s: &Arc<str>) {
        self.reference(out, s, Some(s));
    }

    /// A head's run, stage or tool (`which`): the number of the last one
    /// named there when it reads the same, without looking up where it
    /// lives. Each execution holds a copy of its own of the run's id and
    /// its stage's (see `EventIds`), and each tool call its tool's name,
    /// so by address each sibling defined all three again: a string
    /// written out, held (an atomic increment on a line another core
    /// wrote) and dropped at the batch's end, three times a sibling.
    fn same_ref(&mut self, out: &mut Vec<u8>, which: usize, s: &Arc<str>) {
        let same = &mut self.same[which];
        if same.number != 0 && same.text == s.as_bytes() {
            return write_varint(out, same.number);
        }
        let number = self.reference(out, s, Some(s));
        let same = &mut self.same[which];
        same.text.clear();
        same.text.extend_from_slice(s.as_bytes());
        same.number = number;
    }

    /// A string by its number, defined here if this batch has not yet
    /// numbered it; its reference (its number + 1). Two strings at one
    /// address with one length are the same string while it lives: a
    /// `&'static str` always does, a shared one is held until the batch
    /// ends.
    fn reference(&mut self, out: &mut Vec<u8>, s: &str, hold: Option<&Arc<str>>) -> u64 {
        let (at, len) = (s.as_ptr() as usize, s.len());
        // Fibonacci hashing: the top bits of the address times 2^64/φ.
        let place = &mut self.recent
            [((at as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.cache_bits)) as usize];
        if place.0 == at && place.1 == len && place.2 != 0 {
            write_varint(out, place.2);
            return place.2;
        }
        let next = self.strings.len() as u64;
        let number = match self.strings.entry((at, len)) {
            Entry::Occupied(n) => *n.get(),
            Entry::Vacant(slot) => {
                slot.insert(next);
                out.push(0);
                write_bytes(out, s.as_bytes());
                if let Some(shared) = hold {
                    self.held.push(Arc::clone(shared));
                }
                *place = (at, len, next + 1);
                return next + 1;
            }
        };
        *place = (at, len, number + 1);
        write_varint(out, number + 1);
        number + 1
    }
}

/// [`RecordWriter::same_ref`]'s places.
const RUN: usize = 0;
const STAGE: usize = 1;
const TOOL: usize = 2;

/// The last string a head named in one place, and its reference in this
/// batch (0: none yet). Compared by content, which an address cannot
/// stand for once the writer no longer holds the string; equal content
/// under one number is what the reader reads back either way.
#[derive(Debug, Default)]
struct Same {
    text: Vec<u8>,
    number: u64,
}
