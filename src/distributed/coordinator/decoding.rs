//! Reading the workers' report messages ahead of the coordinator's loop,
//! decoded on the run's other arbiters.
//!
//! Decoding a report message (its reports, each exited sibling's result
//! and its events read back from their lines) was two thirds of the
//! coordinator thread's instructions (callgrind: ~100 000 of ~157 000 a
//! sibling), and that thread sets a distributed run's pace. In a
//! distributed run the run's arbiters are otherwise idle, since its
//! siblings run on the workers. So a reader task takes each message off
//! the report stream as it comes, hands its payload to the next of those
//! arbiters, and queues the answer's receiver in arrival order; the loop
//! takes them from that queue, so messages are settled in the order the
//! stream gave them whichever decoder finishes first. With no other
//! arbiter (`--threads 1`), the reader decodes them itself.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use actix::ArbiterHandle;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::super::outbox;
use super::super::wire::Report;

/// The reports of one message, or why each could not be read.
pub(super) type Decoded = Vec<Result<Report, serde_json::Error>>;

/// Messages decoded (or being decoded) ahead of the loop, at most.
pub(super) const READ_AHEAD: usize = 64;

/// One message, in the order the stream gave it: its acknowledgement, its
/// payload (shared, not copied) and its reports once decoded.
pub(super) struct Incoming<A> {
    pub(super) acker: A,
    payload: Bytes,
    reports: oneshot::Receiver<Decoded>,
}

impl<A> Incoming<A> {
    /// The message's reports: as its decoder answered, or decoded here
    /// when the answer was lost (its arbiter stopped before it ran the
    /// job, as the run ends). A message is never settled unread.
    pub(super) async fn reports(&mut self) -> Decoded {
        match (&mut self.reports).await {
            Ok(decoded) => decoded,
            Err(_) => decode(&self.payload),
        }
    }
}

/// Decodes a payload; a decoder that panics answers with that as the
/// message's one error (the message is skipped, as one that cannot be
/// read, rather than taking the coordinator down). An exited sibling's
/// result is read packed here (`Kept::read_packed`), off the
/// coordinator's loop, as a local sibling's is packed by its execution:
/// the coordinator keeps every one until the run ends.
fn decode(payload: &[u8]) -> Decoded {
    catch_unwind(AssertUnwindSafe(|| outbox::decode(payload))).unwrap_or_else(|_| {
        vec![Err(serde::de::Error::custom(
            "the report decoder panicked on this message",
        ))]
    })
}

/// The run's arbiters other than the coordinator's, taken in turn: where
/// payloads are decoded, and tasks published (`Coordinator::publish`).
#[derive(Debug, Clone)]
pub(super) struct Helpers {
    arbiters: Vec<ArbiterHandle>,
    next: usize,
}

impl Helpers {
    pub(super) fn new(arbiters: Vec<ArbiterHandle>) -> Helpers {
        Helpers { arbiters, next: 0 }
    }

    /// The next arbiter; `None` when the run has no other.
    pub(super) fn next(&mut self) -> Option<&ArbiterHandle> {
        if self.arbiters.is_empty() {
            return None;
        }
        let at = self.next % self.arbiters.len();
        self.next = self.next.wrapping_add(1);
        Some(&self.arbiters[at])
    }

    /// Decodes `payload` on the next arbiter (here, when there is none);
    /// the answer comes on the receiver. An arbiter that has stopped drops
    /// the job and with it the answer: [`Incoming::reports`] then decodes
    /// the payload itself.
    pub(super) fn decode(&mut self, payload: Bytes) -> oneshot::Receiver<Decoded> {
        let (tx, rx) = oneshot::channel();
        let job = move || {
            let _ = tx.send(decode(&payload));
        };
        match self.next() {
            Some(arbiter) => {
                let _ = arbiter.spawn_fn(job);
            }
            None => job(),
        }
        rx
    }
}

/// Runs `job` on `helper` and waits for its answer; runs it here when
/// there is no helper, or when the helper stopped before it answered (its
/// run is ending): the job may then have run twice, once in part, so it
/// must be one that can (a publish with its `Nats-Msg-Id` is).
pub(super) async fn on_helper<T, F, Fut>(helper: Option<ArbiterHandle>, job: F) -> T
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let job = Arc::new(job);
    if let Some(helper) = helper {
        let (answer, answered) = oneshot::channel();
        let there = Arc::clone(&job);
        let sent = helper.spawn(async move {
            let _ = answer.send(there().await);
        });
        if sent && let Ok(outcome) = answered.await {
            return outcome;
        }
    }
    job().await
}

