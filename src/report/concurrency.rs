//! Running executions over time: an exact sweep over every entry and end,
//! and its reduction to a fixed number of columns for drawing.

use super::timeline::{Micros, Timeline};

/// How many executions ran (entered, not yet ended) over time: a step
/// function that changes only at the listed times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    /// `(from, running)`: from this time on, `running` executions ran,
    /// until the next step. Times strictly increase; the first step is at
    /// the first entry and the last one (running 0) at the last end.
    pub steps: Vec<(Micros, u32)>,
    /// The most executions that ever ran at once.
    pub peak: u32,
}

impl Concurrency {
    /// Sweeps every execution's `[entered, end)`; an unfinished one runs
    /// until the end of the log. An execution ending at the very moment
    /// another starts does not overlap it.
    pub fn of(t: &Timeline) -> Concurrency {
        let mut edges: Vec<(Micros, i32)> = Vec::with_capacity(t.executions.len() * 2);
        for e in &t.executions {
            edges.push((e.entered, 1));
            edges.push((e.end_or(t.end), -1));
        }
        // Ends (-1) before entries (+1) at the same time.
        edges.sort_unstable();
        let mut steps: Vec<(Micros, u32)> = Vec::new();
        let mut running: i64 = 0;
        let mut peak = 0u32;
        let mut i = 0;
        while i < edges.len() {
            let at = edges[i].0;
            while i < edges.len() && edges[i].0 == at {
                running += i64::from(edges[i].1);
                i += 1;
            }
            let now = u32::try_from(running.max(0)).unwrap_or(u32::MAX);
            peak = peak.max(now);
            match steps.last() {
                Some(&(_, last)) if last == now => {}
                _ => steps.push((at, now)),
            }
        }
        Concurrency { steps, peak }
    }

    /// The most executions running within each of `columns` equal slices
    /// of `[from, to)`: a peak shorter than a slice still shows.
    pub fn columns(&self, from: Micros, to: Micros, columns: usize) -> Vec<u32> {
        let mut out = vec![0u32; columns];
        if columns == 0 || to <= from {
            return out;
        }
        let span = i128::from(to - from);
        let n = columns as i128;
        // The column a time falls in (clamped to the range).
        let column = |t: Micros| -> usize {
            let c = (i128::from(t - from) * n).div_euclid(span);
            c.clamp(0, n - 1) as usize
        };
        for (k, &(at, running)) in self.steps.iter().enumerate() {
            let until = self.steps.get(k + 1).map_or(at, |&(next, _)| next);
            if running == 0 || until <= from || at >= to {
                continue;
            }
            // `[at, until)` covers the columns of its first and last
            // microsecond.
            let first = column(at.max(from));
            let last = column((until - 1).min(to - 1));
            for slot in &mut out[first..=last] {
                *slot = (*slot).max(running);
            }
        }
        out
    }
}
