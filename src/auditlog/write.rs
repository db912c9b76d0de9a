//! Writing the compact log: the header, then segments.

use std::io::{self, Write};

use zstd::stream::write::Encoder;

/// The format version this troupe writes: segments of binary records
/// ([`super::records`]). It reads this and [`FORMAT_LINES`].
pub const FORMAT: u32 = 2;

/// The first format, whose segments hold the JSON lines themselves (`zstd
/// -dc` prints them). Logs of runs begun by an older troupe are in it, and
/// a resumed run goes on writing it there.
pub const FORMAT_LINES: u32 = 1;

/// The zstd level. On a `fanout` log level 1 is both the fastest and the
/// smallest of 1–3 (its plain hash finds the repeats these lines are made
/// of; level 3's larger tables cost time and find nothing more): 24× at
/// 1.7 GB/s against 20× at 1.3 GB/s (BENCHMARKS.md, "The compact audit log").
pub const LEVEL: i32 = 1;

/// Bytes of records (or lines) a segment (one zstd frame) holds before
/// the writer closes it and begins the next: a resume rewrites at most
/// this much, each closed segment's checksum is verified by every reader,
/// and `troupe runs tail` decodes from the last segments. 1 MiB of
/// records is about 2 000 `fanout` siblings, as the 8 MiB of JSON lines
/// of the first format was.
pub const SEGMENT: u64 = 1 << 20;

/// The magic of the skippable frame that holds the header (zstd reserves
/// `0x184D2A50..=0x184D2A5F` for frames decoders skip).
pub(super) const HEADER_MAGIC: u32 = 0x184D_2A5E;
/// What the header frame's payload begins with; the version follows, then
/// a newline.
pub(super) const HEADER_TAG: &[u8] = b"troupe audit log, format ";

/// The log's first bytes: a skippable frame naming the format.
pub fn header() -> Vec<u8> {
    header_for(FORMAT)
}

/// The header of a log in format `format`.
pub fn header_for(format: u32) -> Vec<u8> {
    let mut payload = HEADER_TAG.to_vec();
    payload.extend_from_slice(format!("{format}\n").as_bytes());
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&HEADER_MAGIC.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Writes lines into `W` as the compact log. `write` compresses into the
/// open segment; `flush` ends a zstd block and flushes `W`, so everything
/// written before it is on disk and decodable (and closes the segment once
/// it holds [`SEGMENT`] bytes); [`Compressed::finish`] closes the segment.
pub struct Compressed<W: Write> {
    /// `None` only after closing a segment failed: the log takes no more.
    encoder: Option<Encoder<'static, W>>,
    /// A new log's header, written with the first bytes (so that a file
    /// that cannot be written fails where the writer reports it, on its
    /// first flush, as it would for any other write).
    header: Option<Vec<u8>>,
    /// Bytes of lines in the open segment.
    in_segment: u64,
    /// The log's format: what [`Compressed::write_lines`] writes.
    format: u32,
}

impl<W: Write> std::fmt::Debug for Compressed<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compressed")
            .field("in_segment", &self.in_segment)
            .finish_non_exhaustive()
    }
}

impl<W: Write> Compressed<W> {
    /// A new log in `out` (empty), in this troupe's [`FORMAT`]: writes
    /// the header first.
    pub fn create(out: W) -> io::Result<Compressed<W>> {
        Compressed::create_in(out, FORMAT)
    }

    /// A new log in `out` in format `format` (tests of an older troupe's
    /// logs write [`FORMAT_LINES`]).
    pub fn create_in(out: W, format: u32) -> io::Result<Compressed<W>> {
        let mut log = Compressed::append(out, format)?;
        log.header = Some(header_for(format));
        Ok(log)
    }

    /// Appends segments to `out`, a log in format `format` that has its
    /// header and ends after a closed segment (see
    /// [`super::cut_to_whole`]).
    pub fn append(out: W, format: u32) -> io::Result<Compressed<W>> {
        Ok(Compressed {
            encoder: Some(segment(out)?),
            header: None,
            in_segment: 0,
            format,
        })
    }

