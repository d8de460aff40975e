#!/usr/bin/env python3
"""Tests of cgx_torch's `cgx` torch.distributed backend (torch >= 2.x), under torchrun at
any number of ranks >= 2:

    torchrun --standalone --nproc-per-node 3 python/tests/test_backend.py

dist.init_process_group("cgx"): all_reduce of float32/float64/float16 tensors (SUM, AVG)
compressed, within the SRA's bound, the same bits on every rank; reduce_scatter_tensor
compressed, within the bound; every other op and dtype exact (gloo); the environment's
settings (CGX_COMPRESSION_QUANTIZATION_BITS ...) and configure(); settings that differ
between ranks raise on every rank; DDP over the backend trains with identical parameters
on every rank. Prints one line per test on rank 0; exit status 1 when one failed.
"""
import gc
import hashlib
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch
import cgx_torch.backend

# These tests check the compressed path itself (its bound, its bits, its settings): the
# measured choice (CGX_PATH=auto, the default) could send a call exact on this fast link.
# It is tested by test_path_choice.py.
os.environ["CGX_PATH"] = "compressed"

dist.init_process_group("cgx")
rank, p = dist.get_rank(), dist.get_world_size()
tests = []


def test(f):
    tests.append(f)
    return f


def gather(x):
    """x from every rank (objects)."""
    out = [None] * p
    dist.all_gather_object(out, x)
    return out


