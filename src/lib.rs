//! troupe: runs LLM agent workflows as state-machine stage pipelines on an
//! actor runtime. This crate holds the domain (definitions, runtime,
//! providers, tools) and a thin CLI; reusable actor machinery lives in
//! `troupe-actors`.
//!
//! Layers, lowest first; a module imports only its own layer and those
//! below (`tests/layering.rs` checks it): `error`, `environ`, `auditlog`,
//! `allocator` → `definition` → `provider`, `tools` → `runtime` → `store`,
//! `report`, `bench`, `distributed`, `control`, `telemetry` → `cli`.

/// `eprintln!` that never panics: a line stderr cannot take (a reader
/// that went away, a full disk) is lost, not the run. `eprintln!` panics
/// on such a write, which in a helper thread lost a run's report.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `println!` (and with `tell!(@raw …)`, `print!`) for a command's output,
/// which never panics: `println!` does when stdout cannot take the line
/// (`troupe runs > /dev/full`, a reader that went away). A reader that
/// went away ends the process as it ends any Unix tool's output (141); any
/// other failure is said on stderr, exit 1. Whatever the command did is
/// done by then (a run is in its store): only its output was not
/// delivered.
macro_rules! tell {
    (@raw $($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = write!(out, $($arg)*).and_then(|()| out.flush()) {
            $crate::stdout_failed(&e);
        }
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::stdout_failed(&e);
        }
    }};
}

/// Ends the process for a stdout that cannot be written (see `tell!`).
#[doc(hidden)]
pub fn stdout_failed(e: &std::io::Error) -> ! {
    use std::io::Write as _;
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        let _ = writeln!(
            std::io::stderr(),
            "error: Store/WriteFailed: cannot write the output to stdout: {e}"
        );
        std::process::exit(1);
    }
    std::process::exit(141)
}

pub mod allocator;
pub mod auditlog;
pub mod bench;
pub mod cli;
pub mod control;
pub mod definition;
pub mod distributed;
pub mod environ;
pub mod error;
pub mod provider;
pub mod report;
pub mod runtime;
pub mod store;
pub mod telemetry;
pub mod tools;
