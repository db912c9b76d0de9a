//! The environment a sandboxed `Bash` call gets: an allowlist of troupe's
//! variables (what a shell and common tools need to run, nothing that
//! usually holds a secret) plus the ones named with `--pass-env`.

use std::ffi::{OsStr, OsString};

/// Variables passed to a sandboxed shell as troupe has them. `LC_*` means
/// every variable whose name starts with `LC_`.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ", "TMPDIR",
];

/// Whether `name` is on [`ENV_ALLOWLIST`].
fn allowed(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    ENV_ALLOWLIST.iter().any(|a| match a.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *a,
    })
}

/// The allowlisted variables and those named in `pass`, as troupe's
/// environment holds them now, sorted by name. A name in `pass` that is
/// not set is left out.
pub fn scrubbed_env(pass: &[String]) -> Vec<(OsString, OsString)> {
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(name, _)| allowed(name) || pass.iter().any(|p| OsStr::new(p) == name))
        .collect();
    vars.sort();
    vars
}

/// Checks a `--pass-env` name: letters, digits and `_`, not starting with a
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_keeps_shell_basics_and_drops_keys() {
        for name in ["PATH", "HOME", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ"] {
            assert!(allowed(OsStr::new(name)), "{name}");
        }
        for name in [
            "OPENAI_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "PATHX",
            "LD_PRELOAD",
            "LC",
        ] {
            assert!(!allowed(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn pass_env_names_are_checked() {
        assert_eq!(check_env_name("CARGO_HOME"), Ok("CARGO_HOME".to_owned()));
        assert_eq!(check_env_name("_x1"), Ok("_x1".to_owned()));
        for bad in ["", "1A", "A=B", "A B", "Ä"] {
            assert!(check_env_name(bad).is_err(), "{bad}");
        }
    }
}
