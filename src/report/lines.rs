//! The lines of a `BufRead`, handed out without copying: a line that sits
//! whole in the reader's buffer is lent from it, and only a line split
//! across two fills is copied. (A 100 000-sibling log is ~330 MB; copying
//! every line out, as `read_until` does, was a tenth of reading it.)

use std::io::BufRead;

/// Why [`for_each_line`] stopped early.
#[derive(Debug)]
pub enum Stop<E> {
    /// The reader failed.
    Read(std::io::Error),
    /// The callback returned this error.
    Line(E),
}

/// Calls `line` with every line of `reader`, without its `\n`, in order;
/// the last one also when no `\n` ends it. Stops at the first error.
pub fn for_each_line<R: BufRead, E>(
    mut reader: R,
    mut line: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), Stop<E>> {
    let mut split: Vec<u8> = Vec::new();
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Stop::Read(e)),
        };
        if buf.is_empty() {
            break;
        }
        let mut start = 0;
        while let Some(n) = find_newline(&buf[start..]) {
            let end = start + n;
            if split.is_empty() {
                line(&buf[start..end]).map_err(Stop::Line)?;
            } else {
                split.extend_from_slice(&buf[start..end]);
                line(&split).map_err(Stop::Line)?;
                split.clear();
            }
            start = end + 1;
        }
        split.extend_from_slice(&buf[start..]);
        let used = buf.len();
        reader.consume(used);
    }
    if !split.is_empty() {
        line(&split).map_err(Stop::Line)?;
    }
    Ok(())
}

/// The position of the first `\n`, eight bytes at a time.
fn find_newline(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    const NEWLINES: u64 = u64::from_le_bytes([b'\n'; 8]);
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let v = u64::from_le_bytes(w) ^ NEWLINES;
        // The lowest flagged byte is exactly the first zero byte (flags
        // above it may be false, never below).
        let zero = v.wrapping_sub(ONES) & !v & HIGH;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| b == b'\n')
        .map(|p| at + p)
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;

    use super::{find_newline, for_each_line};

    #[test]
    fn finds_the_first_newline_anywhere() {
        for len in 0..40 {
            for pos in 0..len {
                let mut bytes = vec![b'a'; len];
                bytes[pos] = b'\n';
                if pos + 1 < len {
                    bytes[len - 1] = b'\n';
                }
                assert_eq!(find_newline(&bytes), Some(pos), "{len} {pos}");
            }
            assert_eq!(find_newline(&vec![0x8a; len]), None);
        }
    }

    #[test]
    fn lines_split_across_fills_arrive_whole() {
        let text = b"first line\nsecond, a longer line\n\nlast without newline";
        for capacity in 1..text.len() + 2 {
            let mut got: Vec<String> = Vec::new();
            let reader = BufReader::with_capacity(capacity, &text[..]);
            for_each_line(reader, |l| {
                got.push(String::from_utf8_lossy(l).into_owned());
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(
                got,
                [
                    "first line",
                    "second, a longer line",
                    "",
                    "last without newline"
                ],
                "capacity {capacity}"
            );
        }
    }
}
