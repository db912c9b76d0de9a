//! Who may connect to a control socket: anyone the socket's mode lets in
//! (its owner), but no process this troupe started.
//!
//! A run's processes run as the same user as troupe: a `Bash` call, a hook,
//! an MCP server. The socket's mode 0600 keeps other users out, not them,
//! and the `Bash` sandbox confines writes and the network, not a connect
//! to a Unix socket. Through the control API such a process could approve
//! its own pending calls, or submit a run with `--no-sandbox` or a base URL
//! of its choosing to `troupe serve`, which would send the API key there.
//! So a connection whose peer (`SO_PEERCRED`) descends from this process,
//! or from any other troupe process (another run's shell must not drive
//! `troupe serve` either: it would start a run of its choosing, unsandboxed
//! and with the server's key), is answered `403 Control/InsideRun` and
//! closed. troupe is the subreaper of what it starts
//! (`process_group::adopt_orphans`), so a double fork or `setsid` does not
//! take a process out of its descent. What cannot be traced is refused too
//! (fails closed): a peer gone before it was traced (a command that
//! connects, writes its request and exits), a chain of parents longer than
//! any real one, a local TCP socket that is gone. A local TCP socket whose
//! holder cannot be found (a non-dumpable troupe client's, whose
//! descriptors its user cannot read) is let in: a socket passed between
//! processes as the trace looks is not seen (SECURITY.md says so).
//!
//! A TCP listener is guarded by its token, but a command may read the
//! token's file as its user can; so a TCP connection made from this
//! machine is traced too: its socket in `/proc/net/tcp{,6}`, and whether
//! a process troupe started holds it.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::tools::process_group::{ProcStat, proc_stat};

/// Connections one listener holds open at once, at most: past them the
/// next waits in the kernel's backlog until one closes, rather than each
/// taking a file descriptor the runs this process hosts need.
fn places() -> Arc<Semaphore> {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let most = usize::try_from(soft / 4)
        .unwrap_or(usize::MAX)
        .clamp(16, 1024);
    Arc::new(Semaphore::new(most))
}

/// An accepted connection, holding its listener's place until it closes.
pub(super) struct Held<S> {
    stream: S,
    _place: OwnedSemaphorePermit,
}

impl<S: AsyncRead + Unpin> AsyncRead for Held<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Held<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A Unix listener that turns away this process's descendants.
pub(super) struct Outsiders {
    listener: UnixListener,
    places: Arc<Semaphore>,
}

impl Outsiders {
    pub(super) fn new(listener: UnixListener) -> Outsiders {
        Outsiders {
            listener,
            places: places(),
        }
    }
}

impl axum::serve::Listener for Outsiders {
    type Io = Held<UnixStream>;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let place = wait_for_place(&self.places).await;
            let (stream, addr) = axum::serve::Listener::accept(&mut self.listener).await;
            let inside = stream
                .peer_cred()
                .ok()
                .and_then(|cred| cred.pid())
                .is_none_or(|pid| descends_from(pid, me(), Path::new("/proc")));
            if !inside {
                let stream = Held {
                    stream,
                    _place: place,
                };
                return (stream, addr);
            }
            tokio::spawn(refuse(Held {
                stream,
                _place: place,
            }));
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// One of `places`; the semaphore is never closed.
async fn wait_for_place(places: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    match Arc::clone(places).acquire_owned().await {
        Ok(place) => place,
        Err(_) => std::future::pending().await,
    }
}

/// A TCP listener that turns away connections this process's descendants
/// made.
pub(super) struct TcpOutsiders {
    listener: TcpListener,
    places: Arc<Semaphore>,
}

impl TcpOutsiders {
    pub(super) fn new(listener: TcpListener) -> TcpOutsiders {
        TcpOutsiders {
            listener,
            places: places(),
        }
    }
}

impl axum::serve::Listener for TcpOutsiders {
    type Io = Held<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let place = wait_for_place(&self.places).await;
            let (stream, addr) = axum::serve::Listener::accept(&mut self.listener).await;
            // The trace reads every process's descriptors: off the
            // accepting task, which the listener's other clients wait on.
            let inside = match stream.local_addr() {
                Ok(ours) => tokio::task::spawn_blocking(move || {
                    made_inside(addr, ours, me(), Path::new("/proc"))
                })
                .await
                .unwrap_or(true),
                Err(_) => false,
            };
            if !inside {
                let stream = Held {
                    stream,
                    _place: place,
                };
                return (stream, addr);
            }
            tokio::spawn(refuse(Held {
                stream,
                _place: place,
            }));
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// Whether the TCP connection from `peer` to `ours` may have been made by
/// a process troupe started: one of them holds its socket, or a local
/// peer's socket is gone from the tables (inode 0) or not in them. A
/// peer on another machine is not traced (its token decides), nor is
/// anything when there is no procfs.
fn made_inside(peer: SocketAddr, ours: SocketAddr, ancestor: i32, proc: &Path) -> bool {
    if proc_stat(proc, ancestor).is_none() {
        return false;
    }
    let ip = peer.ip().to_canonical();
    let local = ip.is_loopback() || ip == ours.ip().to_canonical();
    match socket_inode(peer, ours, proc) {
        Some(0) => true,
        // A socket no process can be found holding is let in: a holder
        // this user cannot read (a troupe client, which makes itself
        // non-dumpable; an ssh tunnel) is the common case, and refusing it
        // refused the user's own `troupe submit`. A socket passed between
        // processes as the trace looks goes unseen that way (SECURITY.md).
        Some(inode) => holders(inode, proc)
            .iter()
            .any(|&pid| descends_from(pid, ancestor, proc)),
        None => local,
    }
}

/// The processes that hold socket `inode` open, of those whose
/// descriptors can be read (this user's).
fn holders(inode: u64, proc: &Path) -> Vec<i32> {
    let wanted = format!("socket:[{inode}]");
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_dir(proc.join(pid.to_string()).join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|to| to.as_os_str() == wanted.as_str())
                })
            })
        })
        .collect()
}

