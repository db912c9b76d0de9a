//! `troupe bench`'s arguments: the options and the matrix they describe
//! (widths, caps, latencies, threads, store on/off, repeats, a failing
//! sibling).

use std::path::PathBuf;
use std::time::Duration;

use crate::bench::matrix::{MAX_WIDTH, parse_counts, parse_latencies};
use crate::cli::Exit;
use crate::cli::validate::reject;
use crate::error::ValidationCode;
use crate::provider::selector::Selector;

/// Options of `troupe bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The pipeline folder (it must declare a `width` ctx field, like
    /// stages/fanout).
    pub pipeline: PathBuf,
    /// Fan-out widths, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "100,1000,10000")]
    pub width: String,
    /// Parallel caps, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "16,256")]
    pub cap: String,
    /// Latency of every scripted model turn, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "0ms,50ms")]
    pub latency: String,
    /// Threads the runtime's stage executions spread over (`troupe run
    /// --threads`), comma-separated [default: as `troupe run`'s]. With
    /// several (e.g. 1,2,4,8,16), a `speedup` column says how much more
    /// throughput each count gets than the fewest.
    #[arg(long, value_name = "LIST")]
    pub threads: Option<String>,
    /// The run store: `on` (as `troupe run` keeps it), `off`
    /// (`--no-store`), or both to measure what it costs.
    #[arg(long, value_name = "LIST", default_value = "on")]
    pub store: String,
    /// Runs per cell (the table shows the median).
    #[arg(long, value_name = "N", default_value = "5")]
    pub repeat: String,
    /// Make one sibling fail, e.g. worker#17, and report how long
    /// cancelling the siblings in flight takes. The index must be below
    /// every --width (refused otherwise: that width's runs would never
    /// fail).
    #[arg(long, value_name = "STAGE#INDEX")]
    pub fail_sibling: Option<String>,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Keep the runs' audit logs (printed path) instead of removing them.
    #[arg(long)]
    pub keep_runs: bool,
    /// Internal: run one cell once in this process and print its figures.
    #[arg(long, hide = true, value_name = "runtime|floor")]
    pub cell: Option<String>,
    /// Internal: where a `--cell` run writes its audit log.
    #[arg(long, hide = true, value_name = "DIR")]
    pub runs_dir: Option<PathBuf>,
}

/// The validated matrix.
#[derive(Debug, Clone)]
pub(super) struct Matrix {
    pub(super) widths: Vec<usize>,
    pub(super) caps: Vec<usize>,
    pub(super) latencies: Vec<Duration>,
    pub(super) threads: Vec<usize>,
    pub(super) stores: Vec<bool>,
    pub(super) repeat: usize,
    pub(super) fail: Option<Selector>,
}

/// A bad flag or flag value: reported like a pipeline's diagnostics (as
/// JSON with `--json`), exit 2.
pub(super) fn invalid(args: &BenchArgs, message: &str) -> Exit {
    reject(
        &args.pipeline,
        ValidationCode::InputInvalid,
        message.to_owned(),
        args.json,
    )
}

pub(super) fn parse_matrix(args: &BenchArgs) -> Result<Matrix, String> {
    let widths =
        parse_counts(&args.width, "width", MAX_WIDTH).map_err(|e| format!("--width {e}"))?;
    let caps = parse_counts(&args.cap, "cap", 1_000_000).map_err(|e| format!("--cap {e}"))?;
    let latencies = parse_latencies(&args.latency).map_err(|e| format!("--latency {e}"))?;
    let threads = match &args.threads {
        Some(t) => parse_counts(t, "thread count", 1024).map_err(|e| format!("--threads {e}"))?,
        None => vec![crate::cli::launch::default_threads()],
    };
    let mut stores = Vec::new();
    for part in args.store.split(',') {
        let on = match part.trim() {
            "on" => true,
            "off" => false,
            other => return Err(format!("--store `{other}`: expected on, off or on,off")),
        };
        if !stores.contains(&on) {
            stores.push(on);
        }
    }
    let repeat = match args.repeat.trim().parse::<usize>() {
        Ok(n @ 1..=1000) => n,
        _ => {
            return Err(format!(
                "--repeat `{}` must be a whole number from 1 to 1000",
                args.repeat
            ));
        }
    };
    let fail = args
        .fail_sibling
        .as_deref()
        .map(Selector::parse)
        .transpose()
        .map_err(|e| format!("--fail-sibling {e}"))?;
    // The floor fails exactly one task, so the runtime must too.
    if let Some(f) = fail.as_ref().filter(|f| f.index.is_none()) {
        return Err(format!(
            "--fail-sibling `{f}` must name one sibling, as STAGE#N (e.g. worker#17)"
        ));
    }
    // Every cell's run must fail: a sibling past a width would not, said
    // now rather than after the whole matrix ran.
    if let Some((f, index)) = fail.as_ref().and_then(|f| Some((f, f.index?)))
        && let Some(&narrowest) = widths.iter().min()
        && index >= narrowest
    {
        return Err(format!(
            "--fail-sibling `{f}`: sibling {index} is past --width {narrowest} (siblings are numbered from 0), whose runs would never fail"
        ));
    }
    Ok(Matrix {
        widths,
        caps,
        latencies,
        threads,
        stores,
        repeat,
        fail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(width: &str, cap: &str, latency: &str, repeat: &str) -> BenchArgs {
        BenchArgs {
            pipeline: PathBuf::from("stages/fanout"),
            width: width.to_owned(),
            cap: cap.to_owned(),
            latency: latency.to_owned(),
            repeat: repeat.to_owned(),
            threads: None,
            store: "on".to_owned(),
            fail_sibling: None,
            json: false,
            keep_runs: false,
            cell: None,
            runs_dir: None,
        }
    }

    #[test]
    fn the_matrix_parses_every_list() {
        let m = parse_matrix(&args("100,1000,10000", "16,256", "0ms,50ms", "5")).unwrap();
        assert_eq!(m.widths, vec![100, 1000, 10_000]);
        assert_eq!(m.caps, vec![16, 256]);
        assert_eq!(m.latencies, vec![Duration::ZERO, Duration::from_millis(50)]);
        assert_eq!(m.repeat, 5);
    }

    #[test]
    fn bad_matrix_flags_name_the_flag() {
        for (a, flag) in [
            (args("0", "16", "0ms", "1"), "--width"),
            (args("10", "x", "0ms", "1"), "--cap"),
            (args("10", "16", "50", "1"), "--latency"),
            (args("10", "16", "0ms", "0"), "--repeat"),
        ] {
            let e = parse_matrix(&a).unwrap_err();
            assert!(e.starts_with(flag), "{e}");
        }
    }
}
