#!/usr/bin/env python3
"""DDP training of a small MLP on CPU with and without cgx's communication hook.

    torchrun --standalone --nproc-per-node 4 examples/python/train_ddp.py   # [--epochs 4] [--no-check]
    mpirun -np 4 python3 examples/python/train_ddp.py

Every rank builds the same synthetic classification task (10 classes, each a mixture of
4 Gaussian blobs in 32 dimensions; fixed seed) and trains the same initial MLP with
PyTorch's DistributedDataParallel over a gloo process group, each rank on its share of
every global batch, in three configurations that differ only in how gradients are
reduced: fp32 (DDP's own gloo allreduce, no hook), the cgx hook at 4 bits, and the cgx
hook with CGX's adaptive bits (2..8 bits, average <= 3.5). It prints held-out accuracy
and time per step, and checks (exit status 1 otherwise, unless --no-check):
  - cgx 4-bit ends within 1 percentage point of fp32's held-out accuracy;
  - after training, every rank holds bit-identical parameters (each configuration).
Under torchrun the hook sends cgx's messages over DDP's own gloo group (no MPI needed);
under mpirun over MPI.COMM_WORLD, DDP's gloo group being set up from it (MASTER_ADDR
127.0.0.1, a free port picked by rank 0).
"""
import argparse
import gc
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch

DIMS = (32, 256, 128, 64, 10)
CLASSES, BLOBS = 10, 4


class Ranks:
    """What the script asks of the job: rank, size, allgather, max, broadcast from rank 0;
    over torch.distributed (torchrun) or mpi4py (mpirun)."""

    def __init__(self):
        if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: its environment names the group
            dist.init_process_group("gloo")
            self.mpi = None
            self.rank, self.size = dist.get_rank(), dist.get_world_size()
        else:
            from mpi4py import MPI  # initializes MPI before cgx_torch needs it

            self.mpi = MPI
            c = MPI.COMM_WORLD
            cgx_torch.init_process_group_from_mpi(c)  # DDP's gloo group over the same ranks
            self.rank, self.size = c.rank, c.size
        self.launcher = "mpirun (cgx over MPI)" if self.mpi else "torchrun (cgx over the gloo group)"

    def allgather(self, obj):
        if self.mpi:
            return self.mpi.COMM_WORLD.allgather(obj)
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def max(self, x):
        return max(self.allgather(x))

    def bcast(self, obj):
        return self.allgather(obj)[0]


def make_data(n_train, n_test, noise, seed=20221107):
    """The same data on every rank (a fixed generator): blobs of different classes interleave."""
    g = torch.Generator().manual_seed(seed)
    centres = 1.1 * torch.randn(CLASSES * BLOBS, DIMS[0], generator=g)

    def draw(n):
        """n samples: a class, one of its blobs, Gaussian noise around the blob's centre."""
        y = torch.randint(0, CLASSES, (n,), generator=g)
        b = torch.randint(0, BLOBS, (n,), generator=g)
        x = centres[y * BLOBS + b] + noise * torch.randn(n, DIMS[0], generator=g)
        return x, y

    return draw(n_train), draw(n_test)


def make_model(seed=7):
    """The MLP, with the same initial weights on every rank and in every configuration."""
    torch.manual_seed(seed)
    layers = []
    for i in range(len(DIMS) - 1):
        layers.append(nn.Linear(DIMS[i], DIMS[i + 1]))
        if i < len(DIMS) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def param_digest(model):
    """A digest of the model's parameters (to compare ranks)."""
    h = hashlib.blake2b(digest_size=16)
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def hook_settings(cfg):
    """CGXState's keywords for a configuration: "adaptive", or "cgx-<b>bit" with the hook's
    defaults for b bits, "-ef" / "-noef" (error feedback on / off), "-plain" (bucket 1024,
    stochastic rounding, error feedback off unless "-ef": the defaults before issue 37)."""
    if cfg == "adaptive":
        return {"bits": 4, "adaptive": cgx_torch.AdaptiveOptions(min_bits=2, max_bits=8, target_bits=3.5, interval=16)}
    parts = cfg.split("-")
    if len(parts) < 2 or parts[0] != "cgx" or not parts[1].endswith("bit") or not parts[1][:-3].isdigit():
        raise SystemExit(f"train_ddp: unknown configuration {cfg!r}")
    kw = {"bits": int(parts[1][:-3])}
    for m in parts[2:]:
        if m in ("ef", "noef"):
            kw["error_feedback"] = m == "ef"
        elif m == "plain":
            kw.update(bucket=1024, rounding="stochastic")
            kw.setdefault("error_feedback", False)
        else:
            raise SystemExit(f"train_ddp: unknown modifier {m!r} in {cfg!r}")
    return kw


