#!/usr/bin/env python3
"""cgx's torch doors side by side in one run (torch 2.x, torchrun, no MPI): the MLP of
bench/ddp_compare.py (10.8 M parameters by default, a synthetic 10-class task) trained with

  ddp_gloo      DDP over a gloo group, its own allreduce (fp32, no hook)
  ddp_hook      DDP over that gloo group with cgx_torch's hook, CGXState(bits=4)
  ddp_backend   DDP over the default group of init_process_group("cgx"), no hook (the
                backend's compressed allreduce, its settings from CGX_COMPRESSION_*)
  fsdp_gloo     FSDP2 (fully_shard on every Linear and the root) over the gloo group:
                exact all-gather and reduce-scatter
  fsdp_backend  FSDP2 over the default `cgx` group, unchanged: the backend's compressed
                reduce-scatter, exact all-gather
  fsdp_cgx      FSDP2 over the gloo group with cgx_torch.fsdp.compress(bits=4): cgx's
                compressed reduce-scatter, exact all-gather
  fsdp_cgx_ag8  the same with params_bits=8: parameters all-gathered as 8-bit codes too

Every configuration starts from the same weights and sees the same batches (SGD, momentum
0.9), one after the other; it reports the median seconds of a step (forward, backward with
the reductions, optimizer step; the slowest rank's, after a barrier; the first --warmup
steps untimed), the speedup over ddp_gloo (and, for FSDP2, over fsdp_gloo), and the
held-out loss and accuracy after the last step.

    torchrun --standalone --nproc-per-node 4 bench/torch_compare.py [--steps 20] [--json out.json]
    bench/netns-run 1gbit 0 torchrun --standalone --nproc-per-node 4 bench/torch_compare.py   # 1 Gbit/s
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
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch
from cgx_torch import fsdp as cgx_fsdp
from ddp_compare import add_common_args, evaluate, make_data, train_timed  # bench/ (sys.path[0])
from mlp import make_model

CONFIGS = ("ddp_gloo", "ddp_hook", "ddp_backend", "fsdp_gloo", "fsdp_backend", "fsdp_cgx", "fsdp_cgx_ag8")


def build(cfg, dims, gloo, bucket_mb):
    """(model to train, the module to evaluate, cleanup, stats) for cfg."""
    model = make_model(dims)
    if cfg.startswith("ddp"):
        if cfg == "ddp_backend":
            m = DDP(model, bucket_cap_mb=bucket_mb)  # the default group: cgx
        else:
            m = DDP(model, process_group=gloo, bucket_cap_mb=bucket_mb)
        state = None
        if cfg == "ddp_hook":
            state = cgx_torch.CGXState(gloo, bits=4)
            m.register_comm_hook(state, cgx_torch.cgx_hook)
        return m, m.module, (state.free if state else None), None
    mesh = None if cfg == "fsdp_backend" else DeviceMesh.from_group(gloo, "cpu")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    inst = None
    if cfg == "fsdp_cgx":
        inst = cgx_fsdp.compress(model, bits=4)
    elif cfg == "fsdp_cgx_ag8":
        inst = cgx_fsdp.compress(model, bits=4, params_bits=8)
    return model, model, None, inst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, steps=20)
    ap.add_argument("--bucket-mb", type=float, default=64, help="DDP's bucket_cap_mb (default: one bucket)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}): no step would be timed")
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configurations {unknown} (known: {', '.join(CONFIGS)})")

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    dims = [int(d) for d in args.dims.split(",")]
    n_params = sum(q.numel() for q in make_model(dims).parameters())
    (x, y), (xt, yt) = make_data(dims[0], args.steps * args.batch * p, 4096)
    results = {}
    for cfg in configs:
        m, ev, free, inst = build(cfg, dims, gloo, args.bucket_mb)
        times = train_timed(m, x, y, args, group=gloo)
        acc, tloss = evaluate(ev, xt, yt)
        r = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "accuracy": acc,
             "test_loss": tloss}
        if inst is not None:  # this rank's bytes per step through the 8-bit all-gather
            if inst.all_gather is not None:
                r["ag_bytes_per_step"] = inst.all_gather.bytes_sent / args.steps
                r["ag_bytes_exact_per_step"] = inst.all_gather.bytes_exact / args.steps
        results[cfg] = r
        if free:
            free()
        del m, ev, inst
        gc.collect()
    if rank == 0:
        link = os.environ.get("CGX_LINK", "unknown (not under bench/netns-run)")
        print(f"torch_compare: {p} ranks (torchrun; default group `cgx`, a gloo group beside it), link {link}, MLP "
              f"{'-'.join(map(str, dims))} ({n_params / 1e6:.2f} M parameters), batch {args.batch} per rank, "
              f"{args.steps} steps ({args.steps - args.warmup} timed), SGD lr {args.lr} momentum 0.9, "
              f"cgx backend {cgx_torch.backend.settings().bits} bits, torch {torch.__version__}")
        print(f"{'config':<13} {'step_s':>8} {'min_s':>7} {'max_s':>7} {'vs_ddp_gloo':>11} {'vs_fsdp_gloo':>12} "
              f"{'test_acc':>9} {'test_loss':>10}")
        g = results.get("ddp_gloo", {}).get("median_s")
        fg = results.get("fsdp_gloo", {}).get("median_s")
        for c, r in results.items():
            sp = f"{g / r['median_s']:10.2f}x" if g else f"{'-':>11}"
            fsp = f"{fg / r['median_s']:11.2f}x" if fg and c.startswith("fsdp") else f"{'-':>12}"
            print(f"{c:<13} {r['median_s']:8.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} {sp} {fsp} "
                  f"{r['accuracy']:8.2f}% {r['test_loss']:10.5f}")
        print("(step_s: median seconds per step, the slowest rank's; vs_*: that configuration's median / this one's)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": p, "link": link, "dims": dims, "parameters": n_params, "batch": args.batch,
                           "steps": args.steps, "warmup": args.warmup, "torch": torch.__version__,
                           "backend_bits": cgx_torch.backend.settings().bits, "date": time.strftime("%Y-%m-%d"),
                           "load": os.getloadavg(), "results": results}, f, indent=1)
    cgx_torch.free_plans()
    cgx_fsdp.free()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
