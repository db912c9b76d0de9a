# Sourced (from the repository root) by benches/distributed.sh and
# benches/nats_load.sh: a nats-server on loopback and `troupe worker`s
# serving stages/fanout, every process stopped and the work folder
# removed on exit. Sets troupe, server, stages, work and pids; then
# start_server sets url and server_pid (and monitor with -m).
#
# TROUPE_BIN: another binary than the release build; TROUPE_NATS_SERVER:
# the server when it is not on PATH.
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

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_server [-m]: the server, with JetStream (and its monitoring port,
# in $monitor, given -m); ready when it says so.
start_server() {
    local port extra=()
    port=$(free_port)
    if [ "${1:-}" = -m ]; then
        monitor=$(free_port)
        extra=(-m "$monitor")
    fi
    "$server" -js -a 127.0.0.1 -p "$port" "${extra[@]}" -sd "$work/js" 2> "$work/server.log" &
    server_pid=$!
    pids+=("$server_pid")
    until grep -q "Server is ready" "$work/server.log" 2>/dev/null; do sleep 0.05; done
    url=nats://127.0.0.1:$port
}

# start_workers N MAX_SIBLINGS THREADS LATENCY [worker flags...]: workers
# w1..wN; returns once each says it serves.
start_workers() {
    local n=$1 per=$2 threads=$3 latency=$4 i
    shift 4
    for i in $(seq 1 "$n"); do
        "$troupe" worker "$stages" --nats "$url" --name "w$i" --root "$work" \
            --max-siblings "$per" --threads "$threads" --latency "$latency" "$@" \
            > /dev/null 2> "$work/w$i.err" &
        pids+=($!)
    done
    for i in $(seq 1 "$n"); do
        until grep -q "serving at" "$work/w$i.err" 2>/dev/null; do sleep 0.05; done
    done
}
