//! Where the zstd blocks of a log's frames end, so that the decoder hands
//! zstd one block at a time.
//!
//! zstd does not say how far into what it was given it failed, and on a
//! failure it hands out nothing it decoded in that call. Given a block
//! that decodes and then a damaged one in the same call, it would lose
//! the good block's lines too, and which lines come before the damage
//! would depend on how the file was read in pieces (`runs export`,
//! `resume` and `runs tail` read differently). Fed through the end of one
//! block at a time, a call fails only on its own block: every line of
//! the blocks before the damage comes out, however the bytes arrive.
//! One exception, in files troupe did not write: zstd streams a raw
//! block out as its bytes arrive, and checks a size the frame declares
//! only at its end, so a raw block read in pieces may give lines that a
//! whole read loses to that check (troupe's frames declare no size).
//!
//! The walk reads only the frames' headers (RFC 8878): a frame's header,
//! each block's three-byte header and length, the checksum after the last
//! block, and skippable frames whole. What it cannot read (a foreign
//! magic number) it leaves to zstd, which refuses it; from there on it
//! offers everything, as before.

/// A zstd frame's magic number, little-endian.
pub(super) const ZSTD_MAGIC: u32 = 0xFD2F_B528;

/// The longest frame header: magic, descriptor, window, dictionary id
/// (4) and content size (8).
const HEADER_MAX: usize = 18;

/// Where the walk is in the frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// A frame's header (or a skippable frame's magic and size).
    Frame,
    /// A block's three-byte header.
    Block,
    /// Bytes passed over whole (a block's content, a frame's checksum, a
    /// skippable frame's content): this many more, then `then`. Their end
    /// is where the walk stops.
    Pass { left: u64, then: Then },
    /// Bytes the walk cannot read: zstd refuses them.
    Lost,
}

/// What follows bytes passed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The next frame.
    Frame,
    /// The frame's next block.
    Block,
    /// The frame's checksum, then the next frame.
    Checksum,
}

impl Then {
    /// Where the walk is once the bytes before are passed over.
    fn at(self) -> At {
        match self {
            Then::Frame => At::Frame,
            Then::Block => At::Block,
            Then::Checksum => At::Pass {
                left: 4,
                then: Then::Frame,
            },
        }
    }
}

/// A walk through a log's frames, a byte at a time or faster.
#[derive(Debug, Clone, Copy)]
pub(super) struct Blocks {
    at: At,
    /// The header being read (a frame's, or a block's three bytes).
    head: [u8; HEADER_MAX],
    have: usize,
    /// The frame being read ends in a checksum.
    checksum: bool,
}

impl Default for Blocks {
    fn default() -> Blocks {
        Blocks {
            at: At::Frame,
            head: [0; HEADER_MAX],
            have: 0,
            checksum: false,
        }
    }
}

impl Blocks {
    /// How many of `bytes` (what comes next) to give zstd at once: through
    /// the end of the first block, checksum or skippable frame they end,
    /// or all of them if none ends in them.
    pub(super) fn offer(&self, bytes: &[u8]) -> usize {
        let mut probe = *self;
        probe.walk(bytes).unwrap_or(bytes.len())
    }

    /// Walks over `bytes`, which zstd took in.
    pub(super) fn took(&mut self, mut bytes: &[u8]) {
        while let Some(end) = self.walk(bytes) {
            bytes = &bytes[end..];
        }
    }

    /// Walks over `bytes` until a block, a checksum or a skippable frame
    /// ends; returns how many bytes that took, `None` when they ran out
    /// first (all of them walked).
    fn walk(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut at = 0;
        while at < bytes.len() {
            match self.at {
                At::Lost => return None,
                At::Frame | At::Block => {
                    self.head[self.have] = bytes[at];
                    self.have += 1;
                    at += 1;
                    if let Some((left, then)) = self.headed() {
                        self.have = 0;
                        self.at = At::Pass { left, then };
                    }
                }
                At::Pass { left, then } => {
                    let step = left.min((bytes.len() - at) as u64);
                    at += step as usize;
                    self.at = At::Pass {
                        left: left - step,
                        then,
                    };
                }
            }
            // Passed over whole (an empty block or skippable frame at once).
            if let At::Pass { left: 0, then } = self.at {
                self.at = then.at();
                return Some(at);
            }
        }
        None
    }

