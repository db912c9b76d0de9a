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
. benches/nats_cluster.sh
start_server -m
per=${PER:-$(( (cap + workers - 1) / workers + 8 ))}
start_workers "$workers" "$per" 1 "$latency"
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
