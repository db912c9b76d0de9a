//! A stdio server's transport: the SDK's line transport over the child's
//! pipes, with the child kept here. The SDK drops a line over its 16 MiB
//! limit and reads on, so a call answered with one waited for its timeout
//! (a minute by default) and then failed as a timeout. The child's stdout
//! is read through [`Guarded`], which ends the connection at such a line
//! instead and says so: the call fails at once, naming why.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

/// A send already done: what the first message waits for.
fn written() -> tokio::sync::oneshot::Receiver<()> {
    let (done, before) = tokio::sync::oneshot::channel();
    let _ = done.send(());
    before
}

/// The longest message troupe reads from a stdio server: below the SDK's
/// own limit (16 MiB), so that the guard, not the SDK, meets a longer one.
pub(super) const LONGEST_MESSAGE: usize = 16 * 1024 * 1024 - 1;

/// How long a closed server may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// The transport of one stdio server, and its process.
pub(super) struct StdioServer {
    transport: AsyncRwTransport<RoleClient, Guarded<ChildStdout>, ChildStdin>,
    child: Child,
    /// Done when the message sent last is written (or its send given up).
    last_sent: tokio::sync::oneshot::Receiver<()>,
}

impl StdioServer {
    /// Starts `cmd` with piped stdin and stdout and the given stderr.
    /// `oversized` is set when the server sends a message too long to
    /// read (the connection then ends).
    pub(super) fn spawn(
        mut cmd: tokio::process::Command,
        stderr: std::process::Stdio,
        oversized: Arc<AtomicBool>,
    ) -> io::Result<(StdioServer, Option<ChildStderr>)> {
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr);
        let mut child = cmd.spawn()?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(io::Error::other("the server's pipes were not made"));
        };
        let stderr = child.stderr.take();
        let read = Guarded {
            inner: stdout,
            since_newline: 0,
            oversized,
        };
        Ok((
            StdioServer {
                transport: AsyncRwTransport::new_client(read, stdin),
                child,
                last_sent: written(),
            },
            stderr,
        ))
    }

    pub(super) fn id(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Transport<RoleClient> for StdioServer {
    type Error = io::Error;

    /// Messages are written in the order they are handed over. The SDK
    /// runs each send as a task of its own, and the runtime may start a
    /// task spawned later first: a call abandoned at its timeout had its
    /// `notifications/cancelled` reach the server after the next call's
    /// request, with `maxInflight: 1` too. Each send waits for the one
    /// before it.
    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.transport.send(item);
        let (done, next) = tokio::sync::oneshot::channel();
        let before = std::mem::replace(&mut self.last_sent, next);
        async move {
            // An error here is a send before this one dropped unwritten.
            let _ = before.await;
            let written = write.await;
            let _ = done.send(());
            written
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.transport.receive()
    }

    /// Closes its stdin (the MCP way to ask a stdio server to exit), waits
    /// a moment for it to, then kills it. (Its process group is killed
    /// with the connection in any case.)
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.transport.close().await?;
        if tokio::time::timeout(EXIT_GRACE, self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

/// The server's stdout, ended at a line longer than [`LONGEST_MESSAGE`].
pub(super) struct Guarded<R> {
    inner: R,
    /// Bytes read since the last newline.
    since_newline: usize,
    oversized: Arc<AtomicBool>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Guarded<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        // Every line the read holds, the first one continuing the last
        // read's: a read may hold a whole long line and its newline.
        let mut line = this.since_newline;
        let mut over = false;
        for (i, piece) in buf.filled()[before..].split(|b| *b == b'\n').enumerate() {
            if i > 0 {
                line = 0;
            }
            line = line.saturating_add(piece.len());
            over |= line > LONGEST_MESSAGE;
        }
        this.since_newline = line;
        if over {
            // A read that fails hands nothing back.
            buf.set_filled(before);
            this.oversized.store(true, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server sent a message over 16 MiB",
            )));
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_line_past_the_longest_ends_the_read_and_says_so() {
        let oversized = Arc::new(AtomicBool::new(false));
        let mut text = b"{\"a\":1}\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', LONGEST_MESSAGE));
        text.extend_from_slice(b"\n");
        let mut fits = Guarded {
            inner: &text[..],
            since_newline: 0,
            oversized: Arc::clone(&oversized),
        };
        let mut all = Vec::new();
        fits.read_to_end(&mut all)
            .await
            .expect("a line of the longest fits");
        assert!(!oversized.load(Ordering::Relaxed));
        text.insert(10, b'x');
        let mut over = Guarded {
            inner: &text[..],
            since_newline: 0,
            oversized: Arc::clone(&oversized),
        };
        let err = over.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(oversized.load(Ordering::Relaxed));
    }

    fn cancel_of(n: i64) -> TxJsonRpcMessage<RoleClient> {
        use rmcp::model::{
            CancelledNotification, CancelledNotificationParam, ClientNotification, NumberOrString,
        };
        rmcp::model::JsonRpcMessage::notification(ClientNotification::CancelledNotification(
            CancelledNotification::new(CancelledNotificationParam::new(
                Some(NumberOrString::Number(n)),
                None,
            )),
        ))
    }

    #[tokio::test]
    async fn messages_are_written_in_the_order_they_were_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("written");
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg("cat > \"$0\"").arg(&file);
        let (mut server, _) =
            StdioServer::spawn(cmd, std::process::Stdio::null(), Arc::default()).unwrap();
        let first = server.send(cancel_of(1));
        let mut second = Box::pin(server.send(cancel_of(2)));
        // The later send is run first, as a task spawned later may be.
        let early = futures::poll!(&mut second);
        let (first, second) = tokio::join!(first, async move {
            match early {
                std::task::Poll::Ready(written) => written,
                std::task::Poll::Pending => second.await,
            }
        });
        first.unwrap();
        second.unwrap();
        server.close().await.unwrap();
        let written = std::fs::read_to_string(&file).unwrap();
        let ids: Vec<i64> = written
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["params"]["requestId"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ids, [1, 2], "{written}");
    }
}
