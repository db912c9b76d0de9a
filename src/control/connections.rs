//! Serving a listener's connections: HTTP/1 by hyper, with the deadline
//! `axum::serve` leaves out.
//!
//! `axum::serve` builds hyper's connection without a timer, and without
//! one hyper's 30-second deadline on a request's head does nothing: a
//! client that opened a connection and sent half a request line held it,
//! and one of its listener's places (see `peers`), for ever; a few hundred
//! such clients and no one could reach the run. Here every connection has
//! the timer, so a head (the first, or the next on a kept-alive
//! connection) not complete within [`HEAD_TIMEOUT`] of when the server
//! began reading it closes the connection. A response being written, an
//! event stream above all, is not a head being read: it runs as long as
//! it runs.

use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How long a client has to send a request's head.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener`'s connections until `stopped` turns true (or
/// its sender is gone): then accepts no more, lets each open connection
/// finish the response it is writing, and returns once all have closed.
pub(super) async fn serve<L: Listener>(
    mut listener: L,
    app: Router,
    mut stopped: watch::Receiver<bool>,
    head_timeout: Duration,
) {
    let mut open = JoinSet::new();
    loop {
        let (io, _) = tokio::select! {
            biased;
            _ = stopped.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        while open.try_join_next().is_some() {}
        open.spawn(connection(io, app.clone(), stopped.clone(), head_timeout));
    }
    drop(listener);
    while open.join_next().await.is_some() {}
}

/// One connection, to its end or, once `stopped`, to the end of the
/// response in flight.
async fn connection<I>(
    io: I,
    app: Router,
    mut stopped: watch::Receiver<bool>,
    head_timeout: Duration,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout);
    let served = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    let mut served = std::pin::pin!(served);
    tokio::select! {
        _ = served.as_mut() => return,
        _ = stopped.wait_for(|s| *s) => served.as_mut().graceful_shutdown(),
    }
    let _ = served.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{UnixListener, UnixStream};

    /// Serves a one-route app on a fresh socket with `head_timeout`.
    fn serving(
        head_timeout: Duration,
    ) -> (tempfile::TempDir, std::path::PathBuf, watch::Sender<bool>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        let app = Router::new().route("/", get(|| async { "hello" }));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve(listener, app, stopped, head_timeout));
        (dir, path, stop)
    }

    /// Reads until the server closes; what it wrote.
    async fn to_end(stream: &mut UnixStream) -> String {
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut got));
        read.await
            .expect("the server closed the connection")
            .unwrap();
        String::from_utf8_lossy(&got).into_owned()
    }

    /// A head never finished is closed on, unanswered; the listener still
    /// serves the next client.
    #[tokio::test]
    async fn a_head_left_unfinished_closes_its_connection() {
        let (_dir, path, _stop) = serving(Duration::from_millis(200));
        let mut slow = UnixStream::connect(&path).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        assert_eq!(to_end(&mut slow).await, "");
        // A connection that never sends a byte is closed the same way.
        let mut silent = UnixStream::connect(&path).await.unwrap();
        assert_eq!(to_end(&mut silent).await, "");
        let mut prompt = UnixStream::connect(&path).await.unwrap();
        prompt
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = to_end(&mut prompt).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("hello"), "{answer}");
    }

    /// Idle between two requests is reading the next head: a kept-alive
    /// connection is answered, then closed once the deadline passes with
    /// no next request.
    #[tokio::test]
    async fn a_kept_alive_connection_idle_past_the_deadline_is_closed() {
        let (_dir, path, _stop) = serving(Duration::from_millis(200));
        let mut client = UnixStream::connect(&path).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = to_end(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(!answer.contains("connection: close"), "{answer}");
    }

    /// Once stopped, an idle connection is closed and the loop returns.
    #[tokio::test]
    async fn stopping_closes_idle_connections_and_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        let app = Router::new().route("/", get(|| async { "hello" }));
        let (stop, stopped) = watch::channel(false);
        let served = tokio::spawn(serve(listener, app, stopped, HEAD_TIMEOUT));
        let mut idle = UnixStream::connect(&path).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 15];
        idle.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200 OK");
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(60), served)
            .await
            .expect("the loop returned")
            .unwrap();
        let rest = to_end(&mut idle).await;
        assert!(rest.ends_with("hello"), "{rest}");
    }
}
