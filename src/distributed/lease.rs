//! A worker's hold on one delivered message of the task queue, which may
//! carry several tasks ([`TASKS_PER_MESSAGE`]): renewed while any of them
//! is being accepted, waits for a slot or runs, and answered once, when
//! the last of them is settled — acknowledged if every one was reported,
//! handed back to the queue if one could not be.
//!
//! The tasks of it already reported are written down (a key of the
//! groups bucket, see `taking::Records`) before a hand-back and at each
//! renewal when more were reported since: the message's next delivery
//! runs only the others. A worker lost between two renewals leaves
//! those reported since the last to run again (the coordinator keeps the
//! first result of each).
//!
//! [`TASKS_PER_MESSAGE`]: super::wire::TASKS_PER_MESSAGE

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream::kv;
use tokio_util::sync::CancellationToken;

use super::nats::Nats;

/// One delivered message and the tasks of it not yet settled.
#[derive(Debug)]
pub struct Lease {
    client: async_nats::Client,
    reply: Subject,
    delivered: u64,
    /// Tasks of the message not yet settled.
    open: AtomicUsize,
    /// A task of it could not be reported.
    hand_back: AtomicBool,
    /// The tasks of it reported so far.
    reported: Arc<Reported>,
    /// Ends the renewals: cancelled once the message is answered, or
    /// when the last holder drops the lease unanswered (the server then
    /// delivers it again once the lease runs out).
    alive: CancellationToken,
}

/// The execution ids of a message's tasks reported so far, and the key
/// (bucket and name) they are written under.
#[derive(Debug)]
struct Reported {
    ids: Mutex<Vec<String>>,
    /// How many of `ids` the key holds; held while a write is under way,
    /// so that writes go one at a time. (A write given up on may still
    /// land late; lists only grow, so the worst is a task run again.)
    written: tokio::sync::Mutex<usize>,
    record: Option<(kv::Store, String)>,
}

impl Reported {
    /// Writes the ids down if more were reported since they last were,
    /// trying for at most `within`. `true` once the key holds them all.
    async fn write(&self, within: Duration) -> bool {
        let Some((bucket, key)) = &self.record else {
            return true;
        };
        let wrote = tokio::time::timeout(within, async {
            let mut written = self.written.lock().await;
            let ids = self.ids.lock().map(|ids| ids.clone()).unwrap_or_default();
            if ids.len() <= *written {
                return true;
            }
            let Ok(body) = serde_json::to_vec(&ids) else {
                return false;
            };
            let stored = bucket.put(key.as_str(), body.into()).await.is_ok();
            if stored {
                *written = ids.len();
            }
            stored
        });
        wrote.await.unwrap_or(false)
    }
}

impl Lease {
    /// Holds a message of `tasks` tasks (its `delivered`-th delivery),
    /// telling the server every third of `nats.lease` that it is still
    /// being worked on, and writing the tasks reported so far under
    /// `record` (a bucket and key; `None`: not written). Call inside a
    /// Tokio `LocalSet` (an actix system): the renewals run on it.
    pub fn hold(
        nats: &Nats,
        reply: Subject,
        delivered: u64,
        tasks: usize,
        record: Option<(kv::Store, String)>,
    ) -> Arc<Lease> {
        let alive = CancellationToken::new();
        let reported = Arc::new(Reported {
            ids: Mutex::default(),
            written: tokio::sync::Mutex::new(0),
            record,
        });
        {
            let alive = alive.clone();
            let client = nats.client.clone();
            let reply = reply.clone();
            let reported = Arc::clone(&reported);
            let every = (nats.lease / 3).max(Duration::from_millis(100));
            actix::spawn(async move {
                loop {
                    tokio::select! {
                        () = alive.cancelled() => return,
                        () = tokio::time::sleep(every) => {
                            let _ = client.publish(reply.clone(), "+WPI".into()).await;
                            // Bounded: a stalled write must not hold back
                            // the next renewal.
                            reported.write(every / 2).await;
                        }
                    }
                }
            });
        }
        Arc::new(Lease {
            client: nats.client.clone(),
            reply,
            delivered,
            open: AtomicUsize::new(tasks),
            hand_back: AtomicBool::new(false),
            reported,
            alive,
        })
    }

    /// How many times the queue has delivered the message.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Task `id` of the message is settled: its report stored
    /// (`reported`), or not. The last one answers the message: an
    /// acknowledgement when every report was stored, else the message
    /// goes back to the queue after [`hand_back_delay`], once the tasks
    /// reported are written down. A lease settled more often than it has
    /// tasks answers once.
    pub async fn settle(&self, id: &str, reported: bool) {
        if reported && let Ok(mut ids) = self.reported.ids.lock() {
            ids.push(id.to_owned());
        }
        self.settle_many(1, reported).await;
    }

    /// `tasks` tasks of the message settled at once, none of them to be
    /// written down as reported (see [`settle`]).
    ///
    /// [`settle`]: Lease::settle
    pub async fn settle_many(&self, tasks: usize, reported: bool) {
        if !reported {
            self.hand_back.store(true, Ordering::Release);
        }
        let last = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_sub(tasks.max(1))
            })
            == Ok(tasks.max(1));
        if !last {
            return;
        }
        let answer = if self.hand_back.load(Ordering::Acquire) {
            // Written down before the hand-back (renewed meanwhile): NATS
            // failing is why a message is handed back, so the write is
            // tried again for a while; without it the next delivery runs
            // the reported tasks again.
            let delay = hand_back_delay(self.delivered);
            for _ in 0..3 {
                if self.reported.write(delay).await {
                    break;
                }
            }
            self.alive.cancel();
            async_nats::jetstream::AckKind::Nak(Some(delay)).into()
        } else {
            self.alive.cancel();
            "+ACK".into()
        };
        let _ = self.client.publish(self.reply.clone(), answer).await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.alive.cancel();
    }
}

/// The first wait before a task handed back is delivered again.
const HAND_BACK_DELAY: Duration = Duration::from_secs(1);

/// How long a message handed back after its `delivered`-th delivery
/// waits before the next: 1, 2, 4, then 8 s. A task is handed back when
/// NATS could not take a report or read a mark, which is what a cluster
/// electing a stream's leader looks like for a few seconds; at once, the
/// message's five deliveries would be used up within the election and
/// its tasks abandoned (the three-node test saw it). With these waits the
/// five span 15 s.
pub fn hand_back_delay(delivered: u64) -> Duration {
    let doublings = delivered.saturating_sub(1).min(3) as u32;
    HAND_BACK_DELAY * 2u32.pow(doublings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_handed_back_waits_longer_each_time_fifteen_seconds_over_five_deliveries() {
        let waits: Vec<u64> = (1..=6).map(|d| hand_back_delay(d).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
        assert_eq!(waits[..4].iter().sum::<u64>(), 15);
    }
}
