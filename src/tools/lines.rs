//! Bounded text reading shared by `Read` and `Grep`: lines read with a cap on
//! the bytes kept (a one-line 1 GiB file never lands in memory), binary
//! sniffing, and cutting text at a character boundary.

use std::io::{self, BufRead};

/// Bytes looked at to decide whether a file is binary (as git and ripgrep).
const SNIFF_BYTES: usize = 8192;

/// One line as read: its kept bytes are in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRead {
    /// Bytes consumed from the reader, newline included.
    pub consumed: usize,
    /// The line had more bytes than the cap; only the first were kept.
    pub cut: bool,
}

/// True when the start of the reader's buffer holds a NUL byte.
pub fn looks_binary<R: BufRead>(reader: &mut R) -> io::Result<bool> {
    let head = reader.fill_buf()?;
    Ok(head[..head.len().min(SNIFF_BYTES)].contains(&0))
}

/// Reads one line into `buf` (cleared first), keeping at most `cap` bytes of
/// it, without the line end (`\n` or `\r\n`). `None` at end of input.
pub fn read_line_capped<R: BufRead>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
) -> io::Result<Option<LineRead>> {
    buf.clear();
    let mut consumed = 0;
    let mut cut = false;
    loop {
        let avail = match reader.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            if consumed == 0 {
                return Ok(None);
            }
            break;
        }
        let (chunk, ends) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..=i], true),
            None => (avail, false),
        };
        let content = if ends {
            &chunk[..chunk.len() - 1]
        } else {
            chunk
        };
        let take = content.len().min(cap.saturating_sub(buf.len()));
        buf.extend_from_slice(&content[..take]);
        cut |= take < content.len();
        let n = chunk.len();
        reader.consume(n);
        consumed += n;
        if ends {
            break;
        }
    }
    if !cut && buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(LineRead { consumed, cut }))
}

/// `bytes` as text (invalid UTF-8 replaced), at most `max_chars` characters;
/// the flag says whether anything was cut. A character split by an earlier
/// byte cap is dropped rather than shown as a replacement character.
pub fn text_capped(bytes: &[u8], max_chars: usize, byte_cut: bool) -> (String, bool) {
    let bytes = if byte_cut {
        match std::str::from_utf8(bytes) {
            Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
            _ => bytes,
        }
    } else {
        bytes
    };
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    let mut cut = byte_cut;
    if let Some((at, _)) = text.char_indices().nth(max_chars) {
        text.truncate(at);
        cut = true;
    }
    (text, cut)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn lines(input: &[u8], cap: usize) -> Vec<(String, bool)> {
        let mut r = io::BufReader::with_capacity(4, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while let Some(l) = read_line_capped(&mut r, &mut buf, cap).unwrap() {
            out.push((String::from_utf8(buf.clone()).unwrap(), l.cut));
        }
        out
    }

    #[test]
    fn lines_are_capped_and_line_ends_dropped() {
        assert_eq!(
            lines(b"ab\r\ncdefgh\n\nlast", 3),
            vec![
                ("ab".to_owned(), false),
                ("cde".to_owned(), true),
                (String::new(), false),
                ("las".to_owned(), true),
            ]
        );
        assert!(lines(b"", 3).is_empty());
    }

    #[test]
    fn text_is_cut_at_char_boundaries() {
        assert_eq!(
            text_capped("héllo".as_bytes(), 2, false),
            ("hé".to_owned(), true)
        );
        // "é" is two bytes; a byte cap after its first byte drops it.
        assert_eq!(
            text_capped(&"hé".as_bytes()[..2], 10, true),
            ("h".to_owned(), true)
        );
        assert_eq!(text_capped(b"ok", 10, false), ("ok".to_owned(), false));
    }

    #[test]
    fn nul_means_binary() {
        assert!(looks_binary(&mut &b"ab\0cd"[..]).unwrap());
        assert!(!looks_binary(&mut &b"plain text"[..]).unwrap());
    }
}