/// Takes messages off `stream` until it ends or the loop stops reading
/// (drops the receiver of `out`): each is split into its payload and its
/// acknowledgement (`split`), its payload handed to `decoders`, and both
/// queued on `out` in the stream's order. The end of the stream is `out`
/// closing.
pub(super) async fn read_ahead<M, E, A>(
    mut stream: impl Stream<Item = Result<M, E>> + Unpin,
    split: impl Fn(M) -> (Bytes, A),
    mut decoders: Helpers,
    out: mpsc::Sender<Incoming<A>>,
) {
    loop {
        let next = tokio::select! {
            () = out.closed() => return,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(message)) => {
                let (payload, acker) = split(message);
                let reports = decoders.decode(payload.clone());
                let incoming = Incoming {
                    acker,
                    payload,
                    reports,
                };
                if out.send(incoming).await.is_err() {
                    return;
                }
            }
            // A message the client could not take: the stream goes on.
            Some(Err(_)) => continue,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::wire::Report;

    fn barrier(turn: u64) -> Bytes {
        Bytes::from(serde_json::to_vec(&vec![Report::Barrier { turn }]).unwrap())
    }

    /// Messages decoded on three arbiters, some slower than others, come
    /// to the loop in the stream's order, each with its own reports.
    #[test]
    fn decoded_on_other_arbiters_in_the_streams_order() {
        let system = actix::System::new();
        system.block_on(async {
            let arbiters: Vec<actix::Arbiter> = (0..3).map(|_| actix::Arbiter::new()).collect();
            let decoders = Helpers::new(arbiters.iter().map(actix::Arbiter::handle).collect());
            // The first arbiter is held busy until the others are done.
            let (release, held) = std::sync::mpsc::channel::<()>();
            arbiters[0].spawn_fn(move || {
                let _ = held.recv();
            });
            let messages: Vec<Result<(u64, Bytes), ()>> = (0..30)
                .map(|turn| {
                    if turn == 7 {
                        Err(())
                    } else {
                        Ok((turn, barrier(turn)))
                    }
                })
                .collect();
            let (tx, mut rx) = mpsc::channel(READ_AHEAD);
            actix::spawn(read_ahead(
                futures::stream::iter(messages),
                |(turn, payload)| (payload, turn),
                decoders,
                tx,
            ));
            let mut seen = Vec::new();
            let mut first = true;
            while let Some(mut incoming) = rx.recv().await {
                if first {
                    first = false;
                    release.send(()).unwrap();
                }
                let reports = incoming.reports().await;
                let acker = incoming.acker;
                let turns: Vec<u64> = reports
                    .into_iter()
                    .map(|r| match r.unwrap() {
                        Report::Barrier { turn } => turn,
                        other => panic!("not the message's report: {other:?}"),
                    })
                    .collect();
                assert_eq!(turns, [acker], "each message its own reports");
                seen.push(acker);
            }
            let expected: Vec<u64> = (0..30).filter(|t| *t != 7).collect();
            assert_eq!(seen, expected, "the stream's order, the bad item skipped");
            for a in arbiters {
                a.stop();
            }
        });
    }

    /// An arbiter that stopped before it decoded a message: the message
    /// is decoded where it is read, not lost (or acknowledged unread).
    #[test]
    fn a_message_whose_decoder_stopped_is_decoded_where_it_is_read() {
        let system = actix::System::new();
        system.block_on(async {
            let arbiter = actix::Arbiter::new();
            let handle = arbiter.handle();
            arbiter.stop();
            arbiter.join().unwrap();
            let mut decoders = Helpers::new(vec![handle]);
            let payload = barrier(9);
            let mut incoming = Incoming {
                acker: (),
                reports: decoders.decode(payload.clone()),
                payload,
            };
            let reports = incoming.reports().await;
            assert!(matches!(reports[..], [Ok(Report::Barrier { turn: 9 })]));
        });
    }

    /// A job sent to a helper runs there; with a helper that has stopped
    /// (or none), it runs here, and its answer is not lost either way.
    #[test]
    fn a_job_runs_on_its_helper_and_here_when_the_helper_has_stopped() {
        let system = actix::System::new();
        system.block_on(async {
            let here = std::thread::current().id();
            let ran_on = || async { std::thread::current().id() };
            let live = actix::Arbiter::new();
            let helper = live.handle();
            let there = on_helper(Some(helper.clone()), ran_on).await;
            assert_ne!(there, here, "on the helper's thread");
            live.stop();
            live.join().unwrap();
            let stopped = on_helper(Some(helper), ran_on).await;
            assert_eq!(stopped, here, "the helper had stopped: here");
            assert_eq!(on_helper(None, ran_on).await, here, "no helper: here");
        });
    }

    /// An exited sibling's result comes out of the decoder packed, and
    /// reads back as the worker sent it.
    #[test]
    fn an_exited_siblings_result_is_packed_where_it_is_decoded() {
        use crate::runtime::result::{Kept, StageResult};
        let parsed = serde_json::json!({"item": 3, "x": [1.5, "é"]});
        let sent = Arc::new(StageResult::ok("worker", "r/worker#3/1", parsed));
        let report = Report::Exited {
            stage_execution_id: "r/worker#3/1".into(),
            turn: 2,
            unit: 3,
            worker: "w1".into(),
            delivered: 1,
            result: Kept::Whole(Arc::clone(&sent)),
            events: Vec::new(),
        };
        let payload = serde_json::to_vec(&vec![report]).unwrap();
        let decoded = decode(&payload);
        match &decoded[..] {
            [Ok(Report::Exited { result, .. })] => {
                assert!(matches!(result, Kept::Packed(_)));
                assert_eq!(*result.result(), *sent);
            }
            other => panic!("not the exited report: {other:?}"),
        }
    }

    #[test]
    fn without_other_arbiters_it_decodes_in_place() {
        let mut decoders = Helpers::new(Vec::new());
        let mut rx = decoders.decode(barrier(3));
        let reports = rx.try_recv().expect("answered at once");
        assert!(matches!(reports[..], [Ok(Report::Barrier { turn: 3 })]));
        let mut rx = decoders.decode(Bytes::from_static(b"{not json"));
        assert!(rx.try_recv().expect("answered")[0].is_err());
    }
}
