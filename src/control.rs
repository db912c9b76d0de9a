//! The control API: a run reachable while it runs. `troupe run` serves its
//! own run on a Unix socket in its run folder (`control.sock`, mode 0600);
//! `troupe serve` hosts many runs behind one socket (and a TCP port with a
//! token, and the dashboard). The CLI clients (`troupe submit`, `watch`,
//! `pending`, `approve`, `deny`, `answer`, `cancel`) speak HTTP/1.1 and
//! JSON to either, events as Server-Sent Events.
//! `docs/control-api.md` documents every endpoint, body and error.
//!
//! The event stream is read from the run's audit log, not from the event
//! bus: a client that stops reading then holds up nothing but its own
//! connection, and reconnecting from a `seq` (`Last-Event-ID`) loses
//! nothing the log has.

pub mod auth;
pub mod client;
mod connections;
pub mod dashboard;
pub mod hosted;
pub mod logview;
pub mod metrics;
mod peers;
pub mod reply;
pub mod server;
pub mod stream;

pub use client::{ControlClient, ControlError, find_run, find_socket};
pub use hosted::{Hosted, RunControl, Submission, Submitter};
pub use server::{ControlServer, Listen, SOCKET_NAME};
pub use stream::line_head;
