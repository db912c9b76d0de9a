//! Sealing the process at start, so that nothing troupe starts can read a
//! secret out of troupe. `/proc/<pid>/environ` shows the environment a
//! process was *started* with, whatever it changed since, so removing a
//! variable is not enough: troupe reads its whole environment, re-executes
//! itself with only the harmless variables (`environ::kept_in_process`),
//! and hands the rest to the new image over a pipe, which the new image
//! reads and closes before it does anything else. The new image then makes
//! itself non-dumpable: its `/proc` files (`mem`, `environ`, `fd`, …)
//! belong to root, no process of the same user may trace it, and it leaves
//! no core dump. SECURITY.md says what this holds against, and for whom.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;

use crate::environ;

/// The hidden first argument of a sealed image: the pipe's descriptor.
const SEALED_FD_FLAG: &str = "--sealed-env-fd=";

/// Subcommands troupe starts itself, with an environment it chose: never
/// resealed (the reaper's stdin is its pipe, not an environment).
const INTERNAL: [&str; 2] = ["sandbox-exec", "reaper"];

/// The pipe's buffer must hold the whole environment: the writer is gone
/// (replaced by exec) before the reader reads.
const MAX_SEALED_BYTES: usize = 1 << 20;

/// Seals this process if it must, and returns the arguments to parse. Only
/// returns in the sealed image (or when sealing is not needed or not
/// possible, which it says on stderr).
pub fn seal() -> Vec<OsString> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if let Some(fd) = args
        .get(1)
        .and_then(|a| a.to_str())
        .and_then(|a| a.strip_prefix(SEALED_FD_FLAG))
        .and_then(|n| n.parse::<i32>().ok())
    {
        args.remove(1);
        unseal(fd);
        harden();
        return args;
    }
    if args
        .get(1)
        .and_then(|a| a.to_str())
        .is_some_and(|a| INTERNAL.contains(&a))
    {
        return args;
    }
    let vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    if vars.iter().all(|(name, _)| environ::kept_in_process(name)) {
        // Nothing to hide: no second exec.
        environ::install(vars);
        harden();
        return args;
    }
    let why = reexec(&args, &vars);
    let _ = writeln!(
        std::io::stderr(),
        "warning: troupe could not seal its environment ({why}): processes it starts may read its secrets from /proc"
    );
    environ::install(vars);
    harden();
    args
}

/// Re-executes this binary with the harmless variables only, the rest on a
/// pipe. Returns only on failure, with why.
fn reexec(args: &[OsString], vars: &[(OsString, OsString)]) -> String {
    // Under valgrind /proc/self/exe is valgrind's own tool, which refuses
    // to be run directly (and a traced re-exec of troupe fails to load):
    // a profile of troupe runs unsealed, and says so. Valgrind preloads
    // its `vgpreload_*` libraries into the program it runs.
    let under_valgrind = vars.iter().any(|(name, value)| {
        name == "LD_PRELOAD" && value.to_string_lossy().contains("/vgpreload_")
    });
    if under_valgrind {
        return "it runs under valgrind".to_owned();
    }
    let bytes = environ::encode(vars);
    if bytes.len() > MAX_SEALED_BYTES {
        return format!("the environment is {} bytes, over 1 MiB", bytes.len());
    }
    let (reader, mut writer) = match std::io::pipe() {
        Ok(pair) => pair,
        Err(e) => return format!("no pipe: {e}"),
    };
    if bytes.len() >= 60 * 1024
        && let Err(e) = nix::fcntl::fcntl(
            &writer,
            nix::fcntl::FcntlArg::F_SETPIPE_SZ(bytes.len().next_power_of_two() as i32),
        )
    {
        return format!("cannot grow the pipe: {e}");
    }
    if let Err(e) = writer.write_all(&bytes) {
        return format!("cannot write the pipe: {e}");
    }
    drop(writer);
    // The reader crosses the exec: clear its close-on-exec flag.
    if let Err(e) = nix::fcntl::fcntl(
        &reader,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    ) {
        return format!("cannot pass the pipe on: {e}");
    }
    let mut cmd = std::process::Command::new("/proc/self/exe");
    if let Some(arg0) = args.first() {
        cmd.arg0(arg0);
    }
    cmd.arg(format!("{SEALED_FD_FLAG}{}", reader.as_raw_fd()))
        .args(args.iter().skip(1))
        .env_clear()
        .envs(
            vars.iter()
                .filter(|(name, _)| environ::kept_in_process(name))
                .cloned(),
        );
    let err = cmd.exec();
    format!("cannot re-execute /proc/self/exe: {err}")
}

/// Reads the environment the unsealed image passed, then closes the pipe.
/// A pipe that cannot be read ends the process: running on without the
/// environment would turn a missing key into a confusing error later.
fn unseal(fd: i32) {
    let mut bytes = Vec::new();
    let read = std::fs::File::open(format!("/proc/self/fd/{fd}"))
        .and_then(|mut pipe| pipe.read_to_end(&mut bytes));
    // The descriptor the exec carried over; the copy opened above is
    // closed already.
    let _ = nix::unistd::close(fd);
    if let Err(e) = read {
        let _ = writeln!(
            std::io::stderr(),
            "troupe: cannot read the environment handed over at start: {e}"
        );
        std::process::exit(125);
    }
    environ::install(environ::decode(&bytes));
}

/// No core dumps, no `/proc/<pid>/mem` for processes of the same user.
fn harden() {
    let _ = nix::sys::prctl::set_dumpable(false);
}
