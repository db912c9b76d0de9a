//! Records read back as values rather than lines: how a coordinator reads
//! the events a worker relays to it.
//!
//! A worker writes each execution's events in the log's record format
//! (one `RESET`, then the events, numbering strings as the audit writer
//! does; `seq` is the coordinator's to give and is written as 0). Read as
//! JSON lines and parsed back, those events cost the coordinator four
//! fifths of its reading of a report; read here, each string is checked
//! once per execution and handed out as the text it is, with no JSON
//! between (BENCHMARKS.md, "Every core, eighteenth round").
//!
//! [`Scan`] reads a whole piece of records (what one report carries):
//! anything cut short or wrong is a reason string, as for the log's own
//! reader. Its strings borrow from the bytes read, and are handed out
//! unchecked: the reader checks a string is UTF-8 when it first makes
//! it, which a coordinator does once per thread rather than once per
//! execution (`events::relay`).

use super::{
    Cursor, EVENT, HAS_EXEC, HAS_STAGE, HAS_TOOL, LINE, MAX_FIELDS, RESET, Read, Stop, V_FALSE,
    V_JSON, V_MEMBERS, V_STR, V_TEXT, V_TRUE, V_U64, V_USAGE, bad, define, referred, unzigzag,
    write_varint,
};

/// One record read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// An event's head; its `fields` follow, each read by [`Scan::field`].
    Event(EventRecord),
    /// A whole JSON line, as written (no newline).
    Line(&'a str),
}

/// An event's head, its strings by number ([`Scan::string`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRecord {
    pub seq: u64,
    /// Microseconds since 1970.
    pub micros: u64,
    pub name: usize,
    pub run: usize,
    pub exec: Option<usize>,
    pub stage: Option<usize>,
    pub tool: Option<usize>,
    pub fields: usize,
}

/// One field of an event: its key (a string's number; none for a
/// relayed event's members) and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub key: Option<usize>,
    pub value: Value<'a>,
}

