#!/usr/bin/env python3
"""CPU seconds per thread of one command (a `troupe run`), summed by thread
name: which of a run's threads sets its pace. Each thread's utime+stime is
read from /proc every 50 ms and its last reading kept, so a thread that
ends early still counts. Linux only.

    benches/thread_cpu.py target/release/troupe run stages/fanout \\
        --ctx width=200000 --parallel-cap 256 --latency 0ms --threads 2

How it was used: BENCHMARKS.md, "Every core and across machines, second
round".
"""
import glob
import os
import subprocess
import sys
import time

if len(sys.argv) < 2:
    sys.exit(__doc__)
tick = os.sysconf("SC_CLK_TCK")
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
last = {}
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
    time.sleep(0.05)
wall = time.time() - start
by_name = {}
for name, cpu in last.values():
    by_name[name] = by_name.get(name, 0.0) + cpu
print(f"wall {wall:.2f} s, exit {child.returncode}")
for name, cpu in sorted(by_name.items(), key=lambda kv: -kv[1]):
    if cpu >= 0.01:
        print(f"  {name:24s} {cpu:6.2f} s  {100 * cpu / wall:5.1f}% of a core")
