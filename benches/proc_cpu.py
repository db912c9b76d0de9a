#!/usr/bin/env python3
"""CPU seconds of every process whose command line contains one of the
given strings, sampled from /proc every 0.1 s until this script is sent
SIGTERM: for each process its total, its busiest half second (as a share
of a core) and its busiest thread names. Which process of a distributed
run sets its pace: the coordinator, a worker, or nats-server. A process
seen for less than half a second reads 0% at its busiest. Linux only.

    benches/proc_cpu.py nats-server target/release/troupe > procs.txt &
    benches/distributed.sh --threads default --width 40000 --cap 256 \\
        --latency 0ms --worker-threads 4 --repeat 1
    kill -TERM %1; wait

How it was used: BENCHMARKS.md, "Every core, tenth round".
"""
import glob
import os
import signal
import sys
import time

import cpu_window

if len(sys.argv) < 2:
    sys.exit(__doc__)
TICK = os.sysconf("SC_CLK_TCK")
WINDOW = 0.5
patterns = sys.argv[1:]
# (time, {(pid, thread name): CPU seconds so far}) at every sample.
samples = []
commands = {}
stopping = False


def stop(*_):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, stop)
while not stopping:
    snapshot = {}
    for stat in glob.glob("/proc/[0-9]*/task/*/stat"):
        pid = stat.split("/")[2]
        try:
            raw = open(stat).read()
            command = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:80]
        except OSError:
            continue
        if pid == str(os.getpid()) or not any(p in command for p in patterns):
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        thread = raw[raw.index("(") + 1 : raw.rindex(")")]
        key = (pid, thread)
        snapshot[key] = snapshot.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
        commands[pid] = command
    samples.append((time.time(), snapshot))
    time.sleep(0.1)


def of(snapshot, pid):
    return sum(cpu for (p, _), cpu in snapshot.items() if p == pid)


for pid in sorted({p for _, s in samples for (p, _) in s}, key=int):
    threads = {}
    for _, snapshot in samples:
        for (p, thread), cpu in snapshot.items():
            if p == pid:
                threads[thread] = max(threads.get(thread, 0.0), cpu)
    busiest = cpu_window.busiest(samples, lambda snapshot: of(snapshot, pid), WINDOW)
    print(f"{pid:>7} {sum(threads.values()):6.2f} s  busiest {100 * busiest:4.0f}%  {commands[pid]}")
    for thread, cpu in sorted(threads.items(), key=lambda kv: -kv[1])[:6]:
        if cpu >= 0.02:
            print(f"          {thread:20s} {cpu:6.2f} s")
