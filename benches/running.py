#!/usr/bin/env python3
"""How many fan-out siblings were running over a run, from its audit log.

Reads `troupe runs export <run>` on stdin and prints, every --step
milliseconds from the first sibling's StageEntered, how many siblings had
entered and not yet exited (by the events' `ts`, which a worker stamps
where the sibling ran). A run that keeps its cap full reads the cap
throughout; dips show where slots waited to be refilled (a distributed
run's wave turnovers: a whole wave's reports and next tasks at once). The
last line says how full the slots were on average until the last sibling
started (the drain after it is the same for any run).

    troupe runs export RUN --runs-dir DIR | benches/running.py --step 25

How it was used: BENCHMARKS.md, "Every core, nineteenth round".
"""
import argparse
import json
import sys

# The log's timestamps as seconds, read as residence.py reads them (this
# folder is on the path of a script run from it).
from residence import ts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=float, default=25.0, help="milliseconds between readings")
    parser.add_argument("--stage", default="worker", help="the fan-out's stage id")
    args = parser.parse_args()
    marker = f"/{args.stage}#"
    changes = []
    for raw in sys.stdin:
        event = json.loads(raw)
        if marker not in event.get("stageExecutionId", ""):
            continue
        if event["event"] == "StageEntered":
            changes.append((ts(event["ts"]), 1))
        elif event["event"] == "StageExited":
            changes.append((ts(event["ts"]), -1))
    if not changes:
        sys.exit(f"no `{args.stage}` siblings in the log")
    changes.sort()
    start = changes[0][0]
    running, i, at, readings = 0, 0, start, []
    while i < len(changes):
        while i < len(changes) and changes[i][0] <= at:
            running += changes[i][1]
            i += 1
        readings.append(f"{(at - start) * 1000:.0f}:{running}")
        at += args.step / 1000
    print(" ".join(readings))
    # Until the last sibling entered the cap could be kept full: how full
    # it was on average (the drain after it is the same for every run).
    last_entry = max(t for t, change in changes if change > 0)
    held = [int(r.split(":")[1]) for r in readings if float(r.split(":")[0]) <= (last_entry - start) * 1000]
    peak = max(held)
    mean = sum(held) / len(held)
    print(f"until the last start: mean {mean:.0f} running, {mean / peak:.1%} of the most ({peak})")


if __name__ == "__main__":
    main()