/// A field's value as the record holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// A string by number.
    Str(usize),
    /// A string written in place.
    Text(&'a str),
    U64(u64),
    Bool(bool),
    /// Prompt tokens, completion tokens, requests.
    Usage([u64; 3]),
    /// Any other JSON value's text, unchecked: the caller parses it.
    Json(&'a str),
    /// A relayed event's members, unchecked.
    Members(&'a str),
}

/// Reads records from a whole piece of bytes.
pub struct Scan<'a> {
    r: Cursor<'a>,
    strings: Vec<&'a [u8]>,
    /// The bytes of text strings were defined with since the last `RESET`.
    defined: usize,
    seq: u64,
    micros: u64,
    /// Fields of the last event not read yet.
    fields_left: usize,
    /// Strings defined, every `RESET` included.
    definitions: usize,
}

impl std::fmt::Debug for Scan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan")
            .field("at", &self.r.at)
            .field("of", &self.r.bytes.len())
            .field("strings", &self.strings.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Scan<'a> {
    pub fn new(bytes: &'a [u8]) -> Scan<'a> {
        Scan {
            r: Cursor { bytes, at: 0 },
            strings: Vec::new(),
            defined: 0,
            seq: 0,
            micros: 0,
            fields_left: 0,
            definitions: 0,
        }
    }

    /// The next record (a `RESET` is taken in passing), or `None` at the
    /// end. The fields of an event must be read before the next record.
    pub fn record(&mut self) -> Result<Option<Record<'a>>, String> {
        if self.fields_left != 0 {
            return Err("an event's fields were not read".to_owned());
        }
        loop {
            if self.r.at == self.r.bytes.len() {
                return Ok(None);
            }
            match self.r.byte().map_err(reason)? {
                RESET => {
                    self.strings.clear();
                    self.defined = 0;
                    self.seq = 0;
                    self.micros = 0;
                }
                LINE => {
                    let text = self.r.text().map_err(reason)?;
                    let line = std::str::from_utf8(text)
                        .map_err(|_| "a line that is not UTF-8".to_owned())?;
                    if line.contains('\n') {
                        return Err("a line record holds a newline".to_owned());
                    }
                    return Ok(Some(Record::Line(line)));
                }
                EVENT => return self.event().map(|e| Some(Record::Event(e))).map_err(reason),
                tag => return Err(format!("unknown record tag {tag}")),
            }
        }
    }

    fn event(&mut self) -> Read<EventRecord> {
        self.seq = self.seq.wrapping_add(unzigzag(self.r.varint()?));
        self.micros = self.micros.wrapping_add(unzigzag(self.r.varint()?));
        let flags = self.r.byte()?;
        if flags & !(HAS_EXEC | HAS_STAGE | HAS_TOOL) != 0 {
            return Err(Stop::Bad(format!("unknown event flags {flags:#x}")));
        }
        let name = self.string_ref()?;
        let run = self.string_ref()?;
        let mut ids = [None; 3];
        for (i, flag) in [HAS_EXEC, HAS_STAGE, HAS_TOOL].into_iter().enumerate() {
            if flags & flag != 0 {
                ids[i] = Some(self.string_ref()?);
            }
        }
        let fields = self.r.varint()?;
        if fields > MAX_FIELDS {
            return Err(Stop::Bad(format!("an event with {fields} fields")));
        }
        // At most MAX_FIELDS, which fits any usize.
        self.fields_left = fields as usize;
        Ok(EventRecord {
            seq: self.seq,
            micros: self.micros,
            name,
            run,
            exec: ids[0],
            stage: ids[1],
            tool: ids[2],
            fields: self.fields_left,
        })
    }

    /// The next field of the event just read.
    pub fn field(&mut self) -> Result<Field<'a>, String> {
        if self.fields_left == 0 {
            return Err("no field is left to read".to_owned());
        }
        self.fields_left -= 1;
        self.read_field().map_err(reason)
    }

    fn read_field(&mut self) -> Read<Field<'a>> {
        let tag = self.r.byte()?;
        if tag == V_MEMBERS {
            let members = self.utf8()?;
            return Ok(Field {
                key: None,
                value: Value::Members(members),
            });
        }
        let key = Some(self.string_ref()?);
        let value = match tag {
            V_STR => Value::Str(self.string_ref()?),
            V_TEXT => Value::Text(self.utf8()?),
            V_U64 => Value::U64(self.r.varint()?),
            V_FALSE => Value::Bool(false),
            V_TRUE => Value::Bool(true),
            V_USAGE => Value::Usage([self.r.varint()?, self.r.varint()?, self.r.varint()?]),
            V_JSON => Value::Json(self.utf8()?),
            tag => return Err(Stop::Bad(format!("unknown value tag {tag}"))),
        };
        Ok(Field { key, value })
    }

    /// String `n` (a number [`Scan::record`] or [`Scan::field`] gave),
    /// as its bytes: not checked to be UTF-8.
    pub fn string(&self, n: usize) -> &'a [u8] {
        self.strings[n]
    }

    /// How many strings are defined since the last `RESET`: every number
    /// handed out is below it.
    pub fn strings(&self) -> usize {
        self.strings.len()
    }

    /// How many strings were defined in all, across `RESET`s (what a
    /// reader that keeps something per string holds).
    pub fn definitions(&self) -> usize {
        self.definitions
    }

    fn utf8(&mut self) -> Read<&'a str> {
        std::str::from_utf8(self.r.text()?).map_err(|_| bad("a string that is not UTF-8"))
    }

    /// A string reference: the number of the string, defining it first
    /// when the reference is a definition.
    fn string_ref(&mut self) -> Read<usize> {
        match self.r.varint()? {
            0 => {
                let text = self.r.text()?;
                define(&mut self.defined, text.len())?;
                self.definitions += 1;
                self.strings.push(text);
                Ok(self.strings.len() - 1)
            }
            n => referred(n, self.strings.len()),
        }
    }
}

/// A whole piece's reason: bytes that end inside a record are damage here.
fn reason(stop: Stop) -> String {
    match stop {
        Stop::More => "a record cut short".to_owned(),
        Stop::Bad(reason) => reason,
    }
}

/// Appends `n` as the varint the records use (a length in a frame of
/// records: [`read_len`] reads it).
pub fn write_len(out: &mut Vec<u8>, n: usize) {
    write_varint(out, n as u64);
}

/// Reads a length [`write_len`] wrote at `*at`, moving past it; `None`
/// when the bytes end first or it is no varint.
pub fn read_len(bytes: &[u8], at: &mut usize) -> Option<usize> {
    let mut r = Cursor { bytes, at: *at };
    let n = usize::try_from(r.varint().ok()?).ok()?;
    *at = r.at;
    Some(n)
}
