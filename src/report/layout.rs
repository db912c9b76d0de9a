//! Which rows the report draws: one per execution in order of first
//! appearance, a header per parallel group with its siblings under it, and
//! wide groups binned so a picture of 100 000 siblings stays readable and
//! bounded.

use super::timeline::{ExecRef, GroupRef, Item, Micros, Outcome, Timeline};

/// How many rows to spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowBudget {
    /// Most sibling rows per group; a wider group is drawn as at most this
    /// many bins of consecutive siblings.
    pub per_group: usize,
    /// Most rows in all; the rest is summed up in one last row.
    pub total: usize,
}

impl Default for RowBudget {
    fn default() -> Self {
        RowBudget {
            per_group: 100,
            total: 2_000,
        }
    }
}

/// One row of the picture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    /// One execution; `sibling` when it is drawn under its group's header.
    Execution { exec: ExecRef, sibling: bool },
    /// A parallel group's header.
    Group { group: GroupRef },
    /// Consecutive siblings of a wide group drawn as one row.
    Bin(Bin),
    /// What did not fit in the total budget.
    Omitted { rows: usize, executions: usize },
}

/// Consecutive siblings (by index) of one group, drawn as one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bin {
    pub group: GroupRef,
    /// The siblings, as a range of the group's `siblings` (sorted by index).
    pub first: usize,
    pub last: usize,
    /// The smallest and largest sibling index in the bin.
    pub min_index: u32,
    pub max_index: u32,
    /// Earliest entry.
    pub entered: Micros,
    /// Latest end (the end of the log when one is unfinished).
    pub ended: Micros,
    /// Siblings by outcome, in the order of [`Outcome::ALL`].
    pub counts: [u64; 5],
    pub worst: Outcome,
    pub retries: u64,
}

impl Bin {
    /// How many siblings the bin holds (at least one).
    pub fn size(&self) -> usize {
        self.last - self.first + 1
    }
}

/// The rows of a timeline, within the budget.
pub fn rows(t: &Timeline, budget: RowBudget) -> Vec<Row> {
    let mut rows = Vec::new();
    for item in &t.items {
        match *item {
            Item::Execution(exec) => rows.push(Row::Execution {
                exec,
                sibling: false,
            }),
            Item::Group(group) => {
                rows.push(Row::Group { group });
                group_rows(t, group, budget.per_group.max(1), &mut rows);
            }
        }
    }
    let total = budget.total.max(2);
    if rows.len() > total {
        let hidden = rows.split_off(total - 1);
        let executions = hidden
            .iter()
            .map(|r| match r {
                Row::Execution { .. } => 1,
                Row::Bin(b) => b.size(),
                Row::Group { .. } | Row::Omitted { .. } => 0,
            })
            .sum();
        rows.push(Row::Omitted {
            rows: hidden.len(),
            executions,
        });
    }
    rows
}

fn group_rows(t: &Timeline, g: GroupRef, per_group: usize, rows: &mut Vec<Row>) {
    let Some(group) = t.groups.get(g as usize) else {
        return;
    };
    let n = group.siblings.len();
    if n <= per_group {
        rows.extend(group.siblings.iter().map(|&exec| Row::Execution {
            exec,
            sibling: true,
        }));
        return;
    }
    // ceil(n / per_group) siblings a bin gives at most per_group bins.
    let size = n.div_ceil(per_group);
    let mut first = 0;
    while first < n {
        let last = (first + size).min(n) - 1;
        rows.push(Row::Bin(bin(t, g, first, last)));
        first = last + 1;
    }
}

fn bin(t: &Timeline, group: GroupRef, first: usize, last: usize) -> Bin {
    let mut b = Bin {
        group,
        first,
        last,
        min_index: u32::MAX,
        max_index: 0,
        entered: Micros::MAX,
        ended: Micros::MIN,
        counts: [0; 5],
        worst: Outcome::Ok,
        retries: 0,
    };
    let siblings = t
        .groups
        .get(group as usize)
        .and_then(|g| g.siblings.get(first..=last))
        .unwrap_or_default();
    for e in siblings.iter().filter_map(|&e| t.execution(e)) {
        let index = e.index.unwrap_or(0);
        b.min_index = b.min_index.min(index);
        b.max_index = b.max_index.max(index);
        b.entered = b.entered.min(e.entered);
        b.ended = b.ended.max(e.end_or(t.end));
        b.counts[e.outcome.slot()] += 1;
        b.worst = b.worst.max(e.outcome);
        b.retries += u64::from(e.retries);
    }
    if b.entered > b.ended {
        // No execution found (cannot happen for references from `t`).
        b.entered = 0;
        b.ended = 0;
        b.min_index = 0;
    }
    b
}
