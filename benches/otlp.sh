#!/usr/bin/env bash
# What --otlp costs a run: stages/fanout, 10 000 wide, cap 256, 0 ms, store
# on, with and without export to a local collector stand-in (a Python
# HTTP server that reads each protobuf post and answers 200), in
# alternating pairs. Prints each pair's wallMs (the run's own figure) and
# the medians.
#
#   [LATENCY=20ms] benches/otlp.sh [PAIRS] [WIDTH]   # default 7 pairs, 10000 wide, 0 ms
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=$PWD/target/release/troupe
stages=$PWD/stages
pairs=${1:-7}
width=${2:-10000}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 - "$port" > "$work/collector.log" 2>&1 <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("content-length", 0)); self.rfile.read(n)
        self.send_response(200); self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
sleep 0.5
cd "$work"
wall() { "$troupe" run "$stages/fanout" --ctx width="$width" --parallel-cap 256 --latency "${LATENCY:-0ms}" --json --headless "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["wallMs"])'; }
off=(); on=()
for _ in $(seq "$pairs"); do
  a=$(wall); b=$(wall --otlp "http://127.0.0.1:$port")
  off+=("$a"); on+=("$b"); echo "off $a ms  on $b ms"
done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]; on = [float(x) for x in sys.argv[2].split()]
m0, m1 = statistics.median(off), statistics.median(on)
print(f"median off {m0:.0f} ms, on {m1:.0f} ms: {100*(m1/m0-1):+.1f}%")
PY
