//! The `troupe` binary: parse arguments, run the command, exit with its code.

use clap::Parser;

/// mimalloc, not glibc malloc: the actor thread allocates every event and
/// the audit writer thread frees it; glibc serializes those cross-thread
/// frees on an arena lock (`troupe::allocator`, BENCHMARKS.md).
#[global_allocator]
static GLOBAL: troupe::allocator::Mimalloc = troupe::allocator::Mimalloc;

fn main() -> std::process::ExitCode {
    // First of all: the environment's secrets are hidden from what troupe
    // starts, and (in the final image, so that a descriptor given as a
    // path, `--mcp <(…)` or `/dev/fd/3`, survives the seal's re-exec)
    // nothing troupe was handed open passes to it.
    let args = troupe::cli::seal::seal();
    troupe::environ::close_inherited_on_exec();
    let cli = troupe::cli::Cli::parse_from(args);
    troupe::cli::run(cli).into()
}
