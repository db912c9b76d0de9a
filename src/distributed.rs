//! Fan-out siblings spread over machines through NATS JetStream: the
//! coordinator's executor (`troupe run --nats`), the worker
//! (`troupe worker`) and its intake of delivered tasks, the results a
//! resumed coordinator finds waiting, the connection and topology, and
//! what travels between them. See ARCHITECTURE.md, "Across machines".

/// The file in a distributed run's folder that names the NATS server its
/// siblings went to: a resume without `--nats` is refused by it, rather
/// than running here what the workers may have finished.
pub const RUN_MARK: &str = "nats-server";

/// Names `url` (without any user or password in it) in the folder of the
/// run whose log is `audit_path`.
pub fn mark_run(audit_path: &std::path::Path, url: Option<&str>) {
    let (Some(url), Some(dir)) = (url, audit_path.parent()) else {
        return;
    };
    if let Err(e) = std::fs::write(dir.join(RUN_MARK), without_credentials(url)) {
        say!("warning: cannot mark the run as distributed: {e}");
    }
}

/// `nats://user:pass@host:4222,nats://other` → `nats://host:4222,nats://other`.
pub fn without_credentials(urls: &str) -> String {
    urls.split(',')
        .map(|url| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}{}", &url[..scheme + 3], &url[at + 1..])
            }
            (None, Some(at)) => url[at + 1..].to_owned(),
            _ => url.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_servers_credentials_are_not_written_down() {
        assert_eq!(
            super::without_credentials(
                "nats://alice:s3cret@host:4222,tls://bob@other,nats://plain:4222"
            ),
            "nats://host:4222,tls://other,nats://plain:4222"
        );
        assert_eq!(super::without_credentials("user:pw@host"), "host");
    }
}
