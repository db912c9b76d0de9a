//! The environment a sandboxed `Bash` call gets: an allowlist of troupe's
//! variables (what a shell and common tools need to run, nothing that
//! usually holds a secret) plus the ones named with `--pass-env`.

/// Variables passed to a sandboxed shell as troupe has them. `LC_*` means
/// every variable whose name starts with `LC_`.
pub use crate::environ::HARMLESS as ENV_ALLOWLIST;

/// The allowlisted variables and those named in `pass`, as troupe was
/// started with them (its sealed environment), sorted by name. A name in
/// `pass` that is not set is left out.
pub fn scrubbed_env(pass: &[String]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    crate::environ::scrubbed(pass)
}

pub use crate::environ::check_env_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_env_names_are_checked() {
        assert_eq!(check_env_name("CARGO_HOME"), Ok("CARGO_HOME".to_owned()));
        assert_eq!(check_env_name("_x1"), Ok("_x1".to_owned()));
        for bad in ["", "1A", "A=B", "A B", "Ä"] {
            assert!(check_env_name(bad).is_err(), "{bad}");
        }
    }
}
