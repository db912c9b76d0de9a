//! What the runs of one matrix cell report: one child run's figures, and
//! a cell's runs of the runtime and of the floor.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What one child run prints: one JSON object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CellRun {
    pub(super) wall_us: u64,
    pub(super) ok: bool,
    pub(super) peak_rss_kib: Option<u64>,
    pub(super) cancel_latency_us: Option<u64>,
    pub(super) cancelled: usize,
}

/// One cell's runs, runtime and floor.
#[derive(Debug, Clone)]
pub(super) struct CellResult {
    pub(super) width: usize,
    pub(super) cap: usize,
    pub(super) latency: Duration,
    pub(super) threads: usize,
    pub(super) store: bool,
    pub(super) runtime: Vec<CellRun>,
    pub(super) floor: Vec<CellRun>,
}
