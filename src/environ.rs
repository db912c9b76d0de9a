//! troupe's environment as it was given, held in memory only. The CLI
//! seals its process at start (`cli::seal`): it reads every variable,
//! re-executes itself with only the harmless ones, and hands the rest
//! over a pipe that is closed at once. From then on a secret such as
//! `OPENAI_API_KEY` is in no process environment `/proc` can show, and the
//! code that needs one asks here instead of `std::env`.
//!
//! A library user who never seals gets the process environment, as before.

use std::ffi::{OsStr, OsString};
use std::sync::OnceLock;

static SEALED: OnceLock<Vec<(OsString, OsString)>> = OnceLock::new();

/// Marks every descriptor troupe was started with, past stdin, stdout and
/// stderr, close-on-exec: called in `main` right after the seal (whose
/// re-exec must carry them: a path such as `/dev/fd/63` names one), while
/// the process has one thread. A descriptor the caller left open (`7>>file`, a
/// harness's pipe, a socket) would otherwise pass to every shell, hook and
/// MCP server troupe starts, and Landlock does not check a file already
/// open: a sandboxed shell wrote outside its root through one. Everything
/// troupe opens itself is close-on-exec already (Rust's default); what it
/// hands a child on purpose (the seal's pipe) it makes inheritable then.
#[allow(unsafe_code)]
pub fn close_inherited_on_exec() {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    let Ok(open) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let numbers: Vec<i32> = open
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&n| n > 2)
        .collect();
    for n in numbers {
        // SAFETY: `n` was listed as open a moment ago, this process has
        // one thread, and the descriptor is only looked at and flagged
        // here, never closed; the listing's own descriptor, closed since,
        // fails `F_GETFD` and is passed over.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(n) };
        if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFD) {
            let flags = FdFlag::from_bits_truncate(flags) | FdFlag::FD_CLOEXEC;
            let _ = fcntl(fd, FcntlArg::F_SETFD(flags));
        }
    }
}

/// Variables a process troupe starts may see as troupe has them: what a
/// shell and common tools need to run, nothing that usually holds a secret.
/// `LC_*` means every variable whose name starts with `LC_`.
pub const HARMLESS: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ", "TMPDIR",
];

/// Variables troupe itself reads for its own display and diagnostics,
/// kept in the sealed process's environment beside [`HARMLESS`] (they are
/// not handed to shells).
pub const PRESENTATION: &[&str] = &[
    "NO_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "COLUMNS",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "RUST_LOG",
];

fn listed(list: &[&str], name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    list.iter().any(|a| match a.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *a,
    })
}

/// Whether `name` is on [`HARMLESS`].
pub fn harmless(name: &OsStr) -> bool {
    listed(HARMLESS, name)
}

/// Whether a sealed troupe keeps `name` in its own process environment.
pub fn kept_in_process(name: &OsStr) -> bool {
    harmless(name) || listed(PRESENTATION, name)
}

/// Installs the environment troupe was started with; the first call wins.
/// Returns false when one was installed already.
pub fn install(vars: Vec<(OsString, OsString)>) -> bool {
    SEALED.set(vars).is_ok()
}

/// Whether this process runs sealed (its secrets held here, not in its
/// environment).
pub fn is_sealed() -> bool {
    SEALED.get().is_some()
}

/// Every variable troupe was started with, sorted by name.
pub fn vars_os() -> Vec<(OsString, OsString)> {
    let mut vars = match SEALED.get() {
        Some(vars) => vars.clone(),
        None => std::env::vars_os().collect(),
    };
    vars.sort();
    vars
}

/// One variable troupe was started with, if it is set and valid Unicode.
pub fn var(name: &str) -> Option<String> {
    match SEALED.get() {
        Some(vars) => vars
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.to_str().map(str::to_owned)),
        None => std::env::var(name).ok(),
    }
}

/// The harmless variables and those named in `pass`, sorted by name. A
/// name in `pass` that is not set is left out.
pub fn scrubbed(pass: &[String]) -> Vec<(OsString, OsString)> {
    vars_os()
        .into_iter()
        .filter(|(name, _)| harmless(name) || pass.iter().any(|p| OsStr::new(p) == name))
        .collect()
}

/// Checks a variable name (`--pass-env`, a hook's or an MCP server's `env:`): letters, digits and `_`, not starting with a
/// digit.
pub fn check_env_name(name: &str) -> Result<String, String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "`{name}` is not a variable name (letters, digits and _, not starting with a digit)"
        ))
    }
}

/// Encodes variables for the pipe: `name=value` entries, each ended by a
/// NUL byte (neither can hold one), as `/proc/<pid>/environ` does.
pub fn encode(vars: &[(OsString, OsString)]) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for (name, value) in vars {
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// Decodes what [`encode`] wrote; an entry without `=` is skipped.
pub fn decode(bytes: &[u8]) -> Vec<(OsString, OsString)> {
    use std::os::unix::ffi::OsStrExt;
    bytes
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| {
            let eq = entry.iter().position(|b| *b == b'=')?;
            Some((
                OsStr::from_bytes(&entry[..eq]).to_owned(),
                OsStr::from_bytes(&entry[eq + 1..]).to_owned(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_keeps_shell_basics_and_drops_keys() {
        for name in ["PATH", "HOME", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ"] {
            assert!(harmless(OsStr::new(name)), "{name}");
        }
        for name in [
            "OPENAI_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "PATHX",
            "LD_PRELOAD",
            "LC",
            "NO_COLOR",
        ] {
            assert!(!harmless(OsStr::new(name)), "{name}");
        }
        assert!(kept_in_process(OsStr::new("NO_COLOR")));
        assert!(!kept_in_process(OsStr::new("OPENAI_API_KEY")));
    }

    #[test]
    fn encoding_round_trips_values_with_equals_signs_and_newlines() {
        let vars = vec![
            (OsString::from("A"), OsString::from("x=y\nz")),
            (OsString::from("EMPTY"), OsString::new()),
        ];
        assert_eq!(decode(&encode(&vars)), vars);
        assert!(decode(b"noequals\0").is_empty());
    }
}
