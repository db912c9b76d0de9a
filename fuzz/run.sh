#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each, one after the
# other, at the lowest CPU priority. Builds first; seeds each corpus from the
# bundled pipelines, the test fixtures and fuzz/seeds. A crash leaves its
# input in fuzz/artifacts/TARGET/ and makes the script exit 1 at the end.
#
#   fuzz/run.sh [SECONDS] [TARGET...]      # default: 60 s, all targets
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")"
root=..

seconds=${1:-60}
shift || true
all=(stage_file pipeline_yaml template cel_expr extract_json sse_decoder openai_reply answers_file script_file control_request audit_log relayed_event relay_records report_batch store_pack)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi

# Builds share the machine: one cargo build at a time (a lock other
# builds also take, when flock exists), two jobs.
lock=${TROUPE_CARGO_LOCK:-/tmp/troupe-cargo.lock}
build=(cargo +nightly fuzz build --sanitizer none)
if command -v flock >/dev/null; then build=(flock "$lock" "${build[@]}"); fi
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} "${build[@]}"
bin=target/x86_64-unknown-linux-gnu/release

seed() {
    local target=$1 dir=corpus/$1
    mkdir -p "$dir" "artifacts/$target"
    if [ -d "seeds/$target" ]; then cp -n seeds/"$target"/* "$dir"/; fi
    case $target in
        stage_file)
            for f in "$root"/stages/*/*.md "$root"/tests/fixtures/*/*.md; do
                cp -n "$f" "$dir/$(basename "$(dirname "$f")")-$(basename "$f")"
            done ;;
        pipeline_yaml)
            # The first byte picks the folder the stage files come from
            # (the order of FOLDERS in fuzz_targets/pipeline_yaml.rs).
            local i=0
            for p in stages/code-review stages/fanout stages/ralph stages/triage tests/fixtures/three-errors; do
                [ -f "$dir/seed-$i" ] || { printf "\\x$(printf %02x $i)"; cat "$root/$p/pipeline.yaml"; } > "$dir/seed-$i"
                i=$((i + 1))
            done ;;
        script_file)
            for f in "$root"/stages/*/script.yaml; do
                cp -n "$f" "$dir/$(basename "$(dirname "$f")").yaml"
            done ;;
        cel_expr)
            # Every quoted expression of the bundled pipelines.
            grep -ho '"[^"]*"' "$root"/stages/*/pipeline.yaml | tr -d '"' | sort -u |
                while read -r e; do
                    printf '%s' "$e" > "$dir/stage-expr-$(printf '%s' "$e" | cksum | cut -d' ' -f1)"
                done ;;
    esac
}

failed=()
mkdir -p logs
for t in "${targets[@]}"; do
    seed "$t"
    echo "== $t: ${seconds}s (log: fuzz/logs/$t.log)"
    status=0
    nice -n 19 "$bin/$t" "corpus/$t" \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"logs/$t.log" 2>&1 || status=$?
    # The last coverage line, then the crash report if there is one.
    grep -E '^#[0-9]+[[:space:]]' "logs/$t.log" | tail -n 1
    if [ "$status" -ne 0 ]; then
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "logs/$t.log" || true
        failed+=("$t")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]} (inputs in fuzz/artifacts/, logs in fuzz/logs/)"
    exit 1
fi
echo "all clean: ${targets[*]}"
