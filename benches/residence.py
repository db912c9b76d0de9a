#!/usr/bin/env python3
"""Where a fan-out sibling's slot time goes, from a run's audit log.

Reads `troupe runs export <run>` on stdin and splits the time a sibling
holds one of the cap's slots into what the log can see:

  executing   StageEntered -> StageAssertOutcome (the stage's own work)
  exiting     StageAssertOutcome -> StageExited made (Exit's own work)
  storing     StageExited made -> StageExited published: the result handed
              to the store and committed. An event's `ts` is when it was
              made, its `seq` when it was published, so the publish time
              is read from the next event published after it that is no
              StageExited (those are made long before they are published)
  between     the rest of the slot's cycle: the report reaching the
              scheduler, the next sibling spawned, its start asked for and
              granted, until its StageEntered

By Little's law a slot's cycle is cap / throughput; `between` is that cycle
less the mean executing and settling time. Only the middle 80% of the
siblings (by StageExited) is counted, so ramp-up and drain do not blur it.

    troupe runs export RUN --runs-dir DIR | benches/residence.py --cap 256

How it was used: BENCHMARKS.md, "Every core, fifth round".
"""
import argparse
import datetime
import json
import statistics
import sys


def ts(text):
    # 2026-11-26T16:00:00.515672Z; fromisoformat takes the offset form.
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, required=True)
    parser.add_argument("--stage", default="worker")
    args = parser.parse_args()

    marks = {}
    made = {}
    for raw in sys.stdin:
        event = json.loads(raw)
        if event["event"] != "StageExited":
            made[event["seq"]] = event["ts"]
        if event.get("stageId") != args.stage:
            continue
        if event["event"] == "StageExited":
            marks.setdefault(event["stageExecutionId"], {})["seq"] = event["seq"]
        name = event["event"]
        if name in ("StageEntered", "StageAssertOutcome", "StageExited"):
            marks.setdefault(event["stageExecutionId"], {})[name] = ts(event["ts"])
    done = [
        m
        for m in marks.values()
        if {"StageEntered", "StageAssertOutcome", "StageExited"} <= m.keys()
    ]
    if len(done) < 10:
        sys.exit(f"only {len(done)} complete {args.stage} executions in the log")
    done.sort(key=lambda m: m["StageExited"])
    lo, hi = len(done) // 10, len(done) - len(done) // 10
    middle = done[lo:hi]
    window = middle[-1]["StageExited"] - middle[0]["StageExited"]
    rate = (len(middle) - 1) / window
    cycle = args.cap / rate

    def us(values):
        values = sorted(values)
        return (
            statistics.fmean(values) * 1e6,
            values[len(values) // 2] * 1e6,
            values[int(len(values) * 0.99)] * 1e6,
        )

    executing = us([m["StageAssertOutcome"] - m["StageEntered"] for m in middle])
    exiting = us([m["StageExited"] - m["StageAssertOutcome"] for m in middle])
    def published(m):
        for seq in range(m["seq"] + 1, m["seq"] + 10_000):
            if seq in made:
                return max(m["StageExited"], ts(made[seq]))
        return m["StageExited"]

    storing = us([published(m) - m["StageExited"] for m in middle])
    between = cycle * 1e6 - executing[0] - exiting[0] - storing[0]
    print(f"{len(done)} siblings, middle {len(middle)}: {rate:,.0f} siblings/s, "
          f"slot cycle {cycle * 1e6:,.0f} us at cap {args.cap}")
    print(f"{'':12s} {'mean':>9s} {'median':>9s} {'p99':>9s}  (us)")
    for name, (mean, median, p99) in (
        ("executing", executing),
        ("exiting", exiting),
        ("storing", storing),
    ):
        print(f"{name:12s} {mean:9,.0f} {median:9,.0f} {p99:9,.0f}  {100 * mean / (cycle * 1e6):4.0f}%")
    print(f"{'between':12s} {between:9,.0f} {'':9s} {'':9s}  {100 * between / (cycle * 1e6):4.0f}%")


if __name__ == "__main__":
    main()
