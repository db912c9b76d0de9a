#!/usr/bin/env bash
# Instructions a distributed sibling costs, per process and per thread:
# one worker (one thread) and the coordinator (--threads 2) each under
# callgrind --separate-threads, nats-server on loopback, 0 ms, cap 256, run
# at WIDTH and at WIDTH/2; the difference over WIDTH/2 siblings leaves out
# what a run costs whatever its width. Repeatable on a noisy machine, unlike
# a wall time. How it was used: BENCHMARKS.md, "Every core, eighteenth
# round".
#
#   benches/callgrind_distributed.sh [BIN] [WIDTH] [OUTDIR]
#
# BIN defaults to target/release/troupe, WIDTH to 4000. Needs valgrind and
# nats-server on PATH or in $TROUPE_NATS_SERVER. Thread numbers differ
# from run to run: match threads by their top function
# (callgrind_annotate OUTDIR/WIDTH/worker.PID-NN).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/troupe}")
width=${2:-4000}
out=$(realpath -m "${3:-$(mktemp -d)}")
server=${TROUPE_NATS_SERVER:-$(command -v nats-server)}
stages=$PWD/stages/fanout

one() {
    local w=$1 dir=$out/$1 work
    work=$(mktemp -d)
    mkdir -p "$dir"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$server" -js -a 127.0.0.1 -p "$port" -sd "$work/js" 2> "$work/server.log" &
    local spid=$!
    until grep -q "Server is ready" "$work/server.log" 2>/dev/null; do sleep 0.05; done
    local url=nats://127.0.0.1:$port
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/worker.%p" \
        "$bin" worker "$stages" --nats "$url" --name w1 --root "$work" --max-siblings 264 \
        --threads 1 --latency 0ms > /dev/null 2> "$work/w1.err" &
    local wpid=$!
    until grep -q "serving at" "$work/w1.err" 2>/dev/null; do sleep 0.2; done
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/coord.%p" \
        "$bin" run "$stages" --ctx "width=$w" --parallel-cap 256 --latency 0ms --threads 2 \
        --nats "$url" --runs-dir "$work/runs" --json > "$dir/summary.json" 2> "$dir/run.err"
    kill -TERM "$wpid"; wait "$wpid" || true
    kill "$spid"; wait "$spid" 2>/dev/null || true
    rm -rf "$work"
}

one "$width"
one $((width / 2))
python3 benches/callgrind_sum.py "$out" "$width" worker coord
echo "callgrind files: $out"
