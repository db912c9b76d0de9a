#!/usr/bin/env bash
# troupe serve: submit-to-first-event latency, and a run with ten watchers
# against the same run with none. Release build; one server per round.
#
#   benches/serve.sh [ROUNDS]        # default 20
#
# Latency: from just before `troupe submit --watch` is started to the line
# the watch prints for the run's WorkflowStarted (so it includes starting
# the client process, the submission, the run's preparation and the
# stream's first read). Prints the median and the range, in ms.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=$PWD/target/release/troupe
stages=$PWD/stages
rounds=${1:-20}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
"$troupe" serve > serve.out 2> serve.err &
until [ -S .troupe/troupe.sock ]; do sleep 0.05; done
python3 - "$troupe" "$stages" "$rounds" <<'PY'
import subprocess, sys, time, statistics
troupe, stages, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
took = []
for _ in range(rounds):
    t0 = time.perf_counter()
    p = subprocess.Popen([troupe, "submit", f"{stages}/fanout", "--ctx", "width=10", "--watch"],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if "WorkflowStarted" in line:
            took.append((time.perf_counter() - t0) * 1000)
            break
    p.wait()
took.sort()
print(f"submit-to-first-event: median {statistics.median(took):.1f} ms, range {took[0]:.1f}-{took[-1]:.1f} ms over {rounds}")
PY
