#!/usr/bin/env python3
"""Summarizes bench/auto-sweep: the measured choice (auto) against the faster of the two
fixed paths (the compressed schedule, native_below 0; MPI_Allreduce, def), per size.

    bench/auto_sweep.py OUTDIR

reads OUTDIR/<link>-np<N>-<load>.json (allreduce_bench --native-below 0,auto), writes
OUTDIR/summary.md (one table per configuration: times in microseconds, auto/best and
auto/def, the path auto took) and, where matplotlib is installed, OUTDIR/auto-vs-fixed.png
(every time over MPI_Allreduce's, against the size). Prints the summary's worst ratios.
auto/best is the acceptance figure: at most 1.05 at every size.
"""
import glob
import json
import os
import sys


def size_label(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div:
            return f"{b / div:g}{unit}"
    return f"{b:g}"


def load(outdir):
    configs = {}
    for path in sorted(glob.glob(os.path.join(outdir, "*.json"))):
        name = os.path.basename(path)[:-5]
        try:
            with open(path) as f:
                rows = json.load(f)
        except ValueError:
            print(f"auto_sweep.py: {path} is incomplete (a run still going, or cut short): skipped")
            continue
        by_size = {}
        for r in rows:
            if "native_below" not in r:
                continue
            slot = by_size.setdefault(r["bytes"], {})
            slot["auto" if r["native_below"] == "auto" else "fixed"] = r
        configs[name] = by_size
    return configs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    configs = load(outdir)
    if not configs:
        sys.exit(f"auto_sweep.py: no results in {outdir}")
    lines = ["# The measured choice against the fixed paths (bench/auto-sweep)", "",
             "Times in microseconds, median of the max over ranks; `compressed`: native_below 0; "
             "`mpi`: MPI_Allreduce (Open MPI's default, timed in auto's own loop); "
             "auto/best: auto over the faster of the two; auto/mpi: auto over MPI_Allreduce.", ""]
    worst = []
    plot = {}
    for name, by_size in configs.items():
        lines += [f"## {name}", "", "| size | compressed | mpi | auto | path | auto/best | auto/mpi |",
                  "|---:|---:|---:|---:|:--|---:|---:|"]
        pts = []
        for size in sorted(by_size):
            s = by_size[size]
            if "auto" not in s or "fixed" not in s:
                continue
            tc = s["fixed"]["time_s"]
            tm = s["auto"]["mpi_default_time_s"]
            ta = s["auto"]["time_s"]
            best = min(tc, tm)
            lines.append(f"| {size_label(size)} | {tc * 1e6:.1f} | {tm * 1e6:.1f} | {ta * 1e6:.1f} | "
                         f"{s['auto'].get('auto_pick', '?')} | {ta / best:.3f} | {ta / tm:.3f} |")
            worst.append((ta / best, name, size))
            pts.append((size, tc / tm, ta / tm))
        lines.append("")
        plot[name] = pts
    worst.sort(reverse=True)
    over = [w for w in worst if w[0] > 1.05]
    lines += ["## Worst ratios", "",
              f"{len(over)} of {len(worst)} rows have auto/best above 1.05."]
    lines += [f"- {r:.3f}: {n}, {size_label(b)}" for r, n, b in worst[:8]]
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-(len(worst[:8]) + 3):]))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("auto_sweep.py: no matplotlib, no plot (apt-get install python3-matplotlib)")
        return
    names = sorted(plot)
    cols = 4
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False, sharex=True)
    for ax, name in zip(axes.flat, names):
        pts = plot[name]
        xs = [p[0] for p in pts]
        ax.axhline(1.0, color="gray", lw=1, label="MPI_Allreduce")
        ax.plot(xs, [p[1] for p in pts], "o--", label="compressed (fixed)")
        ax.plot(xs, [p[2] for p in pts], "s-", label="auto")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(name, fontsize=9)
        ax.set_xticks(xs)
        ax.set_xticklabels([size_label(x) for x in xs], rotation=60, fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].set_ylabel("time / MPI_Allreduce")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "auto-vs-fixed.png"), dpi=90)
    print(f"auto_sweep.py: wrote {outdir}/summary.md and auto-vs-fixed.png")


if __name__ == "__main__":
    main()
