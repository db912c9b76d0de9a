//! `troupe run`: validate, resolve the ctx fields, and run the pipeline as
//! a new run (see `launch` for the rest: provider, store, audit log,
//! signals, summary). The first Ctrl-C, SIGTERM or SIGHUP cancels the run
//! (exit 130, 143, 129) after flushing the audit log and the store; a
//! second one exits at once (`signals`).

use std::path::PathBuf;
use std::sync::Arc;

use super::Exit;
use super::launch::{Launch, execute};
use super::options::RunOptions;
use super::validate::print_diagnostics;
use crate::definition::load_pipeline;
use crate::error::Diagnostics;
use crate::runtime::launch::{parse_ctx_pair, resolve_fields};

pub use super::launch::default_threads;

/// Options of `troupe run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The pipeline folder (or its pipeline.yaml).
    pub pipeline: PathBuf,
    /// Sets ctx.task (the pipeline must declare `task`).
    #[arg(long)]
    pub task: Option<String>,
    /// Sets a ctx field: key=value. JSON values (numbers, booleans, lists)
    /// are kept typed. Repeatable.
    #[arg(long = "ctx", value_name = "KEY=VALUE", value_parser = parse_ctx_pair)]
    pub ctx: Vec<(String, serde_json::Value)>,
    #[command(flatten)]
    pub opts: RunOptions,
}

pub fn run(args: RunArgs) -> Exit {
    let path = args.pipeline.clone();
    let json = args.opts.json;
    let pipeline = match load_pipeline(&path) {
        Ok(p) => Arc::new(p),
        Err(diags) => {
            print_diagnostics(&path, &diags, json);
            return Exit::Invalid;
        }
    };
    let fields = match resolve_fields(&pipeline, &args.ctx, args.task.as_deref()) {
        Ok(f) => f,
        Err(errors) => {
            print_diagnostics(&path, &Diagnostics(errors), json);
            return Exit::Invalid;
        }
    };
    execute(
        Launch {
            path,
            pipeline,
            fields,
            resume: None,
        },
        &args.opts,
        None,
    )
}
