#!/usr/bin/env python3
"""Runs an unmodified MPI program twice, without and with libcgx_mpi, and compares.

  run_preload.py --launcher openmpi|hydra --mpiexec MPIEXEC --np N [--extra ARG]...
                 [--preload LIB | --linked PROG2] [--env K=V]... [--opt COMM=MODE]...
                 [--env-mode MODE] [--min-bytes B] PROG [PROG_ARGS...]

The program (allreduce_c or allreduce_f) writes each reduction's result on rank 0 to
OUTDIR/<id>.bin and prints "result <id> <type> <count> <op> <comm> <inplace>
<input_range_sum> <output_range> <ranks_agree>" (see allreduce_c.c).

Which reductions the library must compress ("opted in"): sum of f32/f64 on a
communicator named in --opt (MODE: bits:B or bound:E; its cgx_min_bytes in
--opt-min COMM=B), or on any communicator when --env-mode is given (the environment's
CGX_MPI_BITS / CGX_MPI_ERROR_BOUND, with --min-bytes), of at least the minimum bytes,
on more than one rank. Those must be within their bound of the run without the
library, must differ from it (compression happened), and the report (CGX_MPI_REPORT=1)
must count exactly that many compressed calls. Every other result must be the same bytes.
Every rank must get the same bytes in both runs.
"""
import argparse
import array
import math
import os
import re
import subprocess
import sys
import tempfile

def parse_mode(s):
    kind, _, v = s.partition(":")
    if kind == "bits":
        return ("bits", int(v))
    if kind == "bound":
        return ("bound", float(v))
    raise SystemExit(f"bad mode {s!r}")

def launch(a, outdir, env, preload, prog_cmd):
    cmd = [a.mpiexec, "-n", str(a.np)] + a.extra
    envs = dict(env)
    if preload:
        envs["LD_PRELOAD"] = preload
    envs["CGX_MPI_REPORT"] = "1"
    for k, v in envs.items():
        cmd += (["-x", f"{k}={v}"] if a.launcher == "openmpi" else ["-genv", k, v])
    cmd += prog_cmd[:1] + [outdir] + prog_cmd[1:]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=500)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: exit status {p.returncode}")
    results = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if f and f[0] == "result":
            results[f[1]] = dict(type=f[2], count=int(f[3]), op=f[4], comm=f[5], inplace=f[6] == "1",
                                 in_range=float(f[7]), out_range=float(f[8]), agree=f[9] == "1")
    if not any(l.startswith("done") for l in p.stdout.splitlines()):
        raise SystemExit("FAIL: the program did not finish")
    return results, p.stderr

