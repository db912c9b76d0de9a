# Sourced by device.sh, device_ab.sh and device_profile.sh.
#
#     describe_machine FILE
#
# writes the machine's cores, processor, memory and kernel to FILE.
describe_machine() {
    {
        echo "cores: $(nproc)"
        grep -m1 'model name' /proc/cpuinfo
        # Whether the cores are hardware threads of fewer physical ones:
        # the thirteenth round could not tell why 12 and 16 threads were
        # no faster than 9.
        lscpu 2>/dev/null | grep -E '^(Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L3 cache):' 
        grep MemTotal /proc/meminfo
        uname -r
    } >"$1" 2>&1
}

#     fanout_args WIDTH THREADS RUNS
#
# sets FANOUT to the `troupe` arguments of the profiled run: stages/fanout
# WIDTH wide, cap 256, 0 ms, on THREADS threads, its log in RUNS.
fanout_args() {
    FANOUT=(run stages/fanout --ctx "width=$1" --parallel-cap 256
        --latency 0ms --threads "$2" --runs-dir "$3")
}

#     syscall_events PERF EVENTS
#
# prints EVENTS (perf's software counters, comma-separated) followed by
# the tracepoints that count system calls by kind, where PERF lists them:
# they need tracefs, mounted here if it is not.
syscall_events() {
    local perf=$1 events=$2
    [ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
    if "$perf" list 2>/dev/null | grep -q 'syscalls:sys_enter_futex '; then
        for call in futex write read epoll_wait sched_yield pwrite64 madvise munmap mmap; do
            events="$events,syscalls:sys_enter_$call"
        done
        events="$events,raw_syscalls:sys_enter"
    fi
    echo "$events"
}
