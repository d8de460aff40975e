#!/usr/bin/env python3
"""What a PyTorch user would pick, side by side: DDP training of one model of >= 10 M
parameters (an MLP on a synthetic 10-class task) under torchrun, with the gradients reduced by
  gloo      DDP's own allreduce (fp32, no hook)
  fp16      torch's fp16_compress_hook
  powersgd  torch's powerSGD_hook, matrix_approximation_rank 4 (PyTorch's suggested
            start), start_powerSGD_iter 2 (compressed from the third step on)
  cgx4      cgx_torch's hook, 4 bits (layer-wise, bucket 1024, stochastic rounding)
  adaptive  cgx_torch's hook with adaptive bits (2..8, average <= 4)
Every configuration trains from the same initial weights on the same batches for --steps
steps (SGD, momentum 0.9), one after the other in one run; it reports the median time of a
step (forward, backward with the reduction, optimizer step; the slowest rank's, after a
barrier; the first --warmup steps untimed), the held-out accuracy and loss at the end, and
the speedup of each over gloo.

    torchrun --standalone --nproc-per-node 4 bench/ddp_compare.py [--steps 60] [--json out.json]
    bench/netns-run 1gbit 0 torchrun --standalone --nproc-per-node 4 bench/ddp_compare.py   # 1 Gbit/s

Under bench/netns-run (NP 0: the command starts its own ranks) gloo's traffic, and so
every configuration's, crosses the one rate-limited loopback (GLOO_SOCKET_IFNAME=lo).
"""
import argparse
import gc
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch
from mlp import make_model  # bench/mlp.py (bench/ is sys.path[0]): ddp_bench.py's MLP


def make_data(d, n_train, n_test, seed=20261204):
    """A 10-class task, the same on every rank: each class a mixture of 4 Gaussian blobs."""
    g = torch.Generator().manual_seed(seed)
    centres = 1.2 * torch.randn(40, d, generator=g)

    def draw(n):
        y = torch.randint(0, 10, (n,), generator=g)
        b = torch.randint(0, 4, (n,), generator=g)
        return centres[y * 4 + b] + torch.randn(n, d, generator=g), y

    return draw(n_train), draw(n_test)


def add_common_args(ap, steps):
    """The model, batch and schedule arguments (ddp_compare.py and torch_compare.py)."""
    ap.add_argument("--dims", default="64,4096,2048,1024,10", help="MLP widths (default: 10.8 M parameters)")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.02)


def train_timed(m, x, y, args, group=None):
    """SGD (momentum 0.9) on rank's batches of x, y for args.steps steps; the seconds of each
    step after args.warmup (the slowest rank's, after a barrier on group)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    opt = torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for st in range(args.steps):
        lo = (st * p + rank) * args.batch
        xb, yb = x[lo:lo + args.batch], y[lo:lo + args.batch]
        dist.barrier(group=group)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(m(xb), yb).backward()
        opt.step()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        if st >= args.warmup:
            times.append(t.item())
    return times


def evaluate(module, xt, yt):
    """(held-out accuracy in %, held-out loss) of module."""
    with torch.no_grad():
        out = module(xt)
        return 100.0 * (out.argmax(1) == yt).double().mean().item(), nn.CrossEntropyLoss()(out, yt).item()


def hooked(cfg, model, bucket_mb):
    """model wrapped in DDP with cfg's reduction; returns (ddp model, state to free or None)."""
    m = DDP(model, bucket_cap_mb=bucket_mb)
    state = None
    if cfg == "fp16":
        m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif cfg == "powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2)
        m.register_comm_hook(state, psgd.powerSGD_hook)
        state = None  # nothing to free
    elif cfg == "cgx4":
        state = cgx_torch.CGXState(bits=4)
        m.register_comm_hook(state, cgx_torch.cgx_hook)
    elif cfg == "adaptive":
        state = cgx_torch.CGXState(bits=4, adaptive=cgx_torch.AdaptiveOptions(target_bits=4.0))
        m.register_comm_hook(state, cgx_torch.cgx_hook)
    elif cfg != "gloo":
        raise SystemExit(f"ddp_compare: unknown configuration {cfg}")
    return m, state


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, steps=60)
    ap.add_argument("--bucket-mb", type=float, default=64,
                    help="DDP's bucket_cap_mb, every configuration (default 64: the whole model in one bucket; "
                         "powerSGD_hook over gloo with several buckets can issue its collectives in a different "
                         "order on different ranks, seen here as a size mismatch or a hang)")
    ap.add_argument("--configs", default="gloo,fp16,powersgd,cgx4,adaptive")
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}): no step would be timed")

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    dims = [int(d) for d in args.dims.split(",")]
    n_params = sum(q.numel() for q in make_model(dims).parameters())
    (x, y), (xt, yt) = make_data(dims[0], args.steps * args.batch * p, 4096)
    results = {}
    for cfg in args.configs.split(","):
        m, state = hooked(cfg, make_model(dims), args.bucket_mb)
        times = train_timed(m, x, y, args)
        acc, tloss = evaluate(m.module, xt, yt)
        bits = state.average_bits() if state is not None else None
        results[cfg] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                        "accuracy": acc, "test_loss": tloss, "bits": bits}
        if state is not None:
            state.free()
        del m
    if rank == 0:
        link = os.environ.get("CGX_LINK", "unknown (not under bench/netns-run)")
        print(f"ddp_compare: {p} ranks (torchrun, gloo group), link {link}, MLP {'-'.join(map(str, dims))} "
              f"({n_params / 1e6:.2f} M parameters), batch {args.batch} per rank, {args.steps} steps "
              f"({args.steps - args.warmup} timed), SGD lr {args.lr} momentum 0.9, torch {torch.__version__}")
        print(f"{'config':<9} {'step_s':>8} {'min_s':>7} {'max_s':>7} {'vs_gloo':>8} {'test_acc':>9} {'test_loss':>10}")
        g = results.get("gloo", {}).get("median_s")
        for c, r in results.items():
            sp = f"{g / r['median_s']:7.2f}x" if g else f"{'-':>8}"
            print(f"{c:<9} {r['median_s']:8.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} {sp} {r['accuracy']:8.2f}% "
                  f"{r['test_loss']:10.5f}" + (f"  ({r['bits']:.2f} bits/value)" if r["bits"] else ""))
        print("(step_s: median seconds per step, the slowest rank's; vs_gloo: gloo's median / this one's)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": p, "link": link, "dims": dims, "parameters": n_params, "batch": args.batch,
                           "steps": args.steps, "warmup": args.warmup, "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d"), "results": results}, f, indent=1)
    # (as in examples/python/train_ddp.py: DDP models in reference cycles keep the group,
    # and gloo's threads, alive into Python's shutdown unless collected first)
    cgx_torch.free_plans()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
