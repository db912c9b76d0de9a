//! The `troupe` binary: parse arguments, run the command, exit with its code.

use clap::Parser;

/// mimalloc, not glibc malloc: the actor thread allocates every event and
/// the audit writer thread frees it; glibc serializes those cross-thread
/// frees on an arena lock (`troupe::allocator`, BENCHMARKS.md).
#[global_allocator]
static GLOBAL: troupe::allocator::Mimalloc = troupe::allocator::Mimalloc;

fn main() -> std::process::ExitCode {
    // First of all: nothing troupe was handed open passes to what it
    // starts, and the environment's secrets are hidden from it.
    troupe::environ::close_inherited_on_exec();
    let args = troupe::cli::seal::seal();
    let cli = troupe::cli::Cli::parse_from(args);
    troupe::cli::run(cli).into()
}
