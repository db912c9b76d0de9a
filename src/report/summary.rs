//! Per-stage figures of a run for the report's table: executions by
//! outcome, retries, median and longest duration, model requests.

use super::timeline::{Micros, Outcome, Timeline};

/// One stage's executions, summed up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSummary {
    pub stage: String,
    /// Executions by outcome, in the order of [`Outcome::ALL`].
    pub counts: [u64; 5],
    pub retries: u64,
    /// Of the executions that ended (unfinished ones have no duration).
    pub median: Option<Micros>,
    pub max: Option<Micros>,
    /// `ProviderRequestStarted` events (every try).
    pub requests: u64,
    pub failed_requests: u64,
}

impl StageSummary {
    pub fn executions(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn count(&self, outcome: Outcome) -> u64 {
        self.counts[outcome.slot()]
    }
}

/// One summary per stage, in order of first appearance.
pub fn stage_summaries(t: &Timeline) -> Vec<StageSummary> {
    let mut out: Vec<StageSummary> = t
        .stages
        .iter()
        .map(|s| StageSummary {
            stage: s.clone(),
            counts: [0; 5],
            retries: 0,
            median: None,
            max: None,
            requests: 0,
            failed_requests: 0,
        })
        .collect();
    let mut durations: Vec<Vec<Micros>> = vec![Vec::new(); out.len()];
    for e in &t.executions {
        let Some(s) = out.get_mut(e.stage as usize) else {
            continue;
        };
        s.counts[e.outcome.slot()] += 1;
        s.retries += u64::from(e.retries);
        s.requests += u64::from(e.requests);
        s.failed_requests += u64::from(e.failed_requests);
        if let (Some(d), Some(list)) = (e.duration(), durations.get_mut(e.stage as usize)) {
            list.push(d);
        }
    }
    for (s, mut d) in out.iter_mut().zip(durations) {
        s.max = d.iter().copied().max();
        s.median = median(&mut d);
    }
    out
}

/// The middle value (the lower of the two middles for an even count).
fn median(values: &mut [Micros]) -> Option<Micros> {
    if values.is_empty() {
        return None;
    }
    let mid = (values.len() - 1) / 2;
    let (_, m, _) = values.select_nth_unstable(mid);
    Some(*m)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [5, 1, 3]), Some(3));
        assert_eq!(median(&mut [4, 1, 3, 2]), Some(2));
        assert_eq!(median(&mut []), None);
    }
}
