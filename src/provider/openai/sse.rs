//! Server-sent events from a byte stream: bytes are buffered to whole lines
//! (`\n`, `\r\n` or `\r`), `data:` lines are collected, and a blank line
//! ends an event. Chunks may split lines, events and UTF-8 characters
//! anywhere. Comments (`: ping`) and fields other than `data` and `event`
//! (`id:`) are ignored. Both readers take whole events
//! ([`SseDecoder::push_events`]): the OpenAI stream's `event: error` (a
//! llama.cpp server's failure), the control API's last event, `end`.
//! [`SseDecoder::push`] gives the data alone.

/// A line, or an event's data, larger than this is refused (a server
/// streaming garbage without line breaks must not exhaust memory).
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// One event: its `event:` field, if it had one, and its data lines
/// joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub kind: Option<String>,
    pub data: String,
}

/// Incremental SSE decoder.
#[derive(Debug)]
pub struct SseDecoder {
    /// Bytes not yet forming a whole line.
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no line end, so a long line
    /// split over many chunks is scanned once, not once per chunk.
    scanned: usize,
    /// `data` lines of the event being read.
    data: Vec<String>,
    data_bytes: usize,
    /// Its `event` field.
    kind: Option<String>,
    /// The most bytes a line or an event's data may take.
    most: usize,
}

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::with_limit(MAX_EVENT_BYTES)
    }
}

/// Why a stream cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseError(pub String);

impl SseDecoder {
    pub fn new() -> SseDecoder {
        SseDecoder::default()
    }

    /// A decoder that refuses a line or an event's data past `most`
    /// bytes (rather than [`MAX_EVENT_BYTES`]).
    pub fn with_limit(most: usize) -> SseDecoder {
        SseDecoder {
            pending: Vec::new(),
            scanned: 0,
            data: Vec::new(),
            data_bytes: 0,
            kind: None,
            most,
        }
    }

    /// Feeds bytes; returns the data of every event completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, SseError> {
        Ok(self
            .push_events(bytes)?
            .into_iter()
            .map(|e| e.data)
            .collect())
    }

    /// Feeds bytes; returns every event completed by them.
    pub fn push_events(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        let mut i = self.scanned;
        while i < self.pending.len() {
            let end = match self.pending[i] {
                b'\n' => i + 1,
                // A `\r` at the end of the buffer may be the first half of
                // `\r\n`: wait for the next chunk.
                b'\r' if i + 1 == self.pending.len() => break,
                b'\r' if self.pending[i + 1] == b'\n' => i + 2,
                b'\r' => i + 1,
                _ => {
                    i += 1;
                    continue;
                }
            };
            if i - start > self.most {
                return Err(too_large(self.most));
            }
            let line = String::from_utf8_lossy(&self.pending[start..i]).into_owned();
            self.line(&line, &mut events)?;
            start = end;
            i = end;
        }
        self.pending.drain(..start);
        self.scanned = i - start;
        // The same limits whether a line arrives whole or in pieces: a line
        // still open is refused once it is longer than a whole one may be
        // (counting other lines' data here refused a long comment followed
        // by data only when the stream happened to split inside it).
        if self.scanned > self.most {
            return Err(too_large(self.most));
        }
        Ok(events)
    }

    /// The end of the stream: an event not closed by a blank line is still
    /// delivered (some servers end with `data: [DONE]` and no blank line).
    pub fn finish(&mut self) -> Result<Option<SseEvent>, SseError> {
        let mut events = Vec::new();
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.scanned = 0;
            let line = String::from_utf8_lossy(&rest).into_owned();
            self.line(line.trim_end_matches('\r'), &mut events)?;
        }
        self.line("", &mut events)?;
        Ok(events.pop())
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            let kind = self.kind.take();
            if !self.data.is_empty() {
                events.push(SseEvent {
                    kind,
                    data: self.data.join("\n"),
                });
                self.data.clear();
                self.data_bytes = 0;
            }
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                self.data_bytes += value.len();
                if self.data_bytes > self.most {
                    return Err(too_large(self.most));
                }
                self.data.push(value.to_owned());
            }
            "event" => self.kind = Some(value.to_owned()),
            _ => {}
        }
        Ok(())
    }
}

/// A line, or an event's data, over `most` bytes.
fn too_large(most: usize) -> SseError {
    SseError(format!(
        "an event of the stream exceeds {} MiB",
        most / (1024 * 1024)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(input: &[u8], piece: usize) -> Vec<String> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            out.extend(d.push(chunk).unwrap());
        }
        out.extend(d.finish().unwrap().map(|e| e.data));
        out
    }

    #[test]
    fn events_survive_any_split() {
        let input = "data: {\"a\":1}\n\n: keep-alive\n\nevent: x\ndata: é€😀\r\n\r\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";
        let expected = ["{\"a\":1}", "é€😀", "line1\nline2", "[DONE]"];
        for piece in 1..input.len() {
            assert_eq!(
                decode_in_pieces(input.as_bytes(), piece),
                expected,
                "piece {piece}"
            );
        }
    }

    #[test]
    fn bare_cr_line_ends_and_a_missing_final_blank_line() {
        assert_eq!(
            decode_in_pieces(b"data:x\r\rdata: [DONE]", 3),
            ["x", "[DONE]"]
        );
    }

    #[test]
    fn a_huge_line_is_refused() {
        let mut d = SseDecoder::new();
        let big = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert!(d.push(&big).is_err());
    }
}
