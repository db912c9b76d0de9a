//! Blocking file-system work on tokio's blocking pool, told to stop (at
//! its next check) once the call awaiting it is cancelled or dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::ToolError;

/// Tells blocking work that its caller is gone (cancelled or dropped).
#[derive(Debug, Clone)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// A flag that is already raised, for tests of the blocking tools.
    #[cfg(test)]
    pub(crate) fn raised() -> Stop {
        Stop(Arc::new(AtomicBool::new(true)))
    }

    /// A flag not raised, for tests of the blocking tools.
    #[cfg(test)]
    pub(crate) fn lowered() -> Stop {
        Stop(Arc::new(AtomicBool::new(false)))
    }

    /// `Err(ToolCancelled)` once the caller is gone; call it in every loop.
    pub fn check(&self) -> Result<(), ToolError> {
        if self.0.load(Ordering::Relaxed) {
            Err(ToolError::cancelled())
        } else {
            Ok(())
        }
    }
}

/// Sets the stop flag when the awaiting future is dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs blocking file-system work on tokio's blocking pool. Dropping the
/// returned future (strict cancel) raises the stop flag, so walks end at
/// their next check instead of running on unowned.
pub(super) async fn blocking<F>(work: F) -> Result<String, ToolError>
where
    F: FnOnce(&Stop) -> Result<String, ToolError> + Send + 'static,
{
    let flag = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(Arc::clone(&flag));
    let stop = Stop(flag);
    match tokio::task::spawn_blocking(move || work(&stop)).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => Err(ToolError::terminal(
            "ToolPanicked",
            "the tool crashed while working",
        )),
        Err(_) => Err(ToolError::cancelled()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn dropping_blocking_work_raises_its_stop_flag() {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let call = tokio::spawn(blocking(move |stop| {
            let _ = started_tx.send(());
            while stop.check().is_ok() {
                std::thread::yield_now();
            }
            let _ = stopped_tx.send(());
            Ok(String::new())
        }));
        started_rx.await.unwrap();
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        stopped_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
}
