#!/usr/bin/env bash
# Issue 23's big-machine measurements in one go: build the release binary
# on the development machine, carry it and stages/ to the big one, run
#
#     benches/device.sh target/release/troupe "$OUT"
#
# and bring the files back into BENCHMARKS.md with the machine's
# description. About 3-5 minutes on 16 cores; every step writes its own
# file, so a step cut short still leaves the others.
#
#   machine.txt       cores, memory, kernel
#   threads.json      troupe bench, 100 000 wide, cap 256, 0 ms, store on,
#                     --threads 1,2,4,8,16 (wall, x floor, peak RSS), one
#                     JSON document per thread count
#   threads_time.txt  user and system CPU of each thread count's bench
#                     (troupe's runs and the floor's together)
#   store.json        the same at --threads 2 and 16, store on and off
#   failfast.json     10 000 in flight, worker#9999 fails, 50 ms turns,
#                     --threads 1,2,4,16 (ms to the last StageCancelled)
#   thread_cpu.txt    CPU seconds per thread name, 200 000 wide,
#                     --threads 2, 9 (the default there) and 16, with
#                     each name's busiest half second. A one-per-run
#                     thread near 100% is not by itself the bound: the
#                     store's writer read 94% in the thirteenth round and
#                     took bigger batches when busier (BENCHMARKS.md);
#                     residence.py's split of a slot's cycle says more
#   million.json      1 000 000 wide, --threads 16, against the floor
#                     (wall, peak RSS), and million_audit.txt its log size
#   syscalls_T.csv    perf stat of one 100 000-wide run at --threads 2 and
#                     16: system calls by kind (futex, eventfd writes,
#                     epoll_wait, sched_yield, pwrite64), context switches,
#                     migrations, page faults (where the system time goes)
#   distributed_*.txt with a nats-server binary at $NATS_SERVER or
#                     target/nats-server (carry it: `cp "$(command -v
#                     nats-server)" target/`): the coordinator at 0 ms over
#                     three workers (siblings/s), and eight workers, cap
#                     1 024, 50 ms turns (x the ideal, and how long its
#                     slots stood empty between siblings: turnover.py),
#                     both with the binary given. A stripped binary keeps
#                     both under the 64 MiB a carry allows.
#   bus.txt           with the criterion bus_throughput executable at
#                     $BUS_BENCH (`cargo bench --bench bus_throughput
#                     --no-run` prints its path; carry it): events/s from
#                     1, 2, 8 and 16 publishing threads into one bus, the
#                     serial section the parcels of the eleventh round
#                     cut (step `bus`, not in the default STEPS)
#   steps.txt         seconds since the start after each step
#
# The device tool brings back 8 files at most: run it into a folder of its
# own and bring back one tarball of it, e.g.
#
#     timeout -s KILL 420 benches/device.sh dev/troupe /tmp/r
#     tar czf "$OUT/device.tgz" -C /tmp/r .
#
# SCALE=100 divides every width by 100: a dry run of the script anywhere.
# STEPS (default "threads store failfast cpu perf million distributed")
# picks the steps, CPU_THREADS (default "2 9 16") thread_cpu's counts and
# DIST (default "0ms 0ms_4t 8w 8w_2t") the distributed cases, and
# DIST_THREADS (default 2; "default" for troupe's own) the coordinator's
# --threads: a short call when device time is scarce.
# THREADS (default "1 2 4 8 16") is the thread counts of threads.json;
# BIG_THREADS (default 16) the one of the million-wide run, and
# MILLION_REPEAT (default 1) how many times it runs.
set -u
bin=${1:-target/release/troupe}
out=${2:-${OUT:-/tmp/troupe-device}}
# A binary that did not travel (a folder git ignores must be named in the
# call's carry) or was unpacked empty fails here, at once, instead of
# every step failing and the distributed step waiting on a server that
# never starts (the twenty-fifth round lost a call so).
if ! "$bin" --version >/dev/null 2>&1; then
    echo "$bin does not run: was it carried and unpacked?" >&2
    exit 2
fi
mkdir -p "$out"
scale=${SCALE:-1}
w100k=$((100000 / scale)) w200k=$((200000 / scale)) w1m=$((1000000 / scale))
w10k=$((10000 / scale))
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
# step NAME: whether STEPS asks for that step.
step() { [[ " ${STEPS:-threads store failfast cpu perf million distributed} " == *" $1 "* ]]; }

. benches/perf_events.sh
describe_machine "$out/machine.txt"

time_of() { # time_of FILE CMD...: the command's user/sys/wall/RSS in FILE
    local file=$1
    shift
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f 'wall %e s user %U s sys %S s maxrss %M KiB' -o "$file" "$@"
    else
        local t0=$SECONDS
        "$@"
        echo "wall $((SECONDS - t0)) s (no /usr/bin/time)" >"$file"
    fi
}