/// The inode of this machine's TCP socket at `peer` connected to `ours`
/// (the other end of an accepted connection), from `<proc>/net/tcp` and
/// `tcp6`; `None` when it is not on this machine (or cannot be read).
fn socket_inode(peer: SocketAddr, ours: SocketAddr, proc: &Path) -> Option<u64> {
    // A dual-stack listener sees an IPv4 peer as `::ffff:a.b.c.d`; the
    // peer's own socket is IPv4.
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (peer, ours) = (canonical(peer), canonical(ours));
    let (local, remote) = (proc_addr(peer), proc_addr(ours));
    ["net/tcp", "net/tcp6"].iter().find_map(|table| {
        let text = std::fs::read_to_string(proc.join(table)).ok()?;
        text.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (l, r, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
            (l.eq_ignore_ascii_case(&local) && r.eq_ignore_ascii_case(&remote))
                .then(|| inode.parse().ok())
                .flatten()
        })
    })
}

/// An address as `/proc/net/tcp{,6}` writes it: each 32-bit word of the
/// address in this machine's byte order, in hex, then the port.
fn proc_addr(addr: SocketAddr) -> String {
    let words: Vec<u32> = match addr.ip() {
        std::net::IpAddr::V4(ip) => vec![u32::from_ne_bytes(ip.octets())],
        std::net::IpAddr::V6(ip) => ip
            .octets()
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
    };
    let mut text: String = words.iter().map(|w| format!("{w:08X}")).collect();
    text.push_str(&format!(":{:04X}", addr.port()));
    text
}

/// This process's id, as procfs writes ids.
fn me() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// Parents walked from a Unix peer: far past any real process tree.
const MOST_PARENTS: usize = 256;

/// What a refused peer reads before the connection closes: the API's
/// error shape, so that a client says why.
const REFUSED: &str = "{\"error\":{\"code\":\"Control/InsideRun\",\"message\":\"a process a troupe run started cannot use that run's control API\"}}";

/// Answers the request's head (read first, so that the peer is not cut
/// off mid-write) with the refusal, then closes; two seconds at most.
async fn refuse(mut stream: impl AsyncRead + AsyncWrite + Unpin) {
    use tokio::io::AsyncReadExt;
    let reply = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{REFUSED}",
        REFUSED.len()
    );
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while head.len() < 64 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Whether process `pid` may have been started by troupe: a descendant
/// of `ancestor` (not `ancestor` itself), or of any other troupe process
/// (another run's shell, hook or MCP server), by the parents `proc` (a
/// procfs) records. What cannot be told is taken as one: a process gone
/// before it was traced (it may have connected, written its request and
/// exited), one that cannot be read, a chain past [`MOST_PARENTS`] or a
/// loop. Without a procfs (no entry for `ancestor`) nothing is traced.
pub(super) fn descends_from(pid: i32, ancestor: i32, proc: &Path) -> bool {
    if proc_stat(proc, ancestor).is_none() {
        return false;
    }
    let mut at = pid;
    for _ in 0..MOST_PARENTS {
        // Pid 0: a peer in a pid namespace this one cannot see, which no
        // descendant is; 1 is init.
        if at <= 1 {
            return false;
        }
        let Some(ProcStat { parent, .. }) = proc_stat(proc, at) else {
            return true;
        };
        if parent == ancestor || (parent > 1 && is_troupe(parent, proc)) {
            return true;
        }
        at = parent;
    }
    true
}

