//! What an execution reads: the state slot's snapshot and the contexts
//! the planner makes, their shared part made once per stage and turn.

use super::*;

impl Planner {
    /// The state slot as it is now, shared by whoever reads it next.
    pub(super) fn snapshot(&self) -> Arc<BTreeMap<String, Kept>> {
        Arc::new(self.results.clone())
    }

    pub(super) fn context(
        &mut self,
        stage: &str,
        index: Option<usize>,
        visit: u32,
        upstream: Arc<Vec<Kept>>,
        slot: Arc<BTreeMap<String, Kept>>,
        item: Option<Value>,
    ) -> Arc<StageContext> {
        let reused = self.last_shared.as_ref().filter(|s| {
            &*s.stage_id == stage
                && Arc::ptr_eq(&s.upstream, &upstream)
                && Arc::ptr_eq(&s.results, &slot)
        });
        let shared = match reused {
            Some(shared) => Arc::clone(shared),
            None => {
                // Kept for siblings alone (no upstream): a join's upstream,
                // every sibling's result, goes when the join does.
                let siblings = Arc::ptr_eq(&upstream, &self.no_upstream);
                let shared = self.shared_context(stage, upstream, slot);
                self.last_shared = siblings.then(|| Arc::clone(&shared));
                shared
            }
        };
        Arc::new(StageContext {
            shared,
            stage_execution_id: stage_execution_id(&self.run_id, stage, index, visit).into(),
            item,
            index,
        })
    }

    /// A new shared part of a context of `stage`.
    pub(super) fn shared_context(
        &self,
        stage: &str,
        upstream: Arc<Vec<Kept>>,
        slot: Arc<BTreeMap<String, Kept>>,
    ) -> Arc<SharedContext> {
        let (stage_id, name) = match self.stages.get(stage) {
            Some(shared) => (Arc::clone(&shared.id), Arc::clone(&shared.name)),
            None => (stage.into(), stage.into()),
        };
        Arc::new(SharedContext {
            fields: Arc::clone(&self.fields),
            upstream,
            results: slot,
            workflow_run_id: self.run_id.shared(),
            stage_id,
            stage_name: name,
        })
    }
}