# One bench per thread count, so that each one's user and system CPU
# (bash's `times`, which counts the waited-for children) is its own.
if step threads; then
    : >"$out/threads.json"
    : >"$out/threads_time.txt"
    for t in ${THREADS:-1 2 4 8 16}; do
        (
            "$bin" bench stages/fanout --width "$w100k" --cap 256 --latency 0ms \
                --threads "$t" --repeat 3 --runs-dir "$runs" --json \
                >>"$out/threads.json" 2>>"$out/threads.err"
            # `times` forks nothing only when not piped or substituted.
            times >"$runs/times"
            echo "threads $t: children's user, system $(tail -1 "$runs/times")" \
                >>"$out/threads_time.txt"
        )
    done
fi

# What the store costs at 2 and 16 threads.
step store && "$bin" bench stages/fanout --width "$w100k" --cap 256 --latency 0ms \
    --threads 2,16 --store on,off --repeat 3 --runs-dir "$runs" --json \
    >"$out/store.json" 2>>"$out/threads.err"

echo "$SECONDS s: threads, store" >>"$out/steps.txt"

if step bus; then
    if [ -x "${BUS_BENCH:-}" ]; then
        "$BUS_BENCH" --bench 'bus_throughput/publishers' --noplot >"$out/bus.txt" 2>&1
    else
        echo "no BUS_BENCH executable: step skipped" >"$out/bus.txt"
    fi
    echo "$SECONDS s: bus" >>"$out/steps.txt"
fi

step failfast && "$bin" bench stages/fanout --width "$w10k" --cap "$w10k" --latency 50ms \
    --fail-sibling "worker#$((w10k - 1))" --threads 1,2,4,16 --repeat 3 \
    --runs-dir "$runs" --json >"$out/failfast.json" 2>"$out/failfast.err"

echo "$SECONDS s: fail-fast" >>"$out/steps.txt"

if ! step cpu; then
    : # not asked for
elif command -v python3 >/dev/null; then
    for t in ${CPU_THREADS:-2 9 16}; do
        echo "--threads $t"
        python3 benches/thread_cpu.py "$bin" run stages/fanout --ctx "width=$w200k" \
            --parallel-cap 256 --latency 0ms --threads "$t" --runs-dir "$runs" 2>&1
    done >"$out/thread_cpu.txt"
else
    echo "no python3 here" >"$out/thread_cpu.txt"
fi

# Tracepoints need tracefs (perf_events.sh mounts it); the software
# counters work without it.
if ! step perf; then
    : # not asked for
elif command -v perf >/dev/null; then
    events=$(syscall_events perf context-switches,cpu-migrations,page-faults)
    for t in 2 16; do
        fanout_args "$w100k" "$t" "$runs"
        perf stat -x, -e "$events" -o "$out/syscalls_$t.csv" "$bin" "${FANOUT[@]}" >/dev/null 2>&1
    done
else
    echo "no perf here" >"$out/syscalls_2.csv"
fi

echo "$SECONDS s: thread CPU, system calls" >>"$out/steps.txt"

rm -rf "${runs:?}"/*
step million && "$bin" bench stages/fanout --width "$w1m" --cap 256 --latency 0ms \
    --threads "${BIG_THREADS:-16}" --repeat "${MILLION_REPEAT:-1}" --keep-runs --runs-dir "$runs" --json \
    >"$out/million.json" 2>"$out/million.err"
# `--keep-runs` says on stderr where it kept the logs.
kept=$(sed -n 's/^audit logs kept in //p' "$out/million.err" 2>/dev/null | tail -1)
if [ -n "$kept" ]; then
    find "$kept" -name 'audit.*' -printf '%s bytes %p\n' >"$out/million_audit.txt"
    rm -rf "$kept"
fi

echo "$SECONDS s: a million" >>"$out/steps.txt"

nats=${NATS_SERVER:-target/nats-server}
# distributed CASE ARGS...: benches/distributed.sh, 10 000 wide, three
# runs, with ARGS into distributed_CASE.txt, when DIST asks for CASE.
distributed() {
    local case=$1
    shift
    [[ " ${DIST:-0ms 0ms_4t 8w 8w_2t} " == *" $case "* ]] || return 0
    TROUPE_BIN=$bin TROUPE_NATS_SERVER=$nats benches/distributed.sh \
        --threads "${DIST_THREADS:-2}" --width "$w10k" --repeat 3 "$@" \
        >"$out/distributed_$case.txt" 2>&1
}
if ! step distributed; then
    : # not asked for
elif [ -x "$nats" ] && "$nats" --version >/dev/null 2>&1; then
    distributed 0ms --cap 256 --latency 0ms
    # The same with workers that have cores to spare: whether three
    # one-thread workers, not the coordinator, set the pace above.
    distributed 0ms_4t --cap 256 --latency 0ms --worker-threads 4
    distributed 8w --cap 1024 --latency 50ms --workers 8 --turnover
    distributed 8w_2t --cap 1024 --latency 50ms --workers 8 --worker-threads 2
else
    echo "no nats-server at $nats" >"$out/distributed_0ms.txt"
fi
echo "$SECONDS s: distributed" >>"$out/steps.txt"
