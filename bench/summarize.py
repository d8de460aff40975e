#!/usr/bin/env python3
"""Prints the measured targets of the benchmark suite as a Markdown table.

    bench/summarize.py RESULTS_DIR

reads the JSON files that bench/reproduce writes and prints, for 64 MiB fp32 at 4
ranks, cgx's speedup over the better of Open MPI's default and ring allreduce on each
emulated link, then the smallest speedup over all sizes of each sweep.
"""
import json
import os
import sys

TARGETS = [
    # (label, file, reducer, bits, target)
    ("1 Gbit/s", "tcp-1gbit.json", "sra", 4, 7.0),
    ("1 Gbit/s", "tcp-1gbit.json", "sra", 8, 3.6),
    ("1 Gbit/s", "tcp-1gbit.json", "sra", 2, 12.0),
    ("10 Gbit/s", "tcp-10gbit.json", "sra", 4, 6.0),
    ("unlimited loopback TCP", "tcp-unlimited.json", "sra", 4, 4.0),
    ("shared memory, cgx over comm::mpi", "shm-mpi.json", "sra", 4, 2.5),
    ("shared memory, cgx over comm::shm", "shm-shm.json", "sra", 4, 2.5),
    ("2 nodes x 2 ranks, 1 Gbit/s links", "cluster-2x2-1gbit.json", "hier", 4, 5.0),
    ("2 nodes x 2 ranks, 1 Gbit/s links", "cluster-2x2-1gbit-sra.json", "sra", 4, None),
]


def load(d, f):
    p = os.path.join(d, f)
    if not os.path.exists(p):
        return []
    with open(p) as fh:
        return json.load(fh)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    # The host's speed at both ends of the run (bench/reproduce's quant and quant-after).
    speed = []
    for f, when in (("quant-host.json", "start"), ("quant-host-after.json", "end")):
        for r in load(d, f):
            if (r.get("op"), r.get("bits"), r.get("rounding"), r.get("dtype")) == ("compress", 4, "stochastic", "float"):
                speed.append(f"{r['gbps']:.2f} GB/s at the {when}")
    if speed:
        print("Host speed, one core's 4-bit stochastic compress (bench/quant_bench): " + ", ".join(speed) + ".")
        print()
    print("| link | reducer | bits | cgx (ms) | MPI_Allreduce (ms, best of default/ring) | speedup | target |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, f, red, bits, target in TARGETS:
        rows = [r for r in load(d, f) if r["bytes"] == 64 << 20 and r["bits"] == bits and r["reducer"] == red]
        if not rows:
            print(f"| {label} | {red} | {bits} | not measured | | | {target or ''} |")
            continue
        r = rows[0]
        mark = "" if target is None else (" (met)" if r["speedup"] >= target else " (**missed**)")
        print(f"| {label} | {red} | {bits} | {r['time_s'] * 1e3:.1f} | {r['mpi_time_s'] * 1e3:.1f} "
              f"({r['baseline']}) | {r['speedup']:.2f}x{mark} | {'>= %gx' % target if target else ''} |")
    print()
    print("| sweep | sizes | bits | smallest speedup (at size) |")
    print("|---|---|---|---:|")
    for f in sorted(os.listdir(d)):
        if not f.endswith(".json"):
            continue
        # allreduce_bench's sweep records only (the DDP and error-bounded files differ)
        data = load(d, f)
        recs = [r for r in (data if isinstance(data, list) else []) if isinstance(r, dict)
                and {"speedup", "bits", "bytes"} <= r.keys() and r["bits"] not in (32, 64)]
        if not recs:
            continue
        sizes = sorted({r["bytes"] for r in recs})
        if f.endswith("-compressed.json"):
            f = f[:-5] + " (threshold disabled).json"
        for bits in sorted({r["bits"] for r in recs}):
            rs = [r for r in recs if r["bits"] == bits]
            worst = min(rs, key=lambda r: r["speedup"])
            print(f"| {f[:-5]} | {sizes[0]}..{sizes[-1]} B | {bits} | {worst['speedup']:.2f}x ({worst['bytes']} B) |")


if __name__ == "__main__":
    main()
