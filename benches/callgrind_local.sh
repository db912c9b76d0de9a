#!/usr/bin/env bash
# Instructions a local fan-out sibling costs, per thread: `troupe run
# stages/fanout` under callgrind --separate-threads, cap 256, 0 ms,
# --threads 2, at WIDTH and at WIDTH/2; the difference over WIDTH/2
# siblings leaves out what a run costs whatever its width. Repeatable on a
# noisy machine, unlike a wall time. How it was used: BENCHMARKS.md, "Every
# core, twenty-first round".
#
#   benches/callgrind_local.sh [BIN] [WIDTH] [OUTDIR]
#
# BIN defaults to target/release/troupe, WIDTH to 10000; relative paths
# are the caller's. Needs valgrind. Thread numbers are the order threads
# started in: the two arbiters are the last two. The per-thread lines
# match the two runs' threads by number, and the store writer starts its
# helpers while the main thread starts the audit writer's, so threads
# 03-06 may be numbered differently in the two runs (then those lines are
# off; the process's total is not). callgrind_annotate
# OUTDIR/WIDTH/callgrind.PID-NN names a thread's functions. A build with
# line tables attributes lines:
#   CARGO_PROFILE_RELEASE_DEBUG=line-tables-only cargo build --release
set -euo pipefail
bin=$(realpath "${1:-$(dirname "$0")/../target/release/troupe}")
width=${2:-10000}
out=$(realpath -m "${3:-$(mktemp -d)}")
cd "$(dirname "$0")/.."
stages=$PWD/stages/fanout
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

one() {
    local w=$1 dir=$out/$1
    mkdir -p "$dir"
    if ! valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/callgrind.%p" \
        "$bin" run "$stages" --ctx "width=$w" --parallel-cap 256 --latency 0ms --threads 2 \
        --runs-dir "$work/runs-$w" > "$dir/out.txt" 2> "$dir/err.txt"; then
        echo "the run at width $w failed; its stderr ends:" >&2
        tail -n 20 "$dir/err.txt" >&2
        exit 1
    fi
}

one "$width"
one $((width / 2))
python3 benches/callgrind_sum.py "$out" "$width" callgrind
echo "callgrind files: $out"
