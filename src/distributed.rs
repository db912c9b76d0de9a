//! Fan-out siblings spread over machines through NATS JetStream: the
//! coordinator's executor (`troupe run --nats`), the worker
//! (`troupe worker`) and its intake of delivered tasks, the results a
//! resumed coordinator finds waiting, the connection and topology, and
//! what travels between them. See ARCHITECTURE.md, "Across machines".

/// The file in a distributed run's folder that names the NATS server its
/// siblings went to: a resume without `--nats` is refused by it, rather
/// than running here what the workers may have finished.
pub const RUN_MARK: &str = "nats-server";

/// Names `url` (a user, password or token in it shown as `***`:
/// [`nats::shown_url`]) in the folder of the run whose log is `audit_path`.
pub fn mark_run(audit_path: &std::path::Path, url: Option<&str>) {
    let (Some(url), Some(dir)) = (url, audit_path.parent()) else {
        return;
    };
    if let Err(e) = std::fs::write(dir.join(RUN_MARK), nats::shown_url(url)) {
        say!("warning: cannot mark the run as distributed: {e}");
    }
}

pub mod arrived;
mod collected;
pub mod coordinator;
mod groups;
pub mod intake;
pub mod lease;
pub mod nats;
pub mod outbox;
pub mod stored_context;
mod taker;
pub mod taking;
pub mod wire;
pub mod worker;

pub use coordinator::RemoteSiblings;
pub use nats::{Nats, NatsArgs, NatsError};
