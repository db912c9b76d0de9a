//! The shell sandbox: what a `Bash` call sees of troupe's environment and
//! where it may write. See SECURITY.md for what it does and does not
//! guarantee.

pub mod env;
pub mod policy;
#[cfg(target_os = "linux")]
mod sockets;
pub mod writes;

pub use env::{ENV_ALLOWLIST, check_env_name, scrubbed_env};
pub use policy::{ShellSandbox, WriteConfinement, mode};
pub use writes::{Confined, SandboxError, confine, confine_writes, probe, probe_with};