def values(path, t):
    a = array.array({"f32": "f", "f64": "d", "int": "i"}[t])
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True, choices=["openmpi", "hydra"])
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np", type=int, required=True)
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--preload")
    ap.add_argument("--linked", help="the same program linked with libcgx_mpi (run instead of PROG, no preload)")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--opt", action="append", default=[])
    ap.add_argument("--opt-min", action="append", default=[])
    ap.add_argument("--env-mode")
    ap.add_argument("--min-bytes", type=int, default=65536)
    ap.add_argument("prog", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    a.extra = [x for e in a.extra for x in e.split()]
    env = dict(kv.split("=", 1) for kv in a.env)
    opts = {c: parse_mode(m) for c, m in (o.split("=", 1) for o in a.opt)}
    opt_min = {c: int(b) for c, b in (o.split("=", 1) for o in a.opt_min)}
    env_mode = parse_mode(a.env_mode) if a.env_mode else None

    with tempfile.TemporaryDirectory(prefix="cgx_preload_") as tmp:
        base_dir, cgx_dir = os.path.join(tmp, "base"), os.path.join(tmp, "cgx")
        os.mkdir(base_dir)
        os.mkdir(cgx_dir)
        base, _ = launch(a, base_dir, {}, None, a.prog)
        cgx_cmd = ([a.linked] + a.prog[1:]) if a.linked else a.prog
        got, err = launch(a, cgx_dir, env, None if a.linked else a.preload, cgx_cmd)
        if set(base) != set(got):
            raise SystemExit(f"FAIL: the runs reported different reductions: {sorted(set(base) ^ set(got))}")
        failures, compressed, want_calls = [], 0, 0
        for rid, r in base.items():
            g = got[rid]
            if not r["agree"] or not g["agree"]:
                failures.append(f"{rid}: the ranks got different bytes")
            mode, eligible, comm_ranks, calls = classify(r, opts, opt_min, env_mode, a)
            want_calls += calls
            b = values(os.path.join(base_dir, rid + ".bin"), r["type"])
            c = values(os.path.join(cgx_dir, rid + ".bin"), r["type"])
            if len(b) != len(c):
                failures.append(f"{rid}: {len(c)} values, expected {len(b)}")
                continue
            if not eligible:
                if b.tobytes() != c.tobytes():
                    diff = sum(1 for x, y in zip(b, c) if x != y)
                    failures.append(f"{rid}: not opted in, but {diff} values differ from MPI's")
                else:
                    print(f"ok   {rid}: bit-exact ({r['count']} {r['type']}, {r['op']}, comm {r['comm']})")
                continue
            compressed += 1
            eps = 2.0 ** -23 if r["type"] == "f32" else 2.0 ** -52
            big = max(1.0, max(abs(x) for x in b))
            # Both results round the sum: MPI's p - 1 additions, cgx's additions and decodes.
            slack = 8 * comm_ranks * eps * big
            if mode[0] == "bound":
                bound = mode[1] + slack
                what = f"error bound {mode[1]:g}"
            else:
                # DESIGN.md / scatter_reduce_allgather.hpp, stochastic rounding: |err| <
                # sum_{r != o} u_r + u_s, u = range / (2^bits - 1) of the bucket; bounded
                # here by the whole buffer's ranges (each bucket's range is at most that):
                # sum_r u_r <= S / L, u_s <= (R + 2 S / L) / L.
                L = 2 ** mode[1] - 1
                S, R = r["in_range"], r["out_range"]
                bound = S / L + (R + 2 * S / L) / L + slack
                what = f"{mode[1]}-bit max-min bound {bound:.3g}"
            worst = max(abs(x - y) for x, y in zip(b, c))
            if not math.isfinite(worst) or worst > bound:
                failures.append(f"{rid}: max |cgx - MPI| = {worst:.3g} exceeds the {what}")
            elif b.tobytes() == c.tobytes():
                failures.append(f"{rid}: opted in, but bit-identical to MPI's result (not compressed?)")
            else:
                print(f"ok   {rid}: within the {what} (max error {worst:.3g}; {r['count']} {r['type']}, comm {r['comm']})")
        m = re.search(r"cgx_mpi report \(\d+ ranks[^)]*\): MPI_Allreduce calls, all ranks: (\d+) compressed", err)
        if not m:
            failures.append("no cgx_mpi report on stderr (CGX_MPI_REPORT=1)")
        else:
            if int(m.group(1)) != want_calls:
                failures.append(f"the report counts {m.group(1)} compressed calls; expected {want_calls}")
            else:
                print(f"ok   report: {m.group(1)} compressed calls (all ranks)")
        if failures:
            print("FAIL:\n  " + "\n  ".join(failures))
            return 1
        print(f"PASS: {len(base)} reductions, {compressed} compressed within their bound, the rest bit-exact")
        return 0

def classify(r, opts, opt_min, env_mode, a):
    """(mode, whether rank 0's call is compressed, ranks of rank 0's communicator, compressed
    calls of all ranks). A split's halves are the even and the odd ranks; a communicator of
    one rank is never compressed."""
    mode = opts.get(r["comm"], env_mode)
    size = {"f32": 4, "f64": 8, "int": 4}[r["type"]]
    min_bytes = opt_min.get(r["comm"], a.min_bytes) if r["comm"] in opts else a.min_bytes
    groups = [(a.np + 1) // 2, a.np // 2] if r["comm"] == "split" else [a.np]
    wanted = (mode is not None and r["op"] == "sum" and r["type"] in ("f32", "f64") and r["count"] * size >= min_bytes)
    calls = sum(g for g in groups if g > 1) if wanted else 0
    return mode, wanted and groups[0] > 1, groups[0], calls

if __name__ == "__main__":
    sys.exit(main())
