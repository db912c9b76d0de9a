#!/usr/bin/env python3
"""CPU seconds per thread of one command (a `troupe run`), summed by thread
name: which of a run's threads sets its pace. Each thread's utime+stime is
read from /proc every 50 ms and its last reading kept, so a thread that
ends early still counts. Linux only.

The last column is each name's busiest half second: the most CPU its
threads took in any 0.5 s of the run, as a share of a core (summed over
the threads of that name). A one-per-run thread that reads near 100%
there sets the pace of the run's middle, even when its share of the
whole run (start and drain included) looks modest.

    benches/thread_cpu.py target/release/troupe run stages/fanout \\
        --ctx width=200000 --parallel-cap 256 --latency 0ms --threads 2

With THREAD_CPU_PASS=1 the command's own output passes through and the
table goes to stderr: for wrapping a command whose output a script
reads (a distributed run's coordinator inside benches/distributed.sh).

How it was used: BENCHMARKS.md, "Every core and across machines, second
round".
"""
import glob
import os
import subprocess
import sys
import time

import cpu_window

if len(sys.argv) < 2:
    sys.exit(__doc__)
tick = os.sysconf("SC_CLK_TCK")
passing = os.environ.get("THREAD_CPU_PASS") == "1"
out = sys.stderr if passing else sys.stdout
child = subprocess.Popen(sys.argv[1:], stdout=None if passing else subprocess.DEVNULL)
WINDOW = 0.5
last = {}
# (time, {name: CPU seconds so far}) at every sample, for the busiest window.
samples = []
start = time.time()
while child.poll() is None:
    for stat in glob.glob(f"/proc/{child.pid}/task/*/stat"):
        try:
            raw = open(stat).read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        last[stat] = (name, (int(fields[11]) + int(fields[12])) / tick)
    so_far = {}
    for name, cpu in last.values():
        so_far[name] = so_far.get(name, 0.0) + cpu
    samples.append((time.time(), so_far))
    time.sleep(0.05)
wall = time.time() - start
by_name = {}
for name, cpu in last.values():
    by_name[name] = by_name.get(name, 0.0) + cpu


def busiest(name):
    """The most CPU `name` took in any WINDOW seconds, per second."""
    return cpu_window.busiest(samples, lambda cpu: cpu.get(name, 0.0), WINDOW)


print(f"wall {wall:.2f} s, exit {child.returncode}  (last column: the busiest {WINDOW} s)", file=out)
for name, cpu in sorted(by_name.items(), key=lambda kv: -kv[1]):
    if cpu >= 0.01:
        print(
            f"  {name:24s} {cpu:6.2f} s  {100 * cpu / wall:5.1f}% of a core"
            f"  {100 * busiest(name):5.1f}%",
            file=out,
        )