def train(cfg, args, comm, train_set, test_set):
    """Trains one configuration; returns (accuracy %, test loss, ms per step, digests, bits)."""
    rank, p = comm.rank, comm.size
    model = DDP(make_model(), bucket_cap_mb=args.bucket_mb)
    state = None
    if cfg != "fp32":
        state = cgx_torch.CGXState(**hook_settings(cfg))  # the launcher's group
        model.register_comm_hook(state, cgx_torch.cgx_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x, y = train_set
    per_rank = args.batch
    steps = x.shape[0] // (per_rank * p)
    g = torch.Generator().manual_seed(1234)  # the same batches in every configuration
    step_times, bits = [], []
    for _ in range(args.epochs):
        perm = torch.randperm(x.shape[0], generator=g)
        for st in range(steps):
            idx = perm[(st * p + rank) * per_rank:(st * p + rank + 1) * per_rank]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            step_times.append(time.perf_counter() - t0)
            if state is not None:
                bits.append(state.average_bits())
    model.eval()
    with torch.no_grad():
        out = model.module(test_set[0])
        acc = 100.0 * (out.argmax(1) == test_set[1]).double().mean().item()
        tloss = loss_fn(out, test_set[1]).item()
    digests = comm.allgather(param_digest(model.module))
    # Time per step: the slowest rank's mean (after the first, warm-up, step of the run).
    ms = comm.max(1e3 * sum(step_times[1:]) / max(1, len(step_times) - 1))
    avg_bits = sum(bits) / len(bits) if bits else 32.0
    final = state.layer_bits() if state is not None else None
    if state is not None:
        state.free()
    return acc, tloss, ms, digests, avg_bits, final


def main():
    """Trains every configuration, prints the table, runs the checks."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--train", type=int, default=8192)
    ap.add_argument("--test", type=int, default=4096)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb")
    ap.add_argument("--configs", default="fp32,cgx-4bit,adaptive",
                    help="fp32, adaptive, cgx-<b>bit[-ef|-noef][-plain] (the hook's defaults for b bits; error "
                         "feedback on/off; bucket 1024 and stochastic rounding)")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(1)  # several ranks share the cores
    comm = Ranks()
    rank, p = comm.rank, comm.size
    train_set, test_set = make_data(args.train, args.test, args.noise)
    n_params = sum(q.numel() for q in make_model().parameters())
    if rank == 0:
        print(f"train_ddp: {p} ranks, MLP {'-'.join(map(str, DIMS))} ({n_params} parameters), {args.train} training / "
              f"{args.test} held-out samples, {args.epochs} epochs, batch {args.batch} per rank, SGD lr {args.lr} "
              f"momentum 0.9, DDP over gloo (bucket_cap_mb {args.bucket_mb}); cgx hook: layer-wise plan, its defaults "
              f"(3-8 bits: bucket 1024, stochastic rounding; 1-2: bucket 128, nearest; 1: error feedback, its residual halved each step); adaptive: 2..8 bits, average <= 3.5, re-assigned every 16 steps")
        print(f"cgx_torch: {cgx_torch.build_info()}; torch {torch.__version__}; launched by {comm.launcher}")
        print(f"{'config':<17} {'test_acc':>9} {'test_loss':>10} {'bits/value':>11} {'step_ms':>9}  same params")
    results = {}
    ok = True
    for cfg in args.configs.split(","):
        acc, tloss, ms, digests, avg_bits, final = train(cfg, args, comm, train_set, test_set)
        same = len(set(digests)) == 1
        results[cfg] = (acc, same)
        if rank == 0:
            print(f"{cfg:<17} {acc:8.2f}% {tloss:10.4f} {avg_bits:11.2f} {ms:9.2f}  "
                  f"{'yes' if same else 'NO: ' + ' '.join(d[:8] for d in digests)}", flush=True)
            if cfg == "adaptive" and final:
                print(f"           adaptive, final bits per layer (by bucket; 0 = uncompressed): {final}")
        ok &= same
    if rank == 0:
        print("(bits/value: mean over steps of the plans' bits per value, uncompressed layers at 32, metadata "
              "excluded; step_ms: mean time of forward + backward (with the reduction) + optimizer step, slowest rank)")
        for cfg, (_, same) in results.items():
            print(f"check: identical parameters on all {p} ranks after training ({cfg}): {'ok' if same else 'FAILED'}")
        if "fp32" in results and "cgx-4bit" in results:
            a32, a4 = results["fp32"][0], results["cgx-4bit"][0]
            within = abs(a4 - a32) <= 1.0
            ok &= within
            print(f"check: cgx 4-bit within 1 pp of fp32 accuracy ({a4:.2f}% vs {a32:.2f}%): "
                  f"{'ok' if within else 'FAILED'}")
    ok = comm.bcast(ok)
    # DDP models hold the group in reference cycles: collect them (and drop cgx's references)
    # so that destroy_process_group releases the group and joins gloo's threads now; a gloo
    # thread still alive when Python shuts down can abort the process (torch 2.x).
    cgx_torch.free_plans()
    gc.collect()
    dist.destroy_process_group()
    if not ok and not args.no_check:
        sys.exit(1)


if __name__ == "__main__":
    main()
