//! How a worker's fetch loop takes what it was delivered ([`Taker`]): a
//! message's tasks offered to its free slots, those past them held for a
//! slot or put back on the queue (`taking`), the accepted ones reported
//! and handed to the worker's host to start (`intake`).

use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::{Semaphore, watch};

use super::intake::{Buckets, Counted, Intake, Offer, WorkerConfig, accept_all};
use super::nats::Nats;
use super::outbox::Outbox;
use super::taking::{Delivered, Held, Past, another_waits, offers};

/// Start a delivered task.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct Start(pub(super) Offer);

/// Counts what the fetch loop decided alone.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct Count(pub(super) Counted);

/// What the fetch loop's tasks share to take what it was delivered.
#[derive(Clone)]
pub(super) struct Taker {
    pub(super) nats: Nats,
    /// The workers' shared consumer: whether another worker waits for a
    /// task is asked of it (see [`Past::hold`]).
    pub(super) consumer: async_nats::jetstream::consumer::PullConsumer,
    pub(super) config: WorkerConfig,
    pub(super) buckets: Arc<Buckets>,
    pub(super) outbox: Outbox,
    /// Where the tasks to start go, and the counts of those settled
    /// without running: the worker's host.
    pub(super) starts: Recipient<Start>,
    pub(super) counts: Recipient<Count>,
    pub(super) slots: Arc<Semaphore>,
    pub(super) held: Arc<Held>,
    /// Set when the worker drains: held tasks go back on the queue.
    pub(super) drain: watch::Receiver<bool>,
}

impl Taker {
    /// A delivered message's tasks: offers for the free slots of
    /// `permits`, and those past them (see [`offers`]), held while no
    /// more than `max_siblings` are.
    pub(super) fn offers(
        &self,
        message: Delivered,
        permits: &mut Vec<tokio::sync::OwnedSemaphorePermit>,
    ) -> (Vec<Offer>, Option<Past>) {
        let room = self
            .config
            .max_siblings
            .max(1)
            .saturating_sub(self.held.count());
        offers(
            &self.nats,
            &self.buckets,
            message,
            permits,
            &self.held,
            room,
        )
    }

    /// Accepts `offers` now, and those of `past` each as it gets a slot
    /// while held; what does not goes back on the queue (see
    /// [`Past::hold`]).
    pub(super) async fn take(self, offers: Vec<Offer>, past: Option<Past>) {
        let later = async {
            let Some(past) = past else {
                return;
            };
            let accept = |offers: Vec<Offer>| {
                let taker = self.clone();
                async move { taker.accept(offers).await }
            };
            let elsewhere = || another_waits(&self.consumer);
            past.hold(
                &self.nats,
                &self.buckets,
                &self.slots,
                self.drain.clone(),
                accept,
                elsewhere,
            )
            .await;
        };
        futures::future::join(self.accept(offers), later).await;
    }

    /// Accepts tasks taken together (see [`accept_all`]) and starts those
    /// to run.
    pub(super) async fn accept(&self, offers: Vec<Offer>) {
        if offers.is_empty() {
            return;
        }
        let intakes = accept_all(&self.config, &self.buckets, &self.outbox, offers).await;
        start_all(&self.starts, &self.counts, intakes).await;
    }
}

/// Hands what intake decided to the host: the tasks to start, the
/// counts of those settled without running. Each start is awaited until
/// the host has it, so that a drain (which waits for the tasks being
/// accepted, then for the count in flight) counts it.
async fn start_all(starts: &Recipient<Start>, counts: &Recipient<Count>, intakes: Vec<Intake>) {
    for intake in intakes {
        match intake {
            Intake::Start(offer) => {
                let _ = starts.send(Start(*offer)).await;
            }
            Intake::Settled(counted) => counts.do_send(Count(counted)),
            Intake::HandedBack => {}
        }
    }
}
