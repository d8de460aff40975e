#!/usr/bin/env python3
"""Time of one DDP training step (forward, backward with the gradient reduction,
optimizer step) of a model of >= 10 M parameters on CPU, with the gradients reduced by
  gloo   DDP's own allreduce over its gloo process group (no hook), fp32
  fp16   torch's fp16_compress_hook (gloo allreduce of fp16 gradients)
  cgx4   cgx_torch's hook, 4 bits (layer-wise plan, bucket 1024, stochastic rounding)
  cgx4sync  the same, reducing inside the hook (overlap=False) instead of on the hook's
         background thread while the backward pass goes on
  local  no reduction at all (the same model, not wrapped in DDP): the compute floor
in one run: the configurations take turns step by step (so that the host's slow spells
hit all of them), each step starts after a barrier, a step's time is the slowest
rank's, and each configuration's figure is the median over --steps timed steps (after
--warmup untimed ones: DDP rebuilds its buckets after the first step, cgx builds its
plans). Speedups are of cgx4 over gloo and over fp16, from the medians.

    mpirun -np 4 python3 bench/ddp_bench.py [--steps 7] [--json out.json]
    bench/netns-run 1gbit 4 /usr/bin/python3 bench/ddp_bench.py     # the emulated 1 Gbit/s link

gloo is pinned to the loopback (GLOO_SOCKET_IFNAME=lo, MASTER_ADDR=127.0.0.1), so under
bench/netns-run both gloo's and MPI's (cgx's) traffic cross the one rate-limited link.
"""
import argparse
import json
import os
import statistics
import sys
import time

from mpi4py import MPI

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch
from mlp import make_model  # bench/mlp.py (bench/ is sys.path[0])


def main():
    """Times every configuration, step by step in turn, and prints the table (rank 0)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="1024,4096,2048,1024,10", help="MLP widths (default: 14.7 M parameters)")
    ap.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=7, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--configs", default="gloo,fp16,cgx4,cgx4sync,local")
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    cgx_torch.init_process_group_from_mpi(comm)  # DDP's gloo group over the same ranks
    rank, p = comm.rank, comm.size
    dims = [int(d) for d in args.dims.split(",")]
    configs = args.configs.split(",")

    models, opts, states = {}, {}, {}
    for cfg in configs:
        m = make_model(dims) if cfg == "local" else DDP(make_model(dims))
        if cfg == "fp16":
            m.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif cfg in ("cgx4", "cgx4sync"):
            states[cfg] = cgx_torch.CGXState(comm, bits=args.bits, overlap=cfg == "cgx4")
            m.register_comm_hook(states[cfg], cgx_torch.cgx_hook)
        elif cfg not in ("gloo", "local"):
            sys.exit(f"ddp_bench: unknown configuration {cfg}")
        models[cfg] = m
        opts[cfg] = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    n_params = sum(q.numel() for q in make_model(dims).parameters())
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, dims[0], generator=g)
    y = torch.randint(0, dims[-1], (args.batch,), generator=g)
    loss_fn = nn.CrossEntropyLoss()

    load_start = open("/proc/loadavg").read().split()[:3]

    def step(cfg):
        """One timed training step of configuration cfg: the slowest rank's seconds."""
        m, o = models[cfg], opts[cfg]
        comm.Barrier()
        t0 = time.perf_counter()
        o.zero_grad(set_to_none=True)
        loss_fn(m(x), y).backward()
        o.step()
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    times = {c: [] for c in configs}
    for i in range(args.warmup + args.steps):
        for cfg in configs:
            t = step(cfg)
            if i >= args.warmup:
                times[cfg].append(t)

    med = {c: statistics.median(v) for c, v in times.items()}
    load_end = open("/proc/loadavg").read().split()[:3]
    if rank == 0:
        link = os.environ.get("CGX_LINK", "unknown (not under bench/netns-run)")
        grad_mb = n_params * 4 / 2**20
        print(f"ddp_bench: {p} ranks, link {link}, MLP {'-'.join(map(str, dims))} ({n_params / 1e6:.2f} M parameters, "
              f"{grad_mb:.1f} MiB of fp32 gradients), batch {args.batch} per rank, torch {torch.__version__}, "
              f"{args.steps} timed steps per configuration after {args.warmup} untimed; host load average "
              f"{' '.join(load_start)} at the start, {' '.join(load_end)} at the end")
        print(f"{'config':<8} {'median_s':>9} {'min_s':>8} {'max_s':>8} {'above_local_s':>14} {'cgx4_speedup':>13}")
        for c in configs:
            above = f"{med[c] - med['local']:14.3f}" if "local" in med else f"{'-':>14}"
            sp = f"{med[c] / med['cgx4']:12.2f}x" if "cgx4" in med and c != "local" else f"{'-':>13}"
            print(f"{c:<8} {med[c]:9.3f} {min(times[c]):8.3f} {max(times[c]):8.3f} {above} {sp}")
        print("(median/min/max: seconds per step, the slowest rank's; above_local_s: median minus the median of "
              "'local', the same step without any reduction)")
        extra = {}
        if "cgx4" in states:
            st = states["cgx4"]
            extra = {"cgx_bytes_sent_per_rank": st.bytes_sent(), "cgx_average_bits": st.average_bits()}
            print(f"cgx4: {st.average_bits():.2f} bits per value on average (uncompressed layers at 32), "
                  f"{st.bytes_sent() / 2**20:.2f} MiB sent per rank and step (fp32: "
                  f"{2 * (p - 1) / p * grad_mb:.2f} MiB in a ring allreduce)")
        for base in ("gloo", "fp16", "cgx4sync"):
            if base in med and "cgx4" in med:
                print(f"speedup of the cgx {args.bits}-bit hook over {base}: {med[base] / med['cgx4']:.2f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": p, "link": link, "dims": dims, "parameters": n_params, "batch": args.batch,
                           "torch": torch.__version__, "steps": args.steps, "warmup": args.warmup,
                           "times_s": times, "median_s": med, "date": time.strftime("%Y-%m-%d"),
                           "loadavg_start": load_start, "loadavg_end": load_end, **extra}, f, indent=1)
    for s in states.values():
        s.free()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
