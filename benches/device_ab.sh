#!/usr/bin/env bash
# Builds against each other on the big machine, in one call: the cells a
# change should move, each one run for every build in turn (the base
# first), so all of them see the same machine.
#
#     benches/device_ab.sh OUT_DIR BASE_BIN NEW_BIN [NEWER_BIN...]
#
#   machine.txt        cores, memory, kernel
#   ab_threads.json    troupe bench, 100 000 wide, cap 256, 0 ms, store
#                      on, --threads $AB_THREADS (default "1 9 16"),
#                      --repeat 3: one line per build and thread count,
#                      {"bin": the binary's name, "bench": the bench's JSON}
#   ab_failfast.json   10 000 in flight, the last sibling fails, 50 ms
#                      turns, --threads 1,2,4,16
#   ab_residence.txt   benches/residence.py of a 50 000-wide run at
#                      --threads $RES_THREADS: where a slot's cycle goes
#   steps.txt          seconds since the start after each step
#
# SCALE=100 divides every width by 100: a dry run anywhere.
# RES_THREADS (default "9 16"): the thread counts of ab_residence.txt.
set -u
out=$(realpath -m "${1:?output folder}")
shift
[ $# -ge 2 ] || { echo "two builds at least" >&2; exit 2; }
bins=()
for b in "$@"; do
    bins+=("$(realpath -m "$b")")
    "$b" --version >/dev/null 2>&1 || { echo "$b does not run: was it carried and unpacked?" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
mkdir -p "$out"
# Each file starts empty: a second call into the same folder (a warm
# machine keeps its /tmp) must not carry the first one's lines.
for f in ab_threads.json ab_failfast.json ab_residence.txt ab.err steps.txt; do
    : >"$out/$f"
done
scale=${SCALE:-1}
w100k=$((100000 / scale)) w50k=$((50000 / scale)) w10k=$((10000 / scale))
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT

. benches/perf_events.sh
describe_machine "$out/machine.txt"

# bench --json | tagged BIN: the bench's document on one line, with the
# build it came from.
tagged() {
    python3 -c 'import json, sys
print(json.dumps({"bin": sys.argv[1], "bench": json.load(sys.stdin)}))' "$1"
}

for t in ${AB_THREADS:-1 9 16}; do
    for bin in "${bins[@]}"; do
        "$bin" bench stages/fanout --width "$w100k" --cap 256 --latency 0ms \
            --threads "$t" --repeat 3 --runs-dir "$runs" --json 2>>"$out/ab.err" \
            | tagged "$(basename "$bin")" >>"$out/ab_threads.json"
    done
done
echo "$SECONDS s: threads" >>"$out/steps.txt"

for bin in "${bins[@]}"; do
    "$bin" bench stages/fanout --width "$w10k" --cap "$w10k" --latency 50ms \
        --fail-sibling "worker#$((w10k - 1))" --threads 1,2,4,16 --repeat 3 \
        --runs-dir "$runs" --json 2>>"$out/ab.err" \
        | tagged "$(basename "$bin")" >>"$out/ab_failfast.json"
done
echo "$SECONDS s: fail-fast" >>"$out/steps.txt"

for t in ${RES_THREADS:-9 16}; do
    for bin in "${bins[@]}"; do
        rm -rf "${runs:?}"/*
        echo "$(basename "$bin") --threads $t" >>"$out/ab_residence.txt"
        "$bin" run stages/fanout --ctx "width=$w50k" --parallel-cap 256 --latency 0ms \
            --threads "$t" --runs-dir "$runs" --store "$runs/troupe.db" \
            >/dev/null 2>>"$out/ab.err"
        id=$(ls "$runs" | grep -v troupe.db | head -1)
        "$bin" runs export "$id" --runs-dir "$runs" --store "$runs/troupe.db" \
            | python3 benches/residence.py --cap 256 >>"$out/ab_residence.txt" 2>&1
    done
done
echo "$SECONDS s: residence" >>"$out/steps.txt"
