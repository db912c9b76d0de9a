//! [`Published`]: a published event, held by every subscriber that receives
//! it, in one allocation with the events published beside it.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A published event, shared by every subscriber that receives it.
///
/// The events of one [`EventBus::publish_all`](super::EventBus::publish_all)
/// share one allocation (an `Arc<[E]>`), each handle naming its place in
/// it; a single publish makes a batch of one. A stage execution publishes
/// a poll's few events together, and the subscriber that frees them (the
/// audit log's thread) is another thread than the one that made them:
/// one allocation per batch, freed once, where there was one per event
/// (BENCHMARKS.md, "Every core, twenty-first round"). The batch lives
/// until the last of its handles is dropped.
pub struct Published<E> {
    batch: Arc<[E]>,
    at: usize,
}

impl<E> Published<E> {
    /// `event` alone, a batch of one.
    pub fn new(event: E) -> Published<E> {
        Published {
            batch: Arc::new([event]),
            at: 0,
        }
    }

    /// A handle on each event of `events`, in order, all in one
    /// allocation; `events` is left empty.
    pub(super) fn batch(events: &mut Vec<E>) -> impl Iterator<Item = Published<E>> {
        let batch: Arc<[E]> = events.drain(..).collect();
        (0..batch.len()).map(move |at| Published {
            batch: Arc::clone(&batch),
            at,
        })
    }

    /// Whether `a` and `b` were published together, in one allocation.
    #[cfg(test)]
    pub(super) fn same_batch(a: &Published<E>, b: &Published<E>) -> bool {
        Arc::ptr_eq(&a.batch, &b.batch)
    }

    /// Whether `a` and `b` are the same published event (not merely equal
    /// ones).
    pub fn ptr_eq(a: &Published<E>, b: &Published<E>) -> bool {
        Arc::ptr_eq(&a.batch, &b.batch) && a.at == b.at
    }
}

impl<E> Deref for Published<E> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.batch[self.at]
    }
}

impl<E> Clone for Published<E> {
    fn clone(&self) -> Self {
        Published {
            batch: Arc::clone(&self.batch),
            at: self.at,
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for Published<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_shares_one_allocation_and_keeps_its_order() {
        let mut events = vec!["a", "b", "c"];
        let handles: Vec<Published<&str>> = Published::batch(&mut events).collect();
        assert!(events.is_empty());
        assert_eq!(
            handles.iter().map(|h| **h).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert!(Published::same_batch(&handles[0], &handles[2]));
        assert!(!Published::ptr_eq(&handles[0], &handles[1]));
        assert!(Published::ptr_eq(&handles[1], &handles[1].clone()));
        // The three handles, and no reference kept elsewhere.
        assert_eq!(Arc::strong_count(&handles[0].batch), 3);
    }

    #[test]
    fn the_batch_is_dropped_with_its_last_handle() {
        let probe = Arc::new(());
        let mut events = vec![Arc::clone(&probe), Arc::clone(&probe)];
        let mut handles: Vec<_> = Published::batch(&mut events).collect();
        assert_eq!(Arc::strong_count(&probe), 3);
        handles.pop();
        assert_eq!(
            Arc::strong_count(&probe),
            3,
            "one handle still holds the batch"
        );
        handles.clear();
        assert_eq!(Arc::strong_count(&probe), 1);
    }
}
