//! The control API: a run reachable while it runs. `troupe run` serves its
//! own run on a Unix socket in its run folder (`control.sock`, mode 0600);
//! the CLI clients (`troupe watch`, `pending`, `approve`, `deny`,
//! `cancel`) speak HTTP/1.1 and JSON to it, events as Server-Sent Events.
//! `docs/control-api.md` documents every endpoint, body and error.
//!
//! The event stream is read from the run's audit log, not from the event
//! bus: a client that stops reading then holds up nothing but its own
//! connection, and reconnecting from a `seq` (`Last-Event-ID`) loses
//! nothing the log has.

pub mod client;
pub mod server;

pub use client::{ControlClient, ControlError, find_run, find_socket};
pub use server::{ControlServer, RunControl, SOCKET_NAME, line_head};
