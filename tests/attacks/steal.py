"""The attacker's side of tests/secrets.rs: run as a `Bash` call inside a
troupe run, it tries every route to a secret troupe holds and writes what
each route gave into loot/<route>.txt in the current folder (the project
root, the one place the sandbox lets it write). The test then looks for
the secret in the loot. Each route also writes how it ended, so a route
that never ran is told apart from one that was refused."""

import ctypes
import os
import re
import sys

TROUPE = sys.argv[1]  # the troupe binary's path, to find troupe's processes
PREFIX = b"sk-troupe-"  # what API keys look like; the attacker knows that much
os.makedirs("loot", exist_ok=True)


def loot(route, text):
    with open(os.path.join("loot", route + ".txt"), "a") as f:
        f.write(text + "\n")


def troupe_pids():
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.path.realpath(os.readlink(f"/proc/{name}/exe")) == TROUPE:
                pids.append(int(name))
        except OSError:
            # A process whose exe we cannot read: try its cmdline instead.
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[0].endswith(b"troupe"):
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def attempt(route, fn):
    try:
        loot(route, "got: " + fn())
    except Exception as e:  # the route was refused: say how
        loot(route, f"refused: {type(e).__name__}: {e}")


def read_bytes(path, limit=1 << 20):
    with open(path, "rb") as f:
        return f.read(limit).decode("latin-1")


def scan_mem(pid):
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
            if not m or "r" not in m.group(3):
                continue
            start, end = int(m.group(1), 16), int(m.group(2), 16)
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except OSError:
                continue
            for hit in re.finditer(re.escape(PREFIX) + rb"[\x21-\x7e]{0,40}", chunk):
                found.append(hit.group(0).decode("latin-1"))
    return "scanned; hits: " + " ".join(found)


def read_fds(pid):
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        target = os.readlink(path)
        out.append(f"{fd} -> {target}")
        if target.startswith("/") and os.path.isfile(path):
            try:
                out.append(read_bytes(path, 4 << 20))
            except OSError as e:
                out.append(f"unreadable: {e}")
    return "\n".join(out)


def ptrace_attach(pid):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
        # Wait for the stop, then let go: a detach before the stop fails
        # and would leave troupe stopped.
        os.waitpid(pid, 0x40000000)  # __WALL
        libc.ptrace(17, pid, 0, 0)  # PTRACE_DETACH
        return "ATTACHED"
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def signal(pid):
    os.kill(pid, 0)
    return "SIGNAL ALLOWED"


attempt("own-environ", lambda: read_bytes("/proc/self/environ") + "\n" + "\n".join(f"{k}={v}" for k, v in os.environ.items()))
pids = troupe_pids()
loot("pids", " ".join(map(str, pids)))
for pid in pids:
    attempt("environ", lambda: read_bytes(f"/proc/{pid}/environ"))
    attempt("cmdline", lambda: read_bytes(f"/proc/{pid}/cmdline"))
    attempt("mem", lambda: scan_mem(pid))
    attempt("fd", lambda: read_fds(pid))
    attempt("ptrace", lambda: ptrace_attach(pid))
    attempt("signal", lambda: signal(pid))
