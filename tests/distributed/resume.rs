//! Resuming a distributed run from the tests.

use super::harness::*;

/// `troupe resume RUN [--nats URL] --json` in `project`.
pub fn resume(project: &Project, run_id: &str, url: Option<&str>) -> std::process::Output {
    let mut cmd = troupe();
    cmd.args(["resume", run_id, "--json", "--runs-dir"])
        .arg(project.runs())
        .arg("--root")
        .arg(project.root());
    if let Some(url) = url {
        cmd.args(["--nats", url]);
    }
    cmd.output().unwrap()
}
