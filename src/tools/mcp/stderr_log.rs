//! A stdio server's stderr, kept in `mcp-<name>.log` within bounds.
//!
//! The server used to write its stderr straight into the log file, and a
//! server that logs every request (or loops printing one error) filled
//! the disk under the run folder. Its stderr is a pipe now, read here:
//! once the file would pass [`LOG_CAP`] it is renamed `mcp-<name>.log.1`
//! (replacing an older one) and a new log begins, so what is kept is the
//! server's last one to two caps of output, and the tail an error quotes
//! is its latest lines. The pipe is read to its end whatever happens to
//! the file, so that a server is never blocked on a full pipe.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::secrets::Secrets;

/// A log's size, at most, before it is set aside for a new one.
pub(super) const LOG_CAP: u64 = 8 * 1024 * 1024;

/// Opens (creating) the log at `path` for appending, neither following a
/// link there nor waiting on a FIFO there (which would hold the start).
pub(super) fn open(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(flags.bits())
        .open(path)
}

/// Where a log is set aside when it is full.
fn set_aside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// A line past this many bytes is written in pieces of it.
const LONGEST_LINE: usize = 64 * 1024;

/// Copies `from` (a server's stderr) into the log at `path`, already open
/// as `file`, a line at a time with the server's secret values replaced
/// (`[redacted]`: the log is in the run folder, often inside the root,
/// where a `Read` would hand it to the model), keeping each file under
/// `cap` bytes; returns at the end of `from`. A log that cannot be
/// written any more (its folder removed, the disk full) is given up and
/// the rest of `from` read and dropped.
pub(super) async fn keep(
    mut from: impl AsyncRead + Unpin,
    path: PathBuf,
    file: std::fs::File,
    cap: u64,
    secrets: Secrets,
) {
    let mut log = Log {
        written: file.metadata().map_or(0, |m| m.len()),
        file: Some(tokio::fs::File::from_std(file)),
        path,
        cap,
    };
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];

    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending
            .iter()
            .position(|b| *b == b'\n')
            .map(|i| i + 1)
            // A line cut for its length is cut before a secret that
            // would straddle the cut, which the next piece then holds.
            .or_else(|| {
                (pending.len() >= LONGEST_LINE).then(|| secrets.cut_before(&pending, LONGEST_LINE))
            })
        {
            let rest = pending.split_off(end);
            let line = std::mem::replace(&mut pending, rest);
            log.write(&secrets.text(String::from_utf8_lossy(&line).into_owned()))
                .await;
        }
    }
    if !pending.is_empty() {
        log.write(&secrets.text(String::from_utf8_lossy(&pending).into_owned()))
            .await;
    }
    if let Some(mut to) = log.file {
        let _ = to.flush().await;
    }
}

/// The log being written.
struct Log {
    file: Option<tokio::fs::File>,
    path: PathBuf,
    written: u64,
    cap: u64,
}

