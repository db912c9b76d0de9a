#!/usr/bin/env bash
# What a distributed run asks of nats-server, per sibling: messages in and
# out (the server's /varz before and after) and the server's CPU (/proc),
# with the run's wall. One nats-server on loopback with monitoring, W
# workers, one warm-up run of 200, then the measured run.
#
#   benches/nats_load.sh [WIDTH] [CAP] [LATENCY] [WORKERS]
#
# TROUPE_BIN: the binary (default target/release/troupe); PER: each
# worker's --max-siblings (default its share of the cap and 8 more; below
# the share, the run is saturated: tasks wait in the queue for slots).
# Needs nats-server on PATH or in $TROUPE_NATS_SERVER, curl and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
width=${1:-10000} cap=${2:-256} latency=${3:-0ms} workers=${4:-3}
troupe=$(realpath -m "${TROUPE_BIN:-target/release/troupe}")
server=${TROUPE_NATS_SERVER:-$(command -v nats-server || true)}
[ -x "$troupe" ] || { echo "build first: cargo build --release" >&2; exit 2; }
[ -n "$server" ] || { echo "nats-server not found (PATH or TROUPE_NATS_SERVER)" >&2; exit 2; }
stages=$PWD/stages/fanout
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port) monitor=$(free_port)
"$server" -js -a 127.0.0.1 -p "$port" -m "$monitor" -sd "$work/js" 2> "$work/server.log" &
server_pid=$!
pids+=("$server_pid")
until grep -q "Server is ready" "$work/server.log" 2>/dev/null; do sleep 0.05; done
url=nats://127.0.0.1:$port
per=${PER:-$(( (cap + workers - 1) / workers + 8 ))}
for i in $(seq 1 "$workers"); do
    "$troupe" worker "$stages" --nats "$url" --name "w$i" --root "$work" \
        --max-siblings "$per" --threads 1 --latency "$latency" > /dev/null 2> "$work/w$i.err" &
    pids+=($!)
done
for i in $(seq 1 "$workers"); do
    until grep -q "serving at" "$work/w$i.err" 2>/dev/null; do sleep 0.05; done
done
cd "$work"
run() {
    "$troupe" run "$stages" --ctx "width=$1" --parallel-cap "$cap" --latency "$latency" \
        --json --threads 2 --nats "$url" > summary.json 2> run.err
}
run 200
cpu() { awk '{print $14 + $15}' "/proc/$server_pid/stat"; }
before=$(curl -s "127.0.0.1:$monitor/varz") ticks_before=$(cpu)
run "$width"
after=$(curl -s "127.0.0.1:$monitor/varz") ticks_after=$(cpu)
python3 - "$before" "$after" "$ticks_before" "$ticks_after" "$width" <<'PY'
import json, os, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t0, t1, width = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s = json.load(open("summary.json"))
cpu_us = (t1 - t0) / os.sysconf("SC_CLK_TCK") * 1e6 / width
print(f"status {s['status']}  wall {s['wallMs']:.0f} ms  {width / (s['wallMs'] / 1000):.0f} siblings/s  "
      f"server: {(b['in_msgs'] - a['in_msgs']) / width:.2f} msgs in, "
      f"{(b['out_msgs'] - a['out_msgs']) / width:.2f} out, {cpu_us:.0f} us CPU a sibling")
PY
