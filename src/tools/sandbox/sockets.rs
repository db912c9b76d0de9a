//! With `network: deny`, the sockets Landlock's network rules do not see.
//!
//! Landlock's network rules (ABI 4) check TCP: `socket(AF_INET,
//! SOCK_STREAM, IPPROTO_MPTCP)` is not TCP to them, and multipath TCP
//! falls back to plain TCP on the wire, so a denied shell made full
//! connections through it (found by review). The same holds for SCTP and
//! for raw and packet sockets (open to a root shell). So a denied shell
//! also gets a seccomp filter on `socket()`: in the internet families
//! only TCP (which Landlock refuses to connect or bind) and UDP (which
//! `network: deny` leaves open, as documented) may be made; `AF_PACKET`
//! not at all; every other family (Unix sockets, netlink) as before. A
//! refused socket fails with `EACCES`, as Landlock's refusals do.
//!
//! io_uring, which makes sockets without a `socket()` call, is refused
//! whole (`ENOSYS`). The filter is a small classic-BPF program written
//! here, for x86-64 and aarch64; on another architecture, or for a program
//! of the machine's compat ABI (i386 on x86-64), `socket` and `socketcall`
//! are refused whole.

#![allow(unsafe_code)]

/// One BPF instruction, before jumps are resolved.
enum Op {
    /// Load the 32-bit word at this offset of `seccomp_data`.
    Load(u32),
    /// AND the accumulator with a constant.
    And(u32),
    /// If the accumulator equals `k` go to the first label, else the
    /// second.
    JumpIf(u32, &'static str, &'static str),
    /// If the accumulator equals `k` go to the label, else on to the next
    /// instruction.
    JumpEq(u32, &'static str),
    /// Return.
    Return(u32),
    /// A place to jump to (no instruction).
    Label(&'static str),
}

/// Offsets in `struct seccomp_data`: the syscall number, the
/// architecture, then the arguments (their low 32 bits on a
/// little-endian machine).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const EACCES: u32 = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;
/// io_uring makes sockets (`IORING_OP_SOCKET`) where seccomp never sees a
/// `socket()`: a denied shell opened an MPTCP one that way (found by
/// review). It gets no io_uring at all, as if the kernel had none, which
/// runtimes that use it (libuv) take as the cue to fall back.
const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
/// `io_uring_setup`, `io_uring_enter`, `io_uring_register`: the same
/// numbers on every architecture (and compat ABI) troupe filters.
const IO_URING_SETUP: u32 = 425;
const IO_URING_ENTER: u32 = 426;
const IO_URING_REGISTER: u32 = 427;

#[cfg(target_arch = "x86_64")]
mod native {
    /// `AUDIT_ARCH_X86_64`.
    pub const ARCH: u32 = 0xC000_003E;
    /// The x32 ABI's syscalls are the native ones with this bit set.
    pub const X32: u32 = 0x4000_0000;
    /// i386's `socketcall` and `socket`, reachable by `int 0x80`.
    pub const COMPAT_SOCKET: [u32; 2] = [102, 359];
}

#[cfg(target_arch = "aarch64")]
mod native {
    /// `AUDIT_ARCH_AARCH64`.
    pub const ARCH: u32 = 0xC000_00B7;
    pub const X32: u32 = 0;
    /// 32-bit ARM's `socket` (EABI; no `socketcall`).
    pub const COMPAT_SOCKET: [u32; 2] = [281, 281];
}

/// The filter's program.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn program() -> Vec<Op> {
    use Op::*;
    let socket = libc::SYS_socket as u32;
    let [compat_a, compat_b] = native::COMPAT_SOCKET;
    vec![
        Load(ARCH),
        JumpIf(native::ARCH, "native", "compat"),
        Label("native"),
        Load(NR),
        And(!native::X32),
        JumpEq(IO_URING_SETUP, "no-uring"),
        JumpEq(IO_URING_ENTER, "no-uring"),
        JumpEq(IO_URING_REGISTER, "no-uring"),
        JumpIf(socket, "socket", "allow"),
        Label("socket"),
        Load(arg(0)),
        JumpEq(libc::AF_PACKET as u32, "deny"),
        JumpEq(libc::AF_INET as u32, "inet"),
        JumpIf(libc::AF_INET6 as u32, "inet", "allow"),
        Label("inet"),
        Load(arg(1)),
        And(0xf),
        JumpEq(libc::SOCK_STREAM as u32, "stream"),
        JumpIf(libc::SOCK_DGRAM as u32, "dgram", "deny"),
        Label("stream"),
        Load(arg(2)),
        JumpEq(0, "allow"),
        JumpIf(libc::IPPROTO_TCP as u32, "allow", "deny"),
        Label("dgram"),
        Load(arg(2)),
        JumpEq(0, "allow"),
        JumpIf(libc::IPPROTO_UDP as u32, "allow", "deny"),
        Label("compat"),
        Load(NR),
        JumpEq(IO_URING_SETUP, "no-uring"),
        JumpEq(IO_URING_ENTER, "no-uring"),
        JumpEq(IO_URING_REGISTER, "no-uring"),
        JumpEq(compat_a, "deny"),
        JumpIf(compat_b, "deny", "allow"),
        Label("allow"),
        Return(ALLOW),
        Label("deny"),
        Return(EACCES),
        Label("no-uring"),
        Return(ENOSYS),
    ]
}

/// `ops` as BPF instructions, each jump resolved to the distance to its
/// label (forward only, as classic BPF wants).
fn assemble(ops: &[Op]) -> Result<Vec<libc::sock_filter>, String> {
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for op in ops {
        match op {
            Op::Label(name) => {
                at.insert(*name, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for op in ops {
        let here = out.len();
        let to = |label: &str| -> Result<u8, String> {
            let target = *at.get(label).ok_or_else(|| format!("no label {label}"))?;
            target
                .checked_sub(here + 1)
                .and_then(|d| u8::try_from(d).ok())
                .ok_or_else(|| format!("label {label} is not ahead within reach"))
        };
        let (code, jt, jf, k) = match op {
            Op::Label(_) => continue,
            Op::Load(offset) => (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, *offset),
            Op::And(k) => (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0, 0, *k),
            Op::JumpIf(k, t, f) => (
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                to(t)?,
                to(f)?,
                *k,
            ),
            Op::JumpEq(k, t) => (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, to(t)?, 0, *k),
            Op::Return(k) => (libc::BPF_RET | libc::BPF_K, 0, 0, *k),
        };
        out.push(libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        });
    }
    Ok(out)
}

/// Installs the filter on the calling thread, for good; what it execs
/// inherits it. `no_new_privs` is set first (the kernel wants it for a
/// filter installed without privileges).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn deny_unconfined_sockets() -> Result<(), String> {
    let filter = assemble(&program())?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    let prog = libc::sock_fprog {
        len: u16::try_from(filter.len()).map_err(|_| "the filter is too long".to_owned())?,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `filter`, alive for the call; the kernel
    // copies the program and keeps no pointer to it.
    let done = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog as *const libc::sock_fprog,
        )
    };
    if done != 0 {
        return Err(format!(
            "cannot install the socket filter (seccomp): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Elsewhere there is no filter to install: `network: deny` is refused.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn deny_unconfined_sockets() -> Result<(), String> {
    Err("`network: deny` filters sockets on x86-64 and aarch64 only".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every jump lands on an instruction ahead, and the program ends in
    /// returns.
    #[test]
    fn the_program_assembles_with_every_jump_forward() {
        let filter = assemble(&program()).unwrap();
        assert!(filter.len() > 10);
        for (i, ins) in filter.iter().enumerate() {
            if ins.code == (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16 {
                assert!(i + 1 + usize::from(ins.jt) < filter.len());
                assert!(i + 1 + usize::from(ins.jf) < filter.len());
            }
        }
        let last = filter.last().unwrap();
        assert_eq!(last.code, (libc::BPF_RET | libc::BPF_K) as u16);
        assert!(assemble(&[Op::JumpIf(0, "nowhere", "nowhere")]).is_err());
    }
}
