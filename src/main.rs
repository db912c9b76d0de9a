//! The `troupe` binary: parse arguments, run the command, exit with its code.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = troupe::cli::Cli::parse();
    troupe::cli::run(cli).into()
}
