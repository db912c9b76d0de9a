#!/usr/bin/env python3
"""Instructions a sibling, per process and per thread, from two callgrind
runs of one command at WIDTH and WIDTH/2 (callgrind --separate-threads):
the difference over WIDTH/2 siblings leaves out what a run costs whatever
its width. Used by callgrind_local.sh and callgrind_distributed.sh.

    callgrind_sum.py OUTDIR WIDTH PREFIX [PREFIX...]

reads OUTDIR/WIDTH/PREFIX.PID-NN and OUTDIR/WIDTH/2/PREFIX.PID-NN for each
PREFIX (one process each) and matches threads by their number NN.
"""
import glob
import os
import re
import sys


def threads(out, width, prefix):
    found = {}
    for path in glob.glob(os.path.join(out, str(width), prefix + ".*-*")):
        with open(path) as f:
            for line in f:
                m = re.match(r"(summary|totals): (\d+)", line)
                if m:
                    found[path.rsplit("-", 1)[1]] = int(m.group(2))
                    break
    return found


def main():
    out, width, prefixes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    half = width // 2
    for prefix in prefixes:
        big, small = threads(out, width, prefix), threads(out, half, prefix)
        total = (sum(big.values()) - sum(small.values())) / (width - half)
        print(f"{prefix}: {total:,.0f} instructions a sibling")
        for t in sorted(big):
            if t in small:
                per = (big[t] - small[t]) / (width - half)
                if abs(per) >= 300:
                    print(f"  thread {t}: {per:,.0f}")


main()
