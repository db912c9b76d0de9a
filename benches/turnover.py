#!/usr/bin/env python3
"""How long a fan-out's slots stood empty between siblings, from its log.

Reads `troupe runs export <run>` on stdin. While the cap is full, each
sibling's exit frees a slot and the next start takes one, so the k-th
start after the first --cap takes the slot of the k-th exit: the time
between them (by the events' `ts`, which a worker stamps where the
sibling ran) is that slot's turnover. Prints its mean and percentiles in
milliseconds, and with --worst N the N longest with the sibling that
waited and its worker. A local run reads about a millisecond at the
99th percentile; a distributed run adds its round trips to the server,
and any task that waited on a worker without a slot while another
worker had one (the twenty-third round found such holds at 94 ms, p90).

    troupe runs export RUN --runs-dir DIR | benches/turnover.py --cap 1024

How it was used: BENCHMARKS.md, "Every core, twenty-third round".
"""
import argparse
import json
import statistics
import sys

# The log's timestamps as seconds, read as residence.py reads them (this
# folder is on the path of a script run from it).
from residence import ts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, required=True, help="the fan-out's cap")
    parser.add_argument("--stage", default="worker", help="the fan-out's stage id")
    parser.add_argument("--worst", type=int, default=0, help="list the N longest turnovers")
    args = parser.parse_args()
    marker = f"/{args.stage}#"
    entered, exited = [], []
    for raw in sys.stdin:
        event = json.loads(raw)
        if marker not in event.get("stageExecutionId", ""):
            continue
        if event["event"] == "StageEntered":
            entered.append((ts(event["ts"]), event.get("index"), event.get("worker", "-")))
        elif event["event"] == "StageExited":
            exited.append(ts(event["ts"]))
    entered.sort()
    exited.sort()
    if len(entered) <= args.cap:
        sys.exit(f"{len(entered)} `{args.stage}` siblings: no slot was taken twice at cap {args.cap}")
    turns = [
        ((entered[args.cap + k][0] - exited[k]) * 1000, entered[args.cap + k])
        for k in range(min(len(entered) - args.cap, len(exited)))
    ]
    gaps = sorted(g for g, _ in turns)

    def at(p):
        return gaps[int(p * (len(gaps) - 1))]

    print(
        f"{len(gaps)} turnovers (ms): mean {statistics.mean(gaps):.1f}, p10 {at(0.1):.1f}, "
        f"p50 {at(0.5):.1f}, p90 {at(0.9):.1f}, p99 {at(0.99):.1f}, most {gaps[-1]:.1f}"
    )
    for gap, (_, index, worker) in sorted(turns, key=lambda t: -t[0])[: args.worst]:
        print(f"  {gap:7.1f} ms before sibling {index} started on {worker}")


if __name__ == "__main__":
    main()
