#!/usr/bin/env python3
"""DDP on device tensors through cgx's hook, as scripts/gpu-check runs it on a GPU machine.

    torchrun --standalone --nproc-per-node 2 python/tests/test_ddp_device.py [--device cuda|cpu]

The ranks share the GPUs (rank % device count: on a one-GPU machine both use cuda:0) and
DDP's gloo group. Every rank trains the same small MLP from the same initial weights
twice, on the same batches: with DDP's own allreduce (fp32) and with the cgx hook at 4
bits (under torchrun the hook stages CUDA buckets through the host, or, with
CGX_TORCH_DEVICE_TRANSPORT=cuda_ipc and a CUDA build, reduces them on the device over
comm::cuda_ipc set up through the job's Store; --expect-transport checks which).
Checks (exit status 1 otherwise):
  - the hook was given buckets on the device asked for, and returned them there;
  - every rank ends with bit-identical parameters, in each configuration;
  - both configurations lower the training loss, and cgx 4-bit ends within 10% of fp32's
    loss (4-bit gradients on this task: about 1% apart, docs/pytorch.md).
--device cpu runs the same on CPU tensors (how the script itself is tested without a GPU).
Prints one line per configuration and "test_ddp_device: OK" at the end.
"""
import argparse
import gc
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch

DIMS = (64, 512, 256, 10)


def make_model(device):
    """The same initial weights on every rank and in every configuration."""
    torch.manual_seed(11)
    layers = []
    for i in range(len(DIMS) - 1):
        layers.append(nn.Linear(DIMS[i], DIMS[i + 1]))
        if i < len(DIMS) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(device)


def digest(model):
    h = hashlib.blake2b(digest_size=16)
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(cfg, device, rank, size, steps, seen, transports):
    model = DDP(make_model(device), device_ids=[device.index] if device.type == "cuda" else None)
    state = None
    if cfg == "cgx4":
        state = cgx_torch.CGXState(bits=4, path="compressed")  # the device plans themselves, not the measured choice

        def hook(st, bucket):
            seen.add(str(cgx_torch.ddp._bucket_buffer(bucket).device.type))
            fut = cgx_torch.cgx_hook(st, bucket)

            def back(f):
                out = f.value()
                seen.add("out:" + str(out.device.type))
                return out

            return fut.then(back)

        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(5)  # the same data everywhere; each rank its share
    w = torch.randn(DIMS[0], DIMS[-1], generator=g)
    losses = []
    for _ in range(steps):
        x = torch.randn(32 * size, DIMS[0], generator=g)
        y = (x @ w).argmax(1)
        xs, ys = x[rank * 32:(rank + 1) * 32].to(device), y[rank * 32:(rank + 1) * 32].to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        opt.step()
        t = loss.detach().reshape(1).cpu()
        dist.all_reduce(t)
        losses.append(t.item() / size)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out = [None] * size
    dist.all_gather_object(out, digest(model.module))
    if state is not None:
        transports.add(str(getattr(state.group, "device_transport", None) if device.type == "cuda" else "n/a"))
        state.free()
    return losses, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--expect-transport", default="",
                    help="the device transport the hook must have used for CUDA buckets (e.g. cuda_ipc; "
                         "'None': staged through the host)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("test_ddp_device: torch sees no CUDA device", flush=True)
            return 1
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    failures = []
    res = {}
    for cfg in ("fp32", "cgx4"):
        seen = set()
        transports = set()
        losses, digests = train(cfg, device, rank, size, args.steps, seen, transports)
        res[cfg] = losses
        if rank == 0:
            print(f"{cfg}: loss {losses[0]:.4f} -> {losses[-1]:.4f} ({args.steps} steps, {size} ranks, {device})",
                  flush=True)
        if len(set(digests)) != 1:
            failures.append(f"{cfg}: the ranks' parameters differ")
        if not losses[-1] < losses[0]:
            failures.append(f"{cfg}: the loss did not go down ({losses[0]:.4f} -> {losses[-1]:.4f})")
        if cfg == "cgx4" and seen != {device.type, "out:" + device.type}:
            failures.append(f"cgx4: the hook saw buckets on {sorted(seen)}, expected {device.type} in and out")
        if cfg == "cgx4" and args.expect_transport and transports != {args.expect_transport}:
            failures.append(f"cgx4: the hook's group reduced CUDA buckets over {sorted(transports)}, "
                            f"not {args.expect_transport} (CGX_TORCH_DEVICE_TRANSPORT)")
        if cfg == "cgx4" and rank == 0 and device.type == "cuda":
            print(f"cgx4: CUDA buckets over {sorted(transports)} (None: staged through the host)", flush=True)
    if abs(res["cgx4"][-1] - res["fp32"][-1]) > 0.1 * res["fp32"][-1]:
        failures.append(f"cgx4's final loss {res['cgx4'][-1]:.4f} is not within 10% of fp32's {res['fp32'][-1]:.4f}")
    for f in failures:
        if rank == 0:
            print("test_ddp_device: FAILED: " + f, flush=True)
    if rank == 0 and not failures:
        print("test_ddp_device: OK", flush=True)
    cgx_torch.free_plans()
    gc.collect()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
