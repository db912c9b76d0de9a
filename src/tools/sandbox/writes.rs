//! Write confinement with Landlock: restricts the calling thread (and
//! whatever it execs) to writing beneath given folders, plus the few
//! devices every shell writes to, and to signalling only its own
//! descendants. Reading and executing stay allowed everywhere. Also
//! probes, on a throwaway thread, whether the kernel enforces it.

use std::path::{Path, PathBuf};

use crate::error::{Code, ErrorClass, HasCode};

/// Devices a confined shell may still write to (`> /dev/null` is in every
/// other script); a missing one is skipped.
pub const WRITABLE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// Why writes could not be confined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// The kernel enforces no Landlock rule: not built in, disabled at
    /// boot, or blocked (seccomp, a container runtime), or not Linux.
    #[error("Landlock is not available on this kernel ({0})")]
    Unavailable(String),
    /// A folder writes should be confined to cannot be opened.
    #[error("cannot open {}: {message}", path.display())]
    Folder { path: PathBuf, message: String },
    /// The kernel or the binding refused the rules.
    #[error("Landlock refused the rules: {0}")]
    Rules(String),
}

impl HasCode for SandboxError {
    fn code(&self) -> Code {
        let name = match self {
            SandboxError::Unavailable(_) => "SandboxUnavailable",
            SandboxError::Folder { .. } | SandboxError::Rules(_) => "SandboxFailed",
        };
        Code {
            class: ErrorClass::ToolTerminal,
            name,
        }
    }
}

/// How far writes are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confined {
    /// The Landlock ABI the kernel offers (as far as the binding knows).
    pub abi: i32,
    /// Some of what troupe asks for is not handled by this kernel (ABI 1
    /// has no `Refer`, ABI 1–2 no `Truncate`, ABI 1–5 no signal scoping):
    /// the core write rights are confined, those are not.
    pub partial: bool,
}

impl std::fmt::Display for Confined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Landlock ABI {}", self.abi)?;
        if self.partial {
            write!(f, " (partial: this kernel lacks some rights or scopes)")?;
        }
        Ok(())
    }
}

/// Restricts the calling thread, for good, to writing beneath `folders`
/// (and [`WRITABLE_DEVICES`]) and to signalling only processes it starts
/// (so a command cannot kill troupe or the user's other programs); what it
/// execs inherits the restriction. Also sets `no_new_privs`, so set-uid
/// programs gain nothing. Fails when the kernel enforces nothing: a caller
/// that asked for confinement must not run unconfined.
pub fn confine_writes(folders: &[impl AsRef<Path>]) -> Result<Confined, SandboxError> {
    confine(folders, false)
}

/// [`confine_writes`], and with `deny_network` no TCP connect or bind at
/// all (Landlock's network rules, ABI 4). A kernel without them is an
/// error: a caller that asked for no network must not run with it.
#[cfg(target_os = "linux")]
pub fn confine(folders: &[impl AsRef<Path>], deny_network: bool) -> Result<Confined, SandboxError> {
    use landlock::{
        ABI, Access, AccessFs, AccessNet, LandlockStatus, PathBeneath, PathFd, Ruleset,
        RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
    };
    let rules = |e: landlock::RulesetError| SandboxError::Rules(e.to_string());
    // ABI 3's write rights: every way to create, remove, rename, link,
    // write or truncate a file. Newer ABIs add no write right (IoctlDev
    // and ResolveUnix are left unhandled: not writes to the file tree).
    let write = AccessFs::from_write(ABI::V3);
    let mut base = Ruleset::default()
        .handle_access(write)
        .map_err(rules)?
        .scope(Scope::Signal)
        .map_err(rules)?;
    if deny_network {
        // Handled and never allowed: every TCP connect and bind fails.
        base = base
            .handle_access(AccessNet::from_all(ABI::V4))
            .map_err(rules)?;
    }
    let mut ruleset = base.create().map_err(rules)?;
    for folder in folders {
        let path = folder.as_ref();
        let fd = PathFd::new(path).map_err(|e| SandboxError::Folder {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, write))
            .map_err(rules)?;
    }
    let status = ruleset
        .add_rules(path_beneath_rules(
            WRITABLE_DEVICES,
            AccessFs::WriteFile | AccessFs::Truncate,
        ))
        .map_err(rules)?
        .restrict_self()
        .map_err(rules)?;
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
        LandlockStatus::NotEnabled => {
            return Err(SandboxError::Unavailable("disabled at boot".to_owned()));
        }
        LandlockStatus::NotImplemented => {
            return Err(SandboxError::Unavailable(
                "not built into this kernel, or blocked".to_owned(),
            ));
        }
    };
    if deny_network && abi < 4 {
        return Err(SandboxError::Unavailable(format!(
            "`network: deny` needs Landlock's network rules (ABI 4), this kernel has ABI {abi}"
        )));
    }
    // The sockets those rules do not see (MPTCP, SCTP, raw, packet).
    if deny_network {
        super::sockets::deny_unconfined_sockets().map_err(SandboxError::Unavailable)?;
    }
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(Confined {
            abi,
            partial: false,
        }),
        RulesetStatus::PartiallyEnforced => Ok(Confined { abi, partial: true }),
        RulesetStatus::NotEnforced => Err(SandboxError::Unavailable(format!(
            "ABI {abi} enforced none of the rules"
        ))),
    }
}

/// Landlock is Linux-only.
#[cfg(not(target_os = "linux"))]
pub fn confine(
    _folders: &[impl AsRef<Path>],
    _deny_network: bool,
) -> Result<Confined, SandboxError> {
    Err(SandboxError::Unavailable("it is Linux-only".to_owned()))
}

/// Whether [`confine_writes`] works here for `folders`: runs it on a
/// thread of its own, which ends with its restriction (Landlock restricts
/// one thread and what it starts), so the caller stays unconfined.
pub fn probe(folders: &[PathBuf]) -> Result<Confined, SandboxError> {
    probe_with(folders, false)
}

/// [`probe`], with the network rules of [`confine`] when `deny_network`.
pub fn probe_with(folders: &[PathBuf], deny_network: bool) -> Result<Confined, SandboxError> {
    let folders = folders.to_vec();
    std::thread::Builder::new()
        .name("troupe-landlock-probe".into())
        .spawn(move || confine(&folders, deny_network))
        .map_err(|e| SandboxError::Unavailable(format!("cannot start the probe: {e}")))?
        .join()
        .unwrap_or_else(|_| Err(SandboxError::Rules("the probe crashed".to_owned())))
}