def same_everywhere(t):
    """Whether every rank holds the same bits in t."""
    h = hashlib.blake2b(t.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()
    return len(set(gather(h))) == 1


def exact_sum(x):
    """The float64 sum over the ranks of x (gathered, summed here)."""
    return sum(torch.from_numpy(a) for a in gather(x.double().numpy()))


def within_bound(got, xs, want, bits, bucket=1024):
    """|got - want| within the SRA's bound per bucket (p - 1 contributions quantized once,
    the sum once; stochastic: < one unit each), 10% slack for the sum's own range."""
    levels = 2**bits - 1
    err = (got.double() - want).abs()
    for b in range(0, want.numel(), bucket):
        c = torch.stack([x[b:b + bucket].double() for x in xs])
        s = want[b:b + bucket]
        bound = ((c.max(1).values - c.min(1).values).sum() + (s.max() - s.min())) / levels
        if err[b:b + bucket].max() > 1.1 * bound + 1e-5:
            return False
    return True


@test
def backend_is_cgx():
    """init_process_group("cgx") gives the cgx backend."""
    assert dist.get_backend() == "cgx", dist.get_backend()


@test
def allreduce_compressed_within_bound():
    """float32 SUM at the default 4 bits: within the bound, not exact, the same bits everywhere;
    AVG the sum / p; float64 and float16 too."""
    n = 6 * 1024 + 77
    x = torch.randn(n, generator=torch.Generator().manual_seed(10 + rank)) * (1 + rank)
    xs = [torch.from_numpy(a) for a in gather(x.numpy())]
    want = exact_sum(x)
    t = x.clone()
    dist.all_reduce(t)
    assert same_everywhere(t), "ranks hold different bits"
    assert within_bound(t, xs, want, 4), (t.double() - want).abs().max()
    assert (t.double() - want).abs().max() > 1e-4, "not compressed"
    a = x.clone()
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    assert same_everywhere(a) and within_bound(a * p, xs, want, 4)
    d = x.double()
    dist.all_reduce(d)
    assert d.dtype == torch.float64 and within_bound(d, xs, want, 4)
    h = x.half()
    dist.all_reduce(h)
    assert h.dtype == torch.float16 and same_everywhere(h)
    assert (h.double() - want).abs().max() <= 2 * (want.max() - want.min()) / 15 + 0.01 * want.abs().max()


@test
def reduce_scatter_tensor_compressed():
    """reduce_scatter_tensor (SUM): this rank's shard of the compressed sum, within the bound."""
    m = 2048
    x = torch.randn(p * m, generator=torch.Generator().manual_seed(20 + rank))
    xs = [torch.from_numpy(a) for a in gather(x.numpy())]
    want = exact_sum(x)
    out = torch.empty(m)
    dist.reduce_scatter_tensor(out, x)
    mine = want[rank * m:(rank + 1) * m]
    shard = [c[rank * m:(rank + 1) * m] for c in xs]
    assert within_bound(out, shard, mine, 4), (out.double() - mine).abs().max()
    assert (out.double() - mine).abs().max() > 1e-4, "not compressed"
    # the reduce-scatter plan itself: its own values exact, the others' each within half a
    # quantization step of their bucket (nearest rounding would be tighter; stochastic: one step)
    own = x[rank * m:(rank + 1) * m].double()
    err = (out.double() - mine).abs()
    step = sum(float(c.max() - c.min()) / 15 for r, c in enumerate(shard) if r != rank)
    assert err.max() <= step + 1e-5 * want.abs().max(), (err.max(), step)
    if p > 1:
        assert not torch.equal(out.double(), own), "the others' contributions were not added"
    # AVG: the same shard divided by the ranks
    avg = torch.empty(m)
    dist.reduce_scatter_tensor(avg, x, op=dist.ReduceOp.AVG)
    assert (avg.double() - mine / p).abs().max() <= (step + 1e-5 * want.abs().max()) / p + 1e-6


@test
def other_ops_exact():
    """Integers, MAX, broadcast, all_gather, barrier: gloo's exact results."""
    i = torch.arange(5000, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(i)
    assert torch.equal(i, torch.arange(5000, dtype=torch.int64) * (p * (p + 1) // 2))
    f = torch.full((3000,), float(rank))
    dist.all_reduce(f, op=dist.ReduceOp.MAX)
    assert torch.all(f == p - 1)
    b = torch.full((100,), float(rank))
    dist.broadcast(b, src=p - 1)
    assert torch.all(b == p - 1)
    outs = [torch.empty(10) for _ in range(p)]
    dist.all_gather(outs, torch.full((10,), float(rank)))
    assert all(torch.all(o == r) for r, o in enumerate(outs))
    small = torch.full((10,), 1.5)  # under CGX_COMPRESSION_MINIMAL_SIZE: exact
    dist.all_reduce(small)
    assert torch.all(small == 1.5 * p)
    dist.barrier()


@test
def reduce_scatter_exact_fallback():
    """reduce_scatter_tensor that cgx does not compress goes to gloo exact: integers (SUM),
    MAX, and AVG at 32 bits (agreed, then exact on the worker). It hung before: its
    completion waited on gloo's work inside the thread that completes it."""
    want_sum = torch.arange(6 * p, dtype=torch.float64) * sum(range(1, p + 1))
    for dtype, op in ((torch.int64, dist.ReduceOp.SUM), (torch.float32, dist.ReduceOp.MAX)):
        o = torch.empty(6, dtype=dtype)
        dist.reduce_scatter_tensor(o, torch.arange(6 * p, dtype=dtype) * (rank + 1), op=op)
        w = want_sum if op == dist.ReduceOp.SUM else torch.arange(6 * p, dtype=torch.float64) * p
        assert torch.equal(o.double(), w[rank * 6:(rank + 1) * 6]), (dtype, o)
    os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "32"
    try:
        o = torch.empty(6)
        dist.reduce_scatter_tensor(o, torch.arange(6.0 * p) * (rank + 1), op=dist.ReduceOp.AVG)
        assert torch.allclose(o.double(), want_sum[rank * 6:(rank + 1) * 6] / p), o
    finally:
        del os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"]


@test
def settings_from_environment_and_configure():
    """configure(bits=8) applies from the next call on (smaller error than 4 bits); the
    environment is read at every call, as torch_cgx reads it:
    CGX_COMPRESSION_QUANTIZATION_BITS=32 means uncompressed (exact on integer values), and
    unsetting it brings the 4-bit default back; a new group sees the same."""
    x = torch.randn(8192, generator=torch.Generator().manual_seed(30 + rank))
    want = exact_sum(x)
    t4 = x.clone()
    dist.all_reduce(t4)
    cgx_torch.backend.configure(bits=8)
    t8 = x.clone()
    dist.all_reduce(t8)
    cgx_torch.backend.reset()
    e4, e8 = (t4.double() - want).abs().max(), (t8.double() - want).abs().max()
    assert e8 < e4 / 4, (e4, e8)
    z = torch.randint(-100, 100, (8192,), generator=torch.Generator().manual_seed(rank)).float()
    zw = exact_sum(z)
    for g in (None, dist.new_group(backend="cgx")):
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "32"
        z0 = z.clone()
        dist.all_reduce(z0, group=g)
        assert torch.equal(z0.double(), zw)
        del os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"]
        z4 = z.clone()
        dist.all_reduce(z4, group=g)
        assert not torch.equal(z4.double(), zw)  # compressed again: 4 bits are not exact here
        assert within_bound(z4, gather(z), zw, 4)


@test
def width_defaults_as_the_hook():
    """One width, one default: at 2 bits the backend takes the hook's measured bucket (128)
    and rounding (nearest), and the bucket sizes torch_cgx's scripts use (64, 2048) are
    accepted."""
    assert cgx_torch.backend.settings().bucket == 1024
    os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "2"
    try:
        s = cgx_torch.backend.settings()
        assert (s.bits, s.bucket, s.rounding) == (2, 128, "nearest"), s
        assert (s.bucket, s.rounding) == (cgx_torch.CGXState(bits=2).settings.bucket,
                                          cgx_torch.CGXState(bits=2).settings.rounding)
        x = torch.randn(5000, generator=torch.Generator().manual_seed(40 + rank))
        want = exact_sum(x)
        for bucket in (64, 2048):
            os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = str(bucket)
            t = x.clone()
            dist.all_reduce(t)
            assert within_bound(t, gather(x), want, 2, bucket), bucket
            assert same_everywhere(t)
        os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = "100"  # not compiled in: refused, naming the sizes
        try:
            dist.all_reduce(torch.ones(5000))
        except ValueError as e:
            assert "bucket must be one of" in str(e), str(e)
        else:
            raise AssertionError("bucket 100 was not refused")
        del os.environ["CGX_COMPRESSION_BUCKET_SIZE"]
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "64"  # only 32 means uncompressed
        try:
            cgx_torch.backend.settings()
        except ValueError as e:
            assert "bits must be" in str(e), str(e)
        else:
            raise AssertionError("bits 64 was not refused")
    finally:
        os.environ.pop("CGX_COMPRESSION_QUANTIZATION_BITS", None)
        os.environ.pop("CGX_COMPRESSION_BUCKET_SIZE", None)


@test
def mismatched_settings_raise_everywhere():
    """Ranks with different bits: the first all_reduce raises on every rank, naming the cause."""
    cgx_torch.backend.configure(bits=8 if rank == 0 else 4)
    try:
        dist.all_reduce(torch.ones(5000))
    except Exception as e:  # noqa: BLE001 (torch re-raises the backend's error as its own type)
        assert "different settings" in str(e), str(e)
    else:
        raise AssertionError("no error")
    finally:
        cgx_torch.backend.reset()
    # one rank uncompressed (torch_cgx's 32): it meets the agreement too, so every rank
    # raises at once (an exact allreduce on its side would wait for the group's timeout)
    for bits, n, reduce_scatter in ((0, 6000, False), (4, 6000, True)):
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "32" if rank == 0 else str(bits or 4)
        t0 = time.monotonic()
        try:
            if reduce_scatter:
                dist.reduce_scatter_tensor(torch.empty(n // p * 1), torch.ones(n // p * p))
            else:
                dist.all_reduce(torch.ones(n))
        except Exception as e:  # noqa: BLE001
            assert "different settings" in str(e), str(e)
        else:
            raise AssertionError("no error")
        finally:
            del os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"]
        assert time.monotonic() - t0 < 60, time.monotonic() - t0
    # one rank's environment gives settings the plans do not take: it raises its error, the
    # others that a peer's settings are invalid, at once
    if rank == 0:
        os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = "100"
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(6000))
    except Exception as e:  # noqa: BLE001
        want = "bucket must be one of" if rank == 0 else "another rank's `cgx` settings are invalid"
        assert want in str(e), str(e)
    else:
        raise AssertionError("no error")
    finally:
        os.environ.pop("CGX_COMPRESSION_BUCKET_SIZE", None)
    assert time.monotonic() - t0 < 60, time.monotonic() - t0
    t = torch.ones(5000)  # the group goes on
    dist.all_reduce(t)
    assert torch.all(t == p)


@test
def asynchronous_in_issue_order():
    """Compressed calls return a Work at once and complete in issue order on the worker,
    interleaved with exact calls (all-gathers, integer sums) that go to gloo directly:
    every result right, on every rank."""
    xs = [torch.randn(4096 + 512 * i, generator=torch.Generator().manual_seed(50 + 7 * rank + i)) for i in range(6)]
    wants = [exact_sum(x) for x in xs]
    ts = [x.clone() for x in xs]
    works, exact = [], []
    for i, t in enumerate(ts):
        works.append(dist.all_reduce(t, async_op=True))
        k = torch.full((3,), rank + i, dtype=torch.int64)
        exact.append((k, dist.all_reduce(k, async_op=True), sum(range(p)) + p * i))
    for w in works:
        w.wait()
    for t, x, want in zip(ts, xs, wants):
        assert within_bound(t, gather(x), want, 4)
        assert same_everywhere(t)
    for k, w, want in exact:
        w.wait()
        assert torch.all(k == want), (k, want)


@test
def coalesced_and_dtensor_ops():
    """The ops DTensor and FSDP2 issue: all_gather_into_tensor (single and coalesced,
    exact), reduce_scatter_tensor coalesced (compressed, AVG), DTensor's full_tensor()."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    a, b = torch.full((6,), float(rank)), torch.full((4,), 10.0 * rank)
    oa, ob = torch.empty(6 * p), torch.empty(4 * p)
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(oa, a)
        dist.all_gather_into_tensor(ob, b)
    cm.wait()
    assert torch.equal(oa, torch.arange(p).float().repeat_interleave(6))
    assert torch.equal(ob, 10.0 * torch.arange(p).float().repeat_interleave(4))
    xs = [torch.randn(p * 2048, generator=torch.Generator().manual_seed(60 + rank + 10 * i)) for i in range(2)]
    outs = [torch.empty(2048) for _ in xs]
    with _coalescing_manager(async_ops=True) as cm:
        for o, x in zip(outs, xs):
            dist.reduce_scatter_tensor(o, x, op=dist.ReduceOp.AVG)
    cm.wait()
    for o, x in zip(outs, xs):
        want = (exact_sum(x) / p)[rank * 2048:(rank + 1) * 2048]
        assert (o.double() - want).abs().max() < 0.5, (o.double() - want).abs().max()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (p,))
    full = torch.arange(p * 8 * 3, dtype=torch.float32).reshape(p * 8, 3)
    d = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(d.full_tensor(), full)


@test
def device_mesh_sub_groups():
    """A 2-D DeviceMesh over the `cgx` world (even sizes): each dimension's group is a cgx
    group of its own (extended API), and its all_reduce is compressed within the bound
    over that group's ranks only."""
    if p % 2:
        return
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, p // 2), mesh_dim_names=("dp", "tp"))
    for name in ("dp", "tp"):
        g = mesh.get_group(name)
        assert dist.get_backend(g) == "cgx", dist.get_backend(g)
        x = torch.randn(8192, generator=torch.Generator().manual_seed(70 + rank))
        xs = [torch.empty_like(x) for _ in range(g.size())]
        dist.all_gather(xs, x, group=g)
        want = torch.stack([y.double() for y in xs]).sum(0)
        dist.all_reduce(x, group=g)
        if g.size() > 1:
            assert within_bound(x, xs, want, 4), name
        else:
            assert torch.equal(x.double(), want)


@test
def ddp_over_the_backend():
    """DDP over the cgx backend: a few SGD steps, identical parameters on every rank, the
    loss goes down."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))
    m = DDP(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 32, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for q in model.parameters():
        assert same_everywhere(q.detach())
    assert losses[-1] < losses[0] - 0.1, losses


def main():
    failed = 0
    for f in tests:
        try:
            f()
            ok = True
        except Exception:  # noqa: BLE001
            ok = False
            traceback.print_exc()
        all_ok = all(gather(ok))
        failed += not all_ok
        if rank == 0:
            print(f"{'ok    ' if all_ok else 'FAILED'} {f.__name__} ({p} ranks)", flush=True)
    if rank == 0:
        print(f"cgx backend tests: {len(tests) - failed} passed, {failed} failed ({p} ranks, torch {torch.__version__})",
              flush=True)
    # DDP models hold the group in reference cycles: collect them (and drop cgx's references)
    # so that destroy_process_group releases the group and joins gloo's threads now; a gloo
    # thread still alive when Python shuts down can abort the process (torch 2.x).
    gc.collect()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