impl Log {
    /// Appends `text`, first setting the log aside for a new one when it
    /// would pass the cap; a piece larger than the cap (only with a tiny
    /// cap) keeps its latest bytes.
    async fn write(&mut self, text: &str) {
        let bytes = text.as_bytes();
        if self.file.is_none() {
            return;
        }
        if self.written > 0 && self.written + bytes.len() as u64 > self.cap {
            if let Some(to) = self.file.as_mut() {
                let _ = to.flush().await;
            }
            self.file = match tokio::fs::rename(&self.path, set_aside(&self.path)).await {
                Ok(()) => open(&self.path).ok().map(tokio::fs::File::from_std),
                Err(_) => None,
            };
            self.written = 0;
        }
        let Some(to) = self.file.as_mut() else {
            return;
        };
        let kept = bytes
            .len()
            .min(usize::try_from(self.cap).unwrap_or(usize::MAX));
        match to.write_all(&bytes[bytes.len() - kept..]).await {
            Ok(()) => self.written += kept as u64,
            Err(_) => self.file = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's output past the cap starts a new log; the older one is
    /// set aside, one older than that dropped; no file passes the cap.
    #[tokio::test]
    async fn a_log_past_its_cap_is_set_aside_and_begun_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp-s.log");
        std::fs::write(&path, b"from the last start\n").unwrap();
        // A pipe that holds one line: each read is one line.
        let (mut server, stderr) = tokio::io::duplex(8);
        let keeper = tokio::spawn(keep(
            stderr,
            path.clone(),
            open(&path).unwrap(),
            100,
            Secrets::default(),
        ));
        for i in 0..30 {
            server
                .write_all(format!("line {i:02}\n").as_bytes())
                .await
                .unwrap();
        }
        drop(server);
        keeper.await.unwrap();
        let now = std::fs::read_to_string(&path).unwrap();
        let older = std::fs::read_to_string(set_aside(&path)).unwrap();
        assert!(now.len() <= 100 && older.len() <= 100, "{now:?} {older:?}");
        assert!(now.ends_with("line 29\n"), "{now:?}");
        assert!(!now.contains("from the last start"));
        assert!(!older.contains("from the last start"));
        // Together they hold the latest lines, in order, none lost
        // between them.
        let both = format!("{older}{now}");
        let numbers: Vec<u32> = both
            .lines()
            .map(|l| l.trim_start_matches("line ").parse().unwrap())
            .collect();
        assert_eq!(numbers, (numbers[0]..30).collect::<Vec<_>>(), "{both}");
    }

    /// The server's secret values never reach the log, wherever a read
    /// cuts its output (here a byte at a time).
    #[tokio::test]
    async fn a_secret_the_server_prints_is_redacted_in_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp-s.log");
        let (mut server, stderr) = tokio::io::duplex(1);
        let secrets = Secrets::from_values(["ghp_TOPSECRET42".to_owned()].into_iter());
        let keeper = tokio::spawn(keep(
            stderr,
            path.clone(),
            open(&path).unwrap(),
            1 << 20,
            secrets,
        ));
        server
            .write_all(b"debug: token ghp_TOPSECRET42 loaded\nno newline ghp_TOPSECRET42")
            .await
            .unwrap();
        drop(server);
        keeper.await.unwrap();
        let log = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            log, "debug: token [redacted] loaded\nno newline [redacted]",
            "{log}"
        );
    }

    /// A line too long to keep whole is cut into pieces, and a secret
    /// across a cut is still found: the cut moves to before it.
    #[tokio::test]
    async fn a_secret_across_the_cut_of_a_long_line_is_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp-s.log");
        let (mut server, stderr) = tokio::io::duplex(64 * 1024);
        let secret = "ghp_TOPSECRET42";
        let secrets = Secrets::from_values([secret.to_owned()].into_iter());
        let keeper = tokio::spawn(keep(
            stderr,
            path.clone(),
            open(&path).unwrap(),
            1 << 22,
            secrets,
        ));
        // One long line, no newline anywhere: the value across a cut at
        // every offset it can straddle one by. A cut moves to before the
        // value, so the next piece (and its cut) begins there.
        let mut line = String::new();
        let mut piece = 0;
        for offset in 1..secret.len() {
            let start = piece + LONGEST_LINE - offset;
            line.push_str(&"A".repeat(start - line.len()));
            line.push_str(secret);
            piece = start;
        }
        line.push_str(&"B".repeat(LONGEST_LINE));
        server.write_all(line.as_bytes()).await.unwrap();
        drop(server);
        keeper.await.unwrap();
        let log = std::fs::read_to_string(&path).unwrap();
        assert!(!log.contains("TOP"), "a part of the secret is in the log");
        assert_eq!(log.matches("[redacted]").count(), secret.len() - 1);
    }

    /// A log that cannot be written still has its pipe read to the end.
    #[tokio::test]
    async fn a_log_that_cannot_be_written_still_drains_the_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp-s.log");
        let file = open(&path).unwrap();
        drop(dir);
        let (mut server, stderr) = tokio::io::duplex(64);
        let keeper = tokio::spawn(keep(stderr, path, file, 10, Secrets::default()));
        // Far more than the pipe holds: the keeper must read it all.
        for _ in 0..100 {
            server.write_all(&[b'x'; 64]).await.unwrap();
        }
        drop(server);
        keeper.await.unwrap();
    }
}