    /// After a header byte: once the header is whole, what it says is to
    /// be passed over and what follows (a frame's header: nothing, then
    /// its first block). `None` while it is not whole, or when it is no
    /// zstd frame's (the walk is then lost).
    fn headed(&mut self) -> Option<(u64, Then)> {
        let head = &self.head[..self.have];
        match self.at {
            At::Frame => {
                let magic = u32::from_le_bytes(head.get(..4)?.try_into().ok()?);
                if skippable(magic) {
                    // Its size, then as many bytes.
                    let size = u32::from_le_bytes(head.get(4..8)?.try_into().ok()?);
                    return Some((u64::from(size), Then::Frame));
                }
                if magic != ZSTD_MAGIC {
                    self.at = At::Lost;
                    return None;
                }
                let &descriptor = head.get(4)?;
                if head.len() < frame_header_len(descriptor) {
                    return None;
                }
                self.checksum = has_checksum(descriptor);
                // Not a stop of its own: its first block's end is.
                self.at = At::Block;
                self.have = 0;
                None
            }
            At::Block => {
                let (last, content) = block_header(head.try_into().ok()?);
                let then = match (last, self.checksum) {
                    (false, _) => Then::Block,
                    (true, true) => Then::Checksum,
                    (true, false) => Then::Frame,
                };
                // A reserved type (no content): zstd refuses it.
                Some((u64::from(content.unwrap_or(0)), then))
            }
            _ => None,
        }
    }
}

/// Whether a frame ends in a checksum, by its descriptor.
pub(super) fn has_checksum(descriptor: u8) -> bool {
    descriptor & 0b100 != 0
}

/// A skippable frame's magic number (its size follows, then as many
/// bytes).
pub(super) fn skippable(magic: u32) -> bool {
    magic & 0xFFFF_FFF0 == 0x184D_2A50
}

/// A block's three-byte header: whether it is its frame's last, and how
/// many bytes of content follow it (`None` for the reserved type, which
/// no frame holds). Raw and compressed blocks hold their size, an RLE
/// block the one byte it repeats.
pub(super) fn block_header(bytes: [u8; 3]) -> (bool, Option<u32>) {
    let header = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], 0]);
    let size = header >> 3;
    let content = match (header >> 1) & 0b11 {
        0 | 2 => Some(size),
        1 => Some(1),
        _ => None,
    };
    (header & 1 != 0, content)
}

