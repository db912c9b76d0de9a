//! The command line: its grammar and dispatch (`command`), one file per
//! command, and the terminal I/O the runtime leaves to it (progress, the
//! approval prompt, output). Exit codes are documented in `exit`.

pub mod bench;
pub mod chat;
pub mod command;
pub mod control;
pub mod exit;
pub mod launch;
pub mod limits;
pub mod mcp;
pub mod new;
pub mod options;
pub mod output;
pub mod progress;
pub mod prompter;
pub mod provider;
pub mod reach;
pub mod refusal;
pub mod report;
pub mod resume;
pub mod run;
pub mod runs;
pub mod sandbox;
pub mod sandbox_exec;
pub mod seal;
pub mod serve;
mod serve_policy;
pub mod show;
pub mod signals;
pub mod submit;
pub mod validate;
pub mod worker;

pub use command::{Cli, Command, run};
pub use exit::Exit;
pub use refusal::Refusal;