/// Whether process `pid` runs a troupe binary: its executable is named
/// `troupe` (a binary replaced since reads `troupe (deleted)`), or is the
/// very file this process runs. (A sealed troupe re-executes itself
/// through `/proc/self/exe`, so its command name says `exe`; the link to
/// its executable does not.) A user's own `troupe-deploy` script is not
/// taken for one, nor another user's process, whose link cannot be read.
fn is_troupe(pid: i32, proc: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(exe) = std::fs::read_link(proc.join(pid.to_string()).join("exe")) else {
        // A troupe makes itself non-dumpable, and its `exe` link cannot be
        // read then, even by its user: its command line can.
        return std::fs::read(proc.join(pid.to_string()).join("cmdline")).is_ok_and(|line| {
            let mut args = line.split(|b| *b == 0);
            let first = args.next().unwrap_or_default();
            let named = first.rsplit(|b| *b == b'/').next() == Some(b"troupe".as_slice());
            let sealed = args
                .next()
                .is_some_and(|a| a.starts_with(b"--sealed-env-fd="));
            named || sealed
        });
    };
    let named = exe
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.trim_end_matches(" (deleted)") == "troupe");
    let mine = || {
        let (Ok(theirs), Ok(ours)) = (
            std::fs::metadata(proc.join(pid.to_string()).join("exe")),
            std::fs::metadata("/proc/self/exe"),
        ) else {
            return false;
        };
        theirs.dev() == ours.dev() && theirs.ino() == ours.ino()
    };
    named || mine()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `command` and waits for the first line it prints.
    fn first_line(command: &mut std::process::Command) -> (std::process::Child, String) {
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        (child, line)
    }

    #[test]
    fn a_child_and_a_grandchild_descend_and_the_process_itself_and_its_parent_do_not() {
        use std::os::unix::process::CommandExt;
        let me = me();
        let proc = Path::new("/proc");
        let (mut child, line) = first_line(
            std::process::Command::new("sh")
                .arg("-c")
                .arg("sleep 30 & echo $!; wait")
                .process_group(0),
        );
        let grandchild: i32 = line.trim().parse().unwrap();
        let child_pid = i32::try_from(child.id()).unwrap();
        assert!(descends_from(child_pid, me, proc));
        assert!(descends_from(grandchild, me, proc));
        assert!(!descends_from(me, me, proc));
        let parent = proc_stat(proc, me).unwrap().parent;
        assert!(!descends_from(parent, me, proc));
        assert!(!descends_from(1, me, proc));
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child_pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
    }

    /// A TCP connection this process makes is traced to it, and one a
    /// child makes to the child: what the listener refuses.
    #[test]
    fn a_connection_is_traced_to_the_process_that_made_it() {
        let proc = Path::new("/proc");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = listener.local_addr().unwrap();
        // Made here: this process holds it, no descendant does.
        let _mine = std::net::TcpStream::connect(ours).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        let inode = socket_inode(peer, ours, proc).expect("found in /proc/net/tcp");
        assert_eq!(holders(inode, proc), [me()]);
        assert!(!made_inside(peer, ours, me(), proc));
        // Made by a child, which holds it open.
        let (mut child, _) = first_line(std::process::Command::new("python3").arg("-c").arg(
            format!(
                "import socket, sys, time\ns = socket.create_connection(('127.0.0.1', {}))\nprint('on', flush=True)\ntime.sleep(30)",
                ours.port()
            ),
        ));
        let (_theirs, peer) = listener.accept().unwrap();
        let inode = socket_inode(peer, ours, proc).expect("found in /proc/net/tcp");
        let holders = holders(inode, proc);
        assert_eq!(holders.len(), 1);
        assert!(descends_from(holders[0], me(), proc));
        assert!(made_inside(peer, ours, me(), proc));
        // A peer that is not on this machine's tables: none.
        let elsewhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(socket_inode(elsewhere, ours, proc), None);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A connection past the listener's places waits, unaccepted, until
    /// one closes.
    #[tokio::test]
    async fn a_listener_holds_at_most_its_places_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut outsiders = Outsiders {
            listener: UnixListener::bind(&path).unwrap(),
            places: Arc::new(Semaphore::new(1)),
        };
        let _a = UnixStream::connect(&path).await.unwrap();
        let (first, _) = axum::serve::Listener::accept(&mut outsiders).await;
        let _b = UnixStream::connect(&path).await.unwrap();
        let mut second = Box::pin(axum::serve::Listener::accept(&mut outsiders));
        assert!(futures::poll!(second.as_mut()).is_pending());
        drop(first);
        let (_second, _) = second.await;
    }

    /// Writes `<pid>/stat` files into a fake procfs.
    fn fake_proc(stats: &[(i32, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, stat) in stats {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), stat).unwrap();
        }
        dir
    }

    /// What cannot be traced is refused: a loop, garbage, a peer gone
    /// before it was traced, a chain deeper than any real one.
    #[test]
    fn what_cannot_be_traced_counts_as_a_descendant() {
        // 99 is troupe; 10 -> 11 -> 10 a loop; 12 garbage; 20 -> 21 -> 1
        // an outsider.
        let dir = fake_proc(&[
            (99, "99 (troupe) S 1 1 1"),
            (10, "10 (a) S 11 1 1"),
            (11, "11 (b) S 10 1 1"),
            (12, "12 (c) S x"),
            (20, "20 (sh) S 21 1 1"),
            (21, "21 (login) S 1 1 1"),
        ]);
        assert!(descends_from(10, 99, dir.path()), "a loop");
        assert!(descends_from(12, 99, dir.path()), "unreadable");
        assert!(descends_from(13, 99, dir.path()), "gone");
        assert!(!descends_from(20, 99, dir.path()), "an outsider");
        assert!(!descends_from(0, 99, dir.path()), "another pid namespace");
        assert!(descends_from(10, 11, dir.path()));
        // A chain of 300 parents, ending at init, is past what is walked.
        let mut chain: Vec<(i32, String)> = (1000..1300)
            .map(|pid| (pid, format!("{pid} (sh) S {} 1 1", pid + 1)))
            .collect();
        chain.push((1300, "1300 (sh) S 1 1 1".to_owned()));
        chain.push((99, "99 (troupe) S 1 1 1".to_owned()));
        let stats: Vec<(i32, &str)> = chain.iter().map(|(p, s)| (*p, s.as_str())).collect();
        let deep = fake_proc(&stats);
        assert!(descends_from(1000, 99, deep.path()), "too deep to tell");
        assert!(!descends_from(1100, 99, deep.path()), "200 deep is traced");
        // No procfs at all: nothing can be traced, nothing is refused.
        let none = tempfile::tempdir().unwrap();
        assert!(!descends_from(10, 99, none.path()));
    }

    /// A process another troupe started (another run's shell, under
    /// `troupe serve`) is refused as this one's own are; one whose
    /// ancestors run no troupe is not.
    #[test]
    fn a_process_any_troupe_started_counts_as_inside() {
        // 99 is this troupe; 31 another (`/opt/bin/troupe`), 30 its shell;
        // 33 a login shell, 32 its child.
        let dir = fake_proc(&[
            (99, "99 (troupe) S 1 1 1"),
            (30, "30 (bash) S 31 1 1"),
            (31, "31 (exe) S 1 1 1"),
            (32, "32 (curl) S 33 1 1"),
            (33, "33 (bash) S 1 1 1"),
        ]);
        std::os::unix::fs::symlink("/opt/bin/troupe", dir.path().join("31/exe")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/bash", dir.path().join("33/exe")).unwrap();
        // A script of the user's named like troupe is not troupe.
        std::fs::create_dir_all(dir.path().join("34")).unwrap();
        std::fs::write(dir.path().join("34/stat"), "34 (troupe-deploy) S 1 1 1").unwrap();
        std::fs::create_dir_all(dir.path().join("35")).unwrap();
        std::fs::write(dir.path().join("35/stat"), "35 (curl) S 34 1 1").unwrap();
        std::os::unix::fs::symlink("/home/me/bin/troupe-deploy", dir.path().join("34/exe"))
            .unwrap();
        assert!(
            !descends_from(35, 99, dir.path()),
            "a troupe-deploy script's child"
        );
        assert!(descends_from(30, 99, dir.path()), "another troupe's shell");
        assert!(!descends_from(32, 99, dir.path()), "a login shell's child");
        assert!(
            !descends_from(31, 99, dir.path()),
            "a troupe itself (a CLI client)"
        );
    }

    /// A local TCP peer whose socket no process holds (it wrote its request
    /// and exited) or that is not in the tables is refused; a remote one is
    /// left to its token.
    #[test]
    fn an_untraceable_local_connection_is_refused() {
        let dir = fake_proc(&[(99, "99 (troupe) S 1 1 1")]);
        std::fs::create_dir_all(dir.path().join("net")).unwrap();
        let ours: SocketAddr = "127.0.0.1:7700".parse().unwrap();
        let orphan: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let table = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: {} {} 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000000000000\n",
            proc_addr(orphan),
            proc_addr(ours)
        );
        std::fs::write(dir.path().join("net/tcp"), table).unwrap();
        assert!(made_inside(orphan, ours, 99, dir.path()), "held by none");
        let missing: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        assert!(
            made_inside(missing, ours, 99, dir.path()),
            "not in the tables"
        );
        let remote: SocketAddr = "192.0.2.7:40002".parse().unwrap();
        assert!(!made_inside(remote, ours, 99, dir.path()));
    }
}