/// A frame header's length from its descriptor (the byte after the
/// magic number).
pub(super) fn frame_header_len(descriptor: u8) -> usize {
    let single_segment = descriptor & 0b10_0000 != 0;
    let window = usize::from(!single_segment);
    let dictionary = [0, 1, 2, 4][usize::from(descriptor & 0b11)];
    let content_size = match descriptor >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    4 + 1 + window + dictionary + content_size
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ends a walk finds in `bytes` fed in pieces of `piece`.
    fn ends(bytes: &[u8], piece: usize) -> Vec<usize> {
        let mut blocks = Blocks::default();
        let mut found = Vec::new();
        for (i, chunk) in bytes.chunks(piece).enumerate() {
            let mut at = 0;
            while let Some(n) = blocks.walk(&chunk[at..]) {
                at += n;
                found.push(i * piece + at);
            }
        }
        found
    }

    /// Frames of several blocks, with and without a checksum, and a
    /// skippable frame between: the walk ends where each block, checksum
    /// and skippable frame ends, whatever the pieces, and zstd decodes the
    /// bytes given to it through those ends with nothing held back.
    #[test]
    fn the_walk_ends_where_zstd_blocks_end() {
        let text: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut bytes = Vec::new();
        for checksum in [true, false] {
            let mut encoder = zstd::stream::Encoder::new(Vec::new(), 1).expect("zstd");
            encoder.include_checksum(checksum).expect("checksum");
            std::io::Write::write_all(&mut encoder, &text).expect("write");
            bytes.extend(encoder.finish().expect("finish"));
            // A skippable frame of five bytes.
            bytes.extend(0x184D_2A53u32.to_le_bytes());
            bytes.extend(5u32.to_le_bytes());
            bytes.extend(b"skip!");
        }
        let whole = ends(&bytes, bytes.len());
        assert!(whole.len() >= 6, "several blocks: {whole:?}");
        for piece in [1, 3, 1000, 65_536] {
            assert_eq!(ends(&bytes, piece), whole, "pieces of {piece}");
        }
        assert_eq!(decoded_through(&bytes, &whole), 2 * text.len());
    }

    /// Gives zstd `bytes` through each of `ends` in turn: each call must
    /// take all it is given and decode it in full (its output is room for
    /// any block). The bytes decoded in all.
    fn decoded_through(bytes: &[u8], ends: &[usize]) -> usize {
        use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
        let mut decoder = Decoder::new().expect("zstd");
        let mut out = vec![0; 1 << 20];
        let (mut decoded, mut from) = (0, 0);
        for &end in ends {
            let mut input = InBuffer::around(&bytes[from..end]);
            let mut output = OutBuffer::around(&mut out[..]);
            decoder.run(&mut input, &mut output).expect("decodes");
            assert_eq!(input.pos(), end - from, "all taken");
            decoded += output.pos();
            from = end;
        }
        decoded
    }

    /// Frames of every header shape (single segment or a window, a
    /// dictionary id of 0 to 4 bytes, a content size of 0 to 8, with and
    /// without a checksum) around raw, RLE and empty blocks: each ends
    /// where zstd's own reading of the frame says it does.
    #[test]
    fn every_frame_header_shape_ends_where_zstd_says() {
        for descriptor in 0..=u8::MAX {
            // Bit 3 is reserved and bit 4 unused: no frame sets them.
            if descriptor & 0b1_1000 != 0 {
                continue;
            }
            for blocks in [&[(0u32, 5u32)][..], &[(1, 1), (0, 0), (0, 300)]] {
                let mut frame = ZSTD_MAGIC.to_le_bytes().to_vec();
                frame.push(descriptor);
                frame.resize(frame_header_len(descriptor), 0);
                for (i, &(kind, size)) in blocks.iter().enumerate() {
                    let last = u32::from(i + 1 == blocks.len());
                    frame.extend(&(last | kind << 1 | size << 3).to_le_bytes()[..3]);
                    let body = if kind == 1 { 1 } else { size as usize };
                    frame.extend(std::iter::repeat_n(b'x', body));
                }
                if descriptor & 0b100 != 0 {
                    frame.extend([0; 4]);
                }
                let shape = format!("descriptor {descriptor:#010b}, blocks {blocks:?}");
                let zstd_says = zstd::zstd_safe::find_frame_compressed_size(&frame)
                    .unwrap_or_else(|e| panic!("{shape}: zstd reads no frame: {e}"));
                assert_eq!(zstd_says, frame.len(), "{shape}");
                assert_eq!(ends(&frame, 1).last(), Some(&frame.len()), "{shape}");
            }
        }
    }

    /// Raw, RLE and compressed blocks as zstd writes them, in frames that
    /// say their content size (one segment) and frames that do not: each
    /// end is one zstd decodes up to in full, pieces or not.
    #[test]
    fn raw_and_rle_blocks_end_where_zstd_decodes_them() {
        let mut noise = Vec::with_capacity(300_000);
        let mut x: u32 = 0x9E37_79B9;
        for _ in 0..300_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            noise.push(x as u8);
        }
        let zeros = vec![0u8; 300_000];
        let mut bytes = Vec::new();
        let mut total = 0;
        for (content, pledged) in [
            (&noise, true),
            (&zeros, false),
            (&noise, false),
            (&zeros, true),
        ] {
            let mut encoder = zstd::stream::Encoder::new(Vec::new(), 1).expect("zstd");
            encoder.include_checksum(true).expect("checksum");
            if pledged {
                encoder.include_contentsize(true).expect("content size");
                encoder
                    .set_pledged_src_size(Some(content.len() as u64))
                    .expect("pledged");
            }
            std::io::Write::write_all(&mut encoder, content).expect("write");
            let frame = encoder.finish().expect("finish");
            // Noise stays as it is (raw blocks); zeros are runs of one byte
            // (RLE blocks, a few bytes each).
            if content == &noise {
                assert!(frame.len() > noise.len(), "raw blocks: {}", frame.len());
            } else {
                assert!(frame.len() < 100, "RLE blocks: {}", frame.len());
            }
            bytes.extend(frame);
            total += content.len();
        }
        let whole = ends(&bytes, bytes.len());
        for piece in [1, 7, 4096] {
            assert_eq!(ends(&bytes, piece), whole, "pieces of {piece}");
        }
        assert_eq!(decoded_through(&bytes, &whole), total);
    }

    #[test]
    fn a_foreign_magic_number_is_left_to_zstd() {
        let mut blocks = Blocks::default();
        let bytes = b"not a zstd frame at all";
        assert_eq!(blocks.offer(bytes), bytes.len());
        blocks.took(bytes);
        assert_eq!(blocks.offer(b"more"), 4);
    }
}
