#!/usr/bin/env python3
"""cgx_torch's device plans over MPI, as scripts/gpu-check runs them on a GPU machine.

    mpirun -np 2 python3 python/tests/test_mpi_device.py [--device cuda|cpu]

The ranks share the GPUs (rank % device count) and mpi4py's COMM_WORLD. CUDA tensors go
through the device plans (cgx::layerwise_device_plan over comm::mpi_device: compressed
bytes staged through pinned host memory, Debian's Open MPI not being CUDA-aware), CPU
tensors through the host plans. Checks (exit status 1 otherwise):
  - build_info() names an MPI library and, for --device cuda, "device plans: compiled";
  - float32 at 8 bits (nearest) and 4 bits (stochastic), float64 at 4 bits, with a
    partial last bucket: the result stays on the tensor's device, every rank holds the
    same bits, every element is within the SRA's error bound of the exact sum (float64,
    over MPI), and the bits are the host plan's for the same input on the CPU (the
    device kernels are the host's bodies: docs/layerwise.md);
  - a constant tensor at 4 bits and integer values at bits=0: exactly the sum.
--device cpu runs the same on CPU tensors: how the script itself, a carried mpi4py and
an MPI build of cgx_torch are checked without a GPU (scripts/gpu-rehearsal). Prints the
MPI library, mpi4py's folder and the libmpi file mapped, build_info(), one line per
check and "test_mpi_device: OK" at the end.
"""
import argparse
import hashlib
import os
import sys

import numpy
import mpi4py
import torch
from mpi4py import MPI

import cgx_torch

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def loaded_libmpi():
    """The file of the MPI library this process mapped (Linux's /proc/self/maps), or "?"."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libmpi" in line}
    except OSError:
        return "?"
    return ", ".join(sorted(paths)) or "?"


def digest(t):
    return hashlib.blake2b(t.detach().cpu().contiguous().numpy().tobytes(), digest_size=16).hexdigest()


def sra_bound(xs, s, bits, stochastic):
    """Per-bucket bound of the SRA (xs: every rank's bucket, s: the exact sum's): p - 1
    contributions quantized once, the sum once; one quantization errs < unit
    (stochastic) or <= unit / 2 (nearest)."""
    f = 1.0 if stochastic else 0.5
    levels = 2**bits - 1
    return f * ((xs.max(1).values - xs.min(1).values).sum() / levels + (s.max() - s.min()) / levels)


def check_compressed(device, dtype, bits, rounding, n=3 * 1024 + 100, bucket=1024):
    """Failures (strings) of one compressed reduction on device."""
    g = torch.Generator().manual_seed(100 + rank)
    x = (torch.randn(n, generator=g) * (1 + rank)).to(dtype)
    want = torch.from_numpy(comm.allreduce(x.numpy().astype("float64")))
    xs_all = torch.from_numpy(numpy.stack(comm.allgather(x.numpy()))).double()
    t = x.to(device, copy=True)  # x itself stays the input
    out = cgx_torch.allreduce_(t, bits=bits, rounding=rounding, bucket=bucket)
    cgx_torch.free_plans()  # the host plan's first call, as the device plan's was
    host = x.clone()
    cgx_torch.allreduce_(host, bits=bits, rounding=rounding, bucket=bucket)
    fails = []
    name = f"{str(dtype).replace('torch.', '')} {bits} bits {rounding}"
    if out is not t or t.device != device:
        fails.append(f"{name}: the result is not the tensor itself on {device}")
    if len(set(comm.allgather(digest(t)))) != 1:
        fails.append(f"{name}: the ranks hold different bits")
    err = (t.cpu().double() - want).abs()
    for b in range(0, n, bucket):
        bound = sra_bound(xs_all[:, b:b + bucket], want[b:b + bucket], bits, rounding == "stochastic")
        # the sum's range is the exact sum's up to the contributions' error: 10% slack
        if err[b:b + bucket].max() > 1.1 * bound + 1e-5:
            fails.append(f"{name}: bucket at {b}: error {err[b:b + bucket].max().item():.3g} > bound {bound.item():.3g}")
    if digest(t) != digest(host):
        diff = (t.cpu() != host).sum().item()
        fails.append(f"{name}: {diff} of {n} values differ from the host plan's")
    if rank == 0:
        print(f"{name} on {device}: max error {err.max().item():.3g}, "
              f"{'the host plan bits' if digest(t) == digest(host) else 'NOT the host plan bits'}", flush=True)
    return fails


def check_exact(device):
    """Failures of the reductions that must be exact."""
    fails = []
    t = torch.full((5000,), 0.5 * (rank + 1), device=device)
    cgx_torch.allreduce_(t, bits=4)
    if not torch.equal(t.cpu(), torch.full((5000,), 0.5 * size * (size + 1) / 2)):
        fails.append("a constant tensor at 4 bits is not exactly the sum")
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randint(-1000, 1000, (4096,), generator=g).float()
    want = torch.from_numpy(comm.allreduce(x.numpy().astype("float64"))).float()
    t = x.to(device, copy=True)
    cgx_torch.allreduce_(t, bits=0)
    if not torch.equal(t.cpu(), want):
        fails.append("bits=0 on integer values is not exactly the sum")
    if rank == 0:
        print(f"exact cases on {device}: {'ok' if not fails else 'FAILED'}", flush=True)
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    info = cgx_torch.build_info()
    if rank == 0:
        lib = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()  # Open MPI ends it with a NUL
        print(f"test_mpi_device: {size} ranks, {lib}, "
              f"mpi4py {mpi4py.__version__} from {os.path.dirname(mpi4py.__file__)}", flush=True)
        print(f"test_mpi_device: libmpi {loaded_libmpi()}", flush=True)
        print(f"test_mpi_device: {info}", flush=True)
    fails = []
    if not cgx_torch.mpi_compiled():
        fails.append("this build of cgx_torch has no MPI")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            fails.append("torch sees no CUDA device")
        if "device plans: compiled" not in info:
            fails.append("build_info() does not say 'device plans: compiled'")
    if not fails:
        if args.device == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        for dtype, bits, rounding in ((torch.float32, 8, "nearest"), (torch.float32, 4, "stochastic"),
                                      (torch.float64, 4, "stochastic")):
            fails += check_compressed(device, dtype, bits, rounding)
        fails += check_exact(device)
    fails = sorted(set(f for r in comm.allgather(fails) for f in r))
    if rank == 0:
        for f in fails:
            print("test_mpi_device: FAILED: " + f, flush=True)
        if not fails:
            print("test_mpi_device: OK", flush=True)
    cgx_torch.free_plans()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
