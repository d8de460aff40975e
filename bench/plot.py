#!/usr/bin/env python3
"""Turns allreduce_bench JSON results into PNG plots.

    bench/plot.py OUT_PREFIX RESULTS.json [MORE.json ...] [--bits B]

writes OUT_PREFIX-speedup.png (speedup over MPI_Allreduce against message size, one
line per link and bit width) and OUT_PREFIX-busbw.png (bus bandwidth of cgx, and of
MPI_Allreduce as a dashed line per link). --bits B keeps only the rows of that bit width. Needs python3-matplotlib (Debian).
"""
import json
import sys
from collections import defaultdict

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py: needs matplotlib (apt-get install python3-matplotlib)")


def size_label(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div:
            return f"{b / div:g}{unit}"
    return f"{b:g}"


def load(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            recs.extend(json.load(f))
    if not recs:
        sys.exit("plot.py: no records in " + " ".join(paths))
    return recs


def series_name(r, many_links, many_reducers):
    bits = "fp32 (no compression)" if r["bits"] in (32, 64) else f"{r['bits']}-bit"
    parts = []
    if many_links:
        parts.append(r["link"])
    if many_reducers:
        parts.append(r["reducer"])
    parts.append(bits)
    return ", ".join(parts)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    args = sys.argv[2:]
    keep_bits = None
    if "--bits" in args:
        i = args.index("--bits")
        keep_bits = int(args[i + 1])
        del args[i:i + 2]
    prefix, paths = sys.argv[1], args
    recs = load(paths)
    if keep_bits is not None:
        recs = [r for r in recs if r["bits"] == keep_bits]
    links = sorted({r["link"] for r in recs})
    reducers = sorted({r["reducer"] for r in recs})
    ranks = sorted({r["ranks"] for r in recs})
    series = defaultdict(list)
    baseline = defaultdict(dict)
    for r in recs:
        series[series_name(r, len(links) > 1, len(reducers) > 1)].append(r)
        baseline[r["link"]][r["bytes"]] = r["busbw_gbps"] * r["time_s"] / r["mpi_time_s"]
    title = f"cgx vs MPI_Allreduce, {'/'.join(map(str, ranks))} ranks, fp32, bucket {recs[0]['bucket']}"
    if len(links) == 1:
        title += f", link {links[0]}"

    def finish(ax, ylabel, path):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size per rank (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        sizes = sorted({r["bytes"] for r in recs})
        step = max(1, len(sizes) // 8)
        ax.set_xticks(sizes[::step])
        ax.set_xticklabels([size_label(s) for s in sizes[::step]])
        ax.figure.tight_layout()
        ax.figure.savefig(path, dpi=110)
        print("plot.py: wrote", path)

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in sorted(series, key=lambda n: (n.split(",")[0], -len(n))):
        pts = sorted(series[name], key=lambda r: r["bytes"])
        ax.plot([r["bytes"] for r in pts], [r["speedup"] for r in pts], marker="o", label=name)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(0.95, color="gray", linewidth=0.8, linestyle=":", label="0.95x")
    ax.set_yscale("log", base=2)
    finish(ax, "speedup over MPI_Allreduce (same run)", prefix + "-speedup.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in sorted(series):
        pts = sorted(series[name], key=lambda r: r["bytes"])
        ax.plot([r["bytes"] for r in pts], [r["busbw_gbps"] for r in pts], marker="o", label=name)
    for link in links:
        pts = sorted(baseline[link].items())
        ax.plot([b for b, _ in pts], [v for _, v in pts], color="black", linestyle="--",
                label=f"MPI_Allreduce{', ' + link if len(links) > 1 else ''}")
    ax.set_yscale("log")
    finish(ax, "busbw (GB/s, on the uncompressed size)", prefix + "-busbw.png")


if __name__ == "__main__":
    main()
