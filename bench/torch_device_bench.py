#!/usr/bin/env python3
"""cgx_torch on CUDA tensors under torchrun: the time of one allreduce of 16-256 MiB of
float32, in one run, for each way a torch.distributed job can reduce a CUDA tensor:

  cgx ipc    cgx_torch.allreduce_ (4 bits) over a group whose CUDA tensors go through
             cgx's device plan over comm::cuda_ipc, set up through the Store
             (CGX_TORCH_DEVICE_TRANSPORT=cuda_ipc; the ranks of one node)
  cgx host   the same call staged through a pinned host copy (CGX_TORCH_DEVICE_TRANSPORT=host)
  nccl       torch.distributed.all_reduce over an NCCL group (needs one GPU per rank;
             left out, and said so, when ranks share a GPU)
  gloo       torch.distributed.all_reduce over gloo on the CUDA tensor (what a job without
             NCCL has)

    torchrun --standalone --nproc-per-node 2 bench/torch_device_bench.py [--mib 16 64 256]
             [--reps 5] [--json FILE]

Ratios are against nccl where it ran, else against gloo, measured in the same run.
Every rank's result is checked against the exact sum (within 4-bit max-min's bound for
cgx, exact for the others) before its time counts.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import cgx_torch
from cgx_torch import _core


def group_with(transport, ranks):
    """A new gloo group whose CUDA tensors take `transport` (read when cgx first uses it)."""
    g = dist.new_group(ranks, backend="gloo")
    os.environ["CGX_TORCH_DEVICE_TRANSPORT"] = transport
    _core.group_of(g)  # makes cgx's group now, with this choice
    return g


def timed(fn, reps, device):
    fn()  # warm-up: plans built, connections made
    torch.cuda.synchronize(device)
    dist.barrier()
    ts = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        ts.append(time.perf_counter() - t0)
    t = torch.tensor([sorted(ts)[len(ts) // 2]])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    ngpu = torch.cuda.device_count()
    if ngpu == 0:
        print("torch_device_bench: no GPU visible", flush=True)
        return 1
    device = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(device)
    ranks = list(range(size))
    ipc = group_with("cuda_ipc", ranks)
    host = group_with("host", ranks)
    os.environ.pop("CGX_TORCH_DEVICE_TRANSPORT", None)
    nccl = dist.new_group(ranks, backend="nccl") if ngpu >= size else None
    rows, bad = [], []
    for mib in args.mib:
        n = mib * (1 << 20) // 4
        g = torch.Generator(device=device).manual_seed(1234 + rank)
        x = torch.randn(n, device=device, generator=g)
        exact = x.double()
        dist.all_reduce(exact)  # gloo, in float64: the reference
        amp = torch.tensor([x.abs().max().item()])
        dist.all_reduce(amp, op=dist.ReduceOp.MAX)
        # 4-bit max-min, stochastic: each rank's value within one step (range/15) of itself,
        # per summand; the SRA adds the owner's re-quantization. A loose, sure bound:
        bound = 2.0 * size * 2 * amp.item() / 15 * 1.01
        y = torch.empty_like(x)
        res = {"mib": mib}

        def run(name, fn, tol):
            def once():
                y.copy_(x)
                fn(y)

            t = timed(once, args.reps, device)
            err = (y.double() - exact).abs().max().item()
            if err > tol:
                bad.append(f"{name} at {mib} MiB: max error {err:.3g} > {tol:.3g}")
            res[name] = t

        run("cgx ipc", lambda t: cgx_torch.allreduce_(t, 4, comm=ipc), bound)
        run("cgx host", lambda t: cgx_torch.allreduce_(t, 4, comm=host), bound)
        if nccl is not None:
            run("nccl", lambda t: dist.all_reduce(t, group=nccl), 1e-3 * size * amp.item())
        run("gloo", lambda t: dist.all_reduce(t), 1e-3 * size * amp.item())
        rows.append(res)
    if rank == 0:
        base = "nccl" if nccl is not None else "gloo"
        if nccl is None:
            print(f"torch_device_bench: nccl left out: {size} ranks share {ngpu} GPU(s) (NCCL needs one per rank)")
        cols = [c for c in ("cgx ipc", "cgx host", "nccl", "gloo") if c in rows[0]]
        print(f"{'MiB':>5} " + " ".join(f"{c + ' ms':>12}" for c in cols) + "   " +
              " ".join(f"{c + '/' + base:>14}" for c in cols if c != base))
        for r in rows:
            print(f"{r['mib']:>5} " + " ".join(f"{1e3 * r[c]:>12.2f}" for c in cols) + "   " +
                  " ".join(f"{r[base] / r[c]:>13.2f}x" for c in cols if c != base))
        for b in bad:
            print("torch_device_bench: WRONG: " + b)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": size, "gpus": ngpu, "baseline": base, "rows": rows, "wrong": bad}, f, indent=1)
        print("torch_device_bench: " + ("FAILED" if bad else "OK"), flush=True)
    cgx_torch.free_plans()
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
