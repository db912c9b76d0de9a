//! `troupe submit`: hands a run to a `troupe serve` (the project's, or
//! `--server`) and prints its id; with `--watch` it then follows the run
//! as `troupe watch` does. And `troupe resume` of a run a server should
//! continue.

use std::io::Write;

use clap::Parser;

use super::Exit;
use super::control::{block_on, failed, follow};
use crate::control::ControlClient;
use crate::control::client::Target;

/// Options of `troupe submit`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Examples:
  troupe submit stages/fanout --ctx width=1000 --parallel-cap 64
  troupe submit stages/code-review --task 'rename the loader' --watch
  troupe submit stages/fanout --server http://127.0.0.1:7700   # token: $TROUPE_TOKEN or .troupe/token")]
pub struct SubmitArgs {
    /// Then follow the run until it ends, and exit as it does (Ctrl-C
    /// stops watching; the run goes on).
    #[arg(long)]
    pub watch: bool,
    /// The server (`unix:PATH`, `http://HOST:PORT`) [default:
    /// $TROUPE_SERVER, else the project's .troupe/troupe.sock].
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The name the server's log and the audit log record for you.
    #[arg(long, default_value = "cli")]
    pub client: String,
    /// The pipeline folder, then any option of `troupe run` (--ctx,
    /// --task, --parallel-cap, --base-url, --answers, ...). The run store,
    /// runs folder and root are the server's.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PIPELINE [OPTIONS OF RUN]"
    )]
    pub args: Vec<String>,
}

/// `troupe run`'s grammar, to check a submission before it is sent.
#[derive(Debug, Parser)]
#[command(name = "troupe submit", no_binary_name = true)]
struct RunGrammar {
    #[command(flatten)]
    run: super::run::RunArgs,
}

/// Takes `--watch`, `--server URL` and `--client NAME` out of the
/// trailing arguments, where they land when given after the pipeline.
fn own_flags(args: &mut SubmitArgs) {
    let mut rest = Vec::new();
    let mut it = std::mem::take(&mut args.args).into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--watch" => args.watch = true,
            "--server" => args.server = it.next(),
            "--client" => {
                if let Some(c) = it.next() {
                    args.client = c;
                }
            }
            _ => {
                if let Some(v) = arg.strip_prefix("--server=") {
                    args.server = Some(v.to_owned());
                } else if let Some(v) = arg.strip_prefix("--client=") {
                    args.client = v.to_owned();
                } else {
                    rest.push(arg);
                }
            }
        }
    }
    args.args = rest;
}

pub fn run(mut args: SubmitArgs) -> Exit {
    own_flags(&mut args);
    let parsed = match RunGrammar::try_parse_from(&args.args) {
        Ok(p) => p,
        Err(e) => {
            let _ = e.print();
            return Exit::Invalid;
        }
    };
    // The server's own: refused here, before they send the search for its
    // socket elsewhere (a `--runs-dir` named a folder no server answers in).
    let servers = ["--store", "--no-store", "--runs-dir"];
    if let Some(flag) = args.args.iter().find(|a| {
        servers
            .iter()
            .any(|f| a.as_str() == *f || a.starts_with(&format!("{f}=")))
    }) {
        let flag = flag.split('=').next().unwrap_or(flag);
        let _ = writeln!(
            std::io::stderr(),
            "error: Control/BadArgs: {flag} is the server's: --store, --no-store and --runs-dir are set where `troupe serve` runs (see `troupe serve --help`)\n  hint: submit without it; the server of this project is found from here, or named with --server"
        );
        return Exit::Invalid;
    }
    let runs_dir = parsed.run.opts.runs_dir.clone();
    let target = match super::reach::server_for(args.server.as_deref(), &runs_dir) {
        Ok(Some(t)) => t,
        Ok(None) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: Control/NoServer: no server runs for this project ({} does not answer)\n  hint: start one with `troupe serve`, or name one with --server",
                super::reach::project_socket(&runs_dir).display()
            );
            return Exit::Invalid;
        }
        Err(e) => return failed(&e),
    };
    let client = match ControlClient::to(&target) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    let cwd = std::env::current_dir().unwrap_or_default();
    let id = match block_on(client.submit(&args.args, &cwd, &args.client)) {
        Ok(id) => id,
        Err(e) => return failed(&e),
    };
    tell!("{id}");
    let _ = std::io::stdout().flush();
    if args.watch {
        return follow(&client, &id, false, 0);
    }
    Exit::Ok
}

/// `troupe resume` of a run a server continues: the options given after
/// the run id go along.
pub fn resume_remote(target: &Target, run: &str) -> Exit {
    let client = match ControlClient::to(target) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    let args = resume_options(std::env::args().collect(), run);
    let cwd = std::env::current_dir().unwrap_or_default();
    match block_on(client.resume(run, &args, &cwd, "cli")) {
        Ok(id) => {
            tell!("{id}");
            let _ = writeln!(
                std::io::stderr(),
                "resumed in the server at {target}: `troupe watch {id}` follows it"
            );
            Exit::Ok
        }
        Err(e) => failed(&e),
    }
}

/// The options of `troupe resume` as typed, without the run id and
/// `--server`.
fn resume_options(argv: Vec<String>, run: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = argv
        .into_iter()
        .skip_while(|a| a != "resume")
        .skip(1)
        .peekable();
    let mut id_seen = false;
    while let Some(arg) = it.next() {
        if arg == "--server" {
            it.next();
        } else if arg.starts_with("--server=") {
        } else if !id_seen && arg == run {
            id_seen = true;
        } else {
            out.push(arg);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn own_flags_are_taken_from_anywhere() {
        let mut args = SubmitArgs {
            watch: false,
            server: None,
            client: "cli".to_owned(),
            args: strs(&[
                "p",
                "--ctx",
                "a=1",
                "--watch",
                "--server",
                "unix:/s",
                "--client=me",
            ]),
        };
        own_flags(&mut args);
        assert!(args.watch);
        assert_eq!(args.server.as_deref(), Some("unix:/s"));
        assert_eq!(args.client, "me");
        assert_eq!(args.args, strs(&["p", "--ctx", "a=1"]));
    }

    #[test]
    fn resume_options_drop_the_id_and_the_server() {
        let argv = strs(&[
            "troupe",
            "resume",
            "0123",
            "--force",
            "--server",
            "unix:/s",
            "--parallel-cap",
            "4",
        ]);
        assert_eq!(
            resume_options(argv, "0123"),
            strs(&["--force", "--parallel-cap", "4"])
        );
    }
}
