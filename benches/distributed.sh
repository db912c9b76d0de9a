#!/usr/bin/env bash
# Distributed fan-out on one machine: a nats-server on loopback, W workers
# and a coordinator, against the same run done locally. Prints, per case,
# the wall time, siblings per second and the ratio to the ideal
# ceil(N/cap) × turns × latency; with --fail, the time from the failing
# sibling's StageExited to the last StageCancelled (from the audit log).
# How it was used and what it showed: BENCHMARKS.md, "Across machines".
#
#   benches/distributed.sh [--width N] [--cap C] [--latency D] [--workers W]
#                          [--worker-threads T] [--repeat R] [--fail INDEX]
#                          [--threads T] [--turnover]
#
# --turnover: after each distributed run, how long its slots stood empty
# between siblings (benches/turnover.py: mean and percentiles, and the
# five longest with the sibling that waited).
#
# Each worker runs its siblings on T threads (default 1). At 0 ms a
# worker's siblings take 40-57 us of that thread's CPU each on the 2-core
# VM: give the workers threads (or more workers) to be sure they are not
# what sets the pace when measuring the coordinator's own ceiling.
#
# The coordinator (and the local run it is compared with) runs on
# --threads T (default 2, as every round before the tenth measured it);
# `--threads default` leaves it to troupe (the machine's cores, at most 9).
#
# Needs a release build (cargo build --release) and nats-server on PATH or
# in $TROUPE_NATS_SERVER.
set -euo pipefail
cd "$(dirname "$0")/.."

width=10000 cap=256 latency=50ms workers=3 worker_threads=1 repeat=3 fail="" threads=2 turnover=
while [ $# -gt 0 ]; do
    case $1 in
        --width) width=$2; shift 2 ;;
        --cap) cap=$2; shift 2 ;;
        --latency) latency=$2; shift 2 ;;
        --workers) workers=$2; shift 2 ;;
        --worker-threads) worker_threads=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --fail) fail=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --turnover) turnover=1; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

benches=$PWD/benches
# The server and workers (TROUPE_BIN: another binary than the release
# build; the script cds away, so relative paths are made absolute).
. benches/nats_cluster.sh
start_server
# Each worker may hold its share of the cap and a little more.
per=$(( (cap + workers - 1) / workers + 8 ))
failing=()
[ -n "$fail" ] && failing=(--fail-sibling "worker#$fail")
start_workers "$workers" "$per" "$worker_threads" "$latency" "${failing[@]}"

# wall ms, and for a failed run the cancel window, of one run's summary.
measure() {
    python3 - "$1" "$troupe" <<'EOF'
import json, os, subprocess, sys, datetime
s = json.load(open(sys.argv[1]))
line = f"{s['wallMs']:.0f}"
if s["status"] != "ok":
    def t(e):
        return datetime.datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
    failed = None; last = None
    # The log on disk is compressed: `runs export` gives its lines.
    runs_dir = os.path.dirname(os.path.dirname(s["auditPath"]))
    lines = subprocess.run([sys.argv[2], "runs", "export", s["runId"], "--runs-dir", runs_dir],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for raw in lines:
        e = json.loads(raw)
        if e["event"] == "StageExited" and e.get("verdict") == "fail" and failed is None:
            failed = t(e)
        if e["event"] == "StageCancelled":
            last = t(e)
    window = (last - failed) * 1000 if failed and last else float("nan")
    line += f" {window:.1f}"
print(line)
EOF
}

cd "$work"
lat_ms=$(python3 -c "import re,sys; v='$latency'; m=re.fullmatch(r'(\d+)(ms|s)', v); print(int(m[1])*(1000 if m[2]=='s' else 1))")
ideal=$(( ( (width + cap - 1) / cap ) * 2 * lat_ms + 2 * lat_ms ))
printf 'fanout %s wide, cap %s, latency %s, %s workers on %s thread(s) each, coordinator on %s; ideal %s ms (ceil(N/cap) x 2 turns + plan and reduce)\n' \
    "$width" "$cap" "$latency" "$workers" "$worker_threads" "$threads" "$ideal"
own_threads=()
[ "$threads" = default ] || own_threads=(--threads "$threads")
for mode in local distributed; do
    for r in $(seq 1 "$repeat"); do
        args=(run "$stages" --ctx "width=$width" --parallel-cap "$cap" --latency "$latency" --json "${own_threads[@]}")
        [ "$mode" = distributed ] && args+=(--nats "$url")
        [ "$mode" = local ] && [ -n "$fail" ] && args+=("${failing[@]}")
        "$troupe" "${args[@]}" > "$work/summary.json" 2> "$work/run.err" || true
        read -r wall window < <(measure "$work/summary.json") || true
        sps=$(python3 -c "print(f'{$width / ($wall / 1000):.0f}')")
        ratio=$(python3 -c "print(f'{$wall / $ideal:.3f}' if $ideal else '-')")
        printf '%-12s run %s: wall %6s ms  %8s siblings/s  x ideal %s%s\n' \
            "$mode" "$r" "$wall" "$sps" "$ratio" "${window:+  cancel window ${window} ms}"
        if [ -n "$turnover" ] && [ "$mode" = distributed ]; then
            run_id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runId"])' "$work/summary.json")
            runs_dir=$(python3 -c 'import json,os,sys; print(os.path.dirname(os.path.dirname(json.load(open(sys.argv[1]))["auditPath"])))' "$work/summary.json")
            "$troupe" runs export "$run_id" --runs-dir "$runs_dir" \
                | python3 "$benches/turnover.py" --cap "$cap" --worst 5 | sed 's/^/    /' || true
        fi
    done
done
