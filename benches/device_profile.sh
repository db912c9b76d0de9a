#!/usr/bin/env bash
# Why the big machine stops scaling: the follow-up to device.sh, in one go.
#
#     benches/device_profile.sh BIN OUT_DIR
#
# with perf on PATH (or PERF=...) where there is one. BIN is best a build
# with frame pointers and symbols, so the call graphs mean something:
#
#     CARGO_TARGET_DIR=target-fp RUSTFLAGS="-C force-frame-pointers=yes" \
#         cargo build --release --bin troupe
#
#   residence.txt   benches/residence.py of a 50 000-wide run (cap 256,
#                   0 ms) at --threads 2, 4, 8 and 16: how much of a
#                   slot's cycle the sibling spends executing, waiting for
#                   the store, and between executions (report, spawn,
#                   start handshake)
#   perf_T.txt      perf's flat profile (by thread name, object, symbol)
#                   of a 100 000-wide run at --threads T (2, 9, 16), and
#                   perf_T.data for reading its call graphs elsewhere
#   perf_T_exe.txt  the same for the scheduler's thread alone (the main
#                   thread: `exe` after the sealing re-exec, `troupe`
#                   where the environment needed no sealing), with call
#                   chains: at 9 threads on 16 cores it ran at 96% of a
#                   core in the run's middle (twenty-fifth round), the
#                   serial part the last two targets wait on
#   stat_T.csv      perf stat of the same run: system calls by kind,
#                   context switches, migrations
#   steps.txt       seconds since the start after each step
#
# SCALE=100 divides every width by 100: a dry run anywhere.
# RESIDENCE_THREADS and PERF_THREADS choose other thread counts.
set -u
bin=$(realpath -m "${1:?binary}")
out=$(realpath -m "${2:?output folder}")
if ! "$bin" --version >/dev/null 2>&1; then
    echo "$bin does not run: was it carried and unpacked?" >&2
    exit 2
fi
mkdir -p "$out"
scale=${SCALE:-1}
w50k=$((50000 / scale)) w100k=$((100000 / scale))
perf=${PERF:-perf}
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT

run() { # run THREADS WIDTH: one fan-out, 0 ms, cap 256
    "$bin" run stages/fanout --ctx "width=$2" --parallel-cap 256 --latency 0ms \
        --threads "$1" --runs-dir "$runs" --store "$runs/troupe.db"
}

for t in ${RESIDENCE_THREADS:-2 4 8 16}; do
    rm -rf "${runs:?}"/*
    echo "--threads $t" >>"$out/residence.txt"
    run "$t" "$w50k" >/dev/null 2>>"$out/residence.txt"
    id=$(ls "$runs" | grep -v troupe.db | head -1)
    "$bin" runs export "$id" --runs-dir "$runs" --store "$runs/troupe.db" \
        | python3 benches/residence.py --cap 256 >>"$out/residence.txt" 2>&1
done
echo "$SECONDS s: residence" >>"$out/steps.txt"

if "$perf" stat -e task-clock -o /dev/null true 2>/dev/null; then
    . benches/perf_events.sh
    events=$(syscall_events "$perf" task-clock,context-switches,cpu-migrations,page-faults)
    for t in ${PERF_THREADS:-2 9 16}; do
        rm -rf "${runs:?}"/*
        fanout_args "$w100k" "$t" "$runs"
        "$perf" record -F 999 -g -o "$out/perf_$t.data" -- \
            "$bin" "${FANOUT[@]}" >/dev/null 2>"$out/perf_$t.err"
        "$perf" report -i "$out/perf_$t.data" --stdio --no-children \
            --sort comm,dso,sym --percent-limit 0.2 -g none \
            >"$out/perf_$t.txt" 2>>"$out/perf_$t.err"
        "$perf" report -i "$out/perf_$t.data" --stdio --no-children --comms exe,troupe \
            --sort sym --percent-limit 0.5 -g caller,0.5,callee --max-stack 12 \
            >"$out/perf_${t}_exe.txt" 2>>"$out/perf_$t.err"
        rm -rf "${runs:?}"/*
        "$perf" stat -x, -e "$events" -o "$out/stat_$t.csv" -- \
            "$bin" "${FANOUT[@]}" >/dev/null 2>&1
    done
else
    echo "no working perf ($perf)" >"$out/perf_2.txt"
fi
echo "$SECONDS s: perf" >>"$out/steps.txt"