    /// Writes whole JSON lines (each ending in a newline) in the log's
    /// format: as they are in [`FORMAT_LINES`], as line records in
    /// [`FORMAT`].
    pub fn write_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        if self.format == FORMAT_LINES {
            return self.write_all(lines);
        }
        let mut records = Vec::with_capacity(lines.len() + lines.len() / 16);
        super::records::lines_as_records(lines, &mut records);
        self.write_all(&records)
    }

    /// The writer under the compression.
    pub fn get_ref(&self) -> Option<&W> {
        self.encoder.as_ref().map(Encoder::get_ref)
    }

    /// Closes the open segment; returns `W`, flushed.
    pub fn finish(mut self) -> io::Result<W> {
        self.write_header()?;
        let mut out = self.encoder.take().ok_or_else(broken)?.finish()?;
        out.flush()?;
        Ok(out)
    }

    fn encoder(&mut self) -> io::Result<&mut Encoder<'static, W>> {
        self.encoder.as_mut().ok_or_else(broken)
    }

    /// Writes a new log's header, once, before anything else.
    fn write_header(&mut self) -> io::Result<()> {
        if let Some(header) = self.header.take() {
            self.encoder()?.get_mut().write_all(&header)?;
        }
        Ok(())
    }
}

/// A segment's encoder: zstd at [`LEVEL`], with the content checksum.
fn segment<W: Write>(out: W) -> io::Result<Encoder<'static, W>> {
    let mut encoder = Encoder::new(out, LEVEL)?;
    encoder.include_checksum(true)?;
    Ok(encoder)
}

fn broken() -> io::Error {
    io::Error::other("closing a segment of the audit log failed earlier; it takes no more writes")
}

impl<W: Write> Write for Compressed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_header()?;
        let n = self.encoder()?.write(buf)?;
        self.in_segment += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_header()?;
        if self.in_segment < SEGMENT {
            return self.encoder()?.flush();
        }
        let out = self.encoder.take().ok_or_else(broken)?.finish()?;
        self.in_segment = 0;
        self.encoder = Some(segment(out)?);
        self.encoder()?.get_mut().flush()
    }
}

/// A log written as whole segments compressed elsewhere (by the audit
/// log's formatter threads, each compressing its own batch with a
/// [`SegmentCompressor`]): the header, then each segment's frame as it
/// comes, flushed. Every segment is closed when written, so a process
/// killed outright leaves at most a cut last frame, which readers and
/// `resume` treat as they treat an open segment.
///
/// A segment compressed on its own does not share the window of the one
/// before it: on a `fanout` log, batches of 140 KB compress to 1.1× the
/// size of one stream (BENCHMARKS.md, "Every core, third round"), the
/// price of compressing on several threads.
pub struct Frames<W: Write> {
    out: W,
    header: Option<Vec<u8>>,
}

impl<W: Write> std::fmt::Debug for Frames<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frames")
            .field("header_written", &self.header.is_none())
            .finish_non_exhaustive()
    }
}

impl<W: Write> Frames<W> {
    /// A new log in `out` (empty): the header goes first.
    pub fn create(out: W) -> Frames<W> {
        Frames {
            out,
            header: Some(header()),
        }
    }

    /// Appends segments to `out`, a log that has its header and ends after
    /// a closed segment.
    pub fn append(out: W) -> Frames<W> {
        Frames { out, header: None }
    }

    /// Writes one segment's whole frame and flushes.
    pub fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        self.write_header()?;
        self.out.write_all(frame)?;
        self.out.flush()
    }

    /// Ends the log (a log with no segment still gets its header); returns
    /// `W`, flushed.
    pub fn finish(mut self) -> io::Result<W> {
        self.write_header()?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn write_header(&mut self) -> io::Result<()> {
        if let Some(header) = self.header.take() {
            self.out.write_all(&header)?;
        }
        Ok(())
    }
}

/// Compresses a batch of lines into one closed segment: zstd at
/// [`LEVEL`], with the content checksum, as [`Compressed`] writes them.
pub struct SegmentCompressor {
    inner: zstd::bulk::Compressor<'static>,
}

impl std::fmt::Debug for SegmentCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentCompressor").finish_non_exhaustive()
    }
}

impl SegmentCompressor {
    pub fn new() -> io::Result<SegmentCompressor> {
        let mut inner = zstd::bulk::Compressor::new(LEVEL)?;
        inner.include_checksum(true)?;
        Ok(SegmentCompressor { inner })
    }

    /// `lines` as one segment's frame, in `frame` (replacing what it held).
    pub fn compress(&mut self, lines: &[u8], frame: &mut Vec<u8>) -> io::Result<()> {
        frame.clear();
        frame.reserve(zstd::zstd_safe::compress_bound(lines.len()));
        self.inner.compress_to_buffer(lines, frame).map(drop)
    }
}
