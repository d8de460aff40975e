#!/usr/bin/env python3
"""Multi-rank tests of cgx_torch, under mpirun (cgx over MPI) or under torchrun (cgx over
torch.distributed's own gloo group: no MPI needed), any number of ranks >= 1:

    mpirun -np 3 python3 python/tests/test_cgx_torch.py
    torchrun --standalone --nproc-per-node 3 python/tests/test_cgx_torch.py

allreduce_: exact on constant and on integer-valued uncompressed data, within the SRA's
error bound at 8 and 4 bits, the same bits on every rank, float64, average, error
feedback, adaptive; float16/bfloat16 through float32 (bit for bit), non-finite buckets;
integers, bool and complex exactly; the errors (dtype, non-contiguous, bad settings, settings or shapes
that differ between ranks: raised on every rank); the DDP hook against DDP's own
allreduce, its layer-wise defaults, and mismatched hook settings. Under torchrun also the
process group transport's failures: a wait limit (the group's timeout) raised on every
rank, and a rank that leaves. CGX_TEST_NO_MPI=1: also checks that neither the extension
nor the process loaded MPI. Prints one line per test on rank 0 and exits 1 when any rank
failed one.
"""
import datetime
import gc
import hashlib
import os
import pickle
import sys
import time
import traceback
import warnings

import numpy
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch

TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ or ("LOCAL_RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ)


class TorchComm:
    """What these tests ask of a communicator, over torch.distributed (torchrun)."""

    def __init__(self):
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def allgather(self, obj):
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def allreduce(self, x):
        return sum(self.allgather(x))

    def all(self, ok):
        return all(self.allgather(bool(ok)))


class MPIComm:
    """The same over mpi4py (mpirun); torch.distributed's group set up from it."""

    def __init__(self):
        from mpi4py import MPI

        self.MPI, self.c = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.c.rank, self.c.size
        cgx_torch.init_process_group_from_mpi(self.c)

    def allgather(self, obj):
        return self.c.allgather(obj)

    def allreduce(self, x):
        return self.c.allreduce(x)

    def all(self, ok):
        return self.c.allreduce(bool(ok), op=self.MPI.LAND)


comm = TorchComm() if TORCHRUN else MPIComm()
rank, p = comm.rank, comm.size
tests = []


def test(f):
    """Registers a test function."""
    tests.append(f)
    return f


def digest(t):
    """A digest of the tensor's bytes (half precision as its 16-bit words: numpy has no bfloat16)."""
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)
    return hashlib.blake2b(t.contiguous().numpy().tobytes(), digest_size=16).hexdigest()


def same_everywhere(t):
    """Whether every rank holds the same bits in t (collective)."""
    return len(set(comm.allgather(digest(t)))) == 1


def exact_sum(t):
    """The sum of t over the ranks in float64 (MPI), in t's dtype."""
    return torch.from_numpy(comm.allreduce(t.numpy().astype("float64"))).to(t.dtype)


def raises(exc, f, match=None):
    """Asserts that f() raises exc (whose message contains match); returns the exception."""
    try:
        f()
    except exc as e:
        assert match is None or match in str(e), f"message {str(e)!r} lacks {match!r}"
        return e
    raise AssertionError(f"{exc.__name__} not raised")


def sra_bound(xs_min, xs_max, s_min, s_max, bits, stochastic):
    """Per-bucket bound of the SRA: p - 1 contributions quantized once, the sum once;
    one quantization errs < unit (stochastic) or <= unit / 2 (nearest)."""
    f = 1.0 if stochastic else 0.5
    levels = 2**bits - 1
    return f * ((xs_max - xs_min).sum(0) / levels + (s_max - s_min) / levels)


@test
def constant_buckets_exact():
    """A constant bucket is reproduced exactly at 1, 4 and 8 bits."""
    for bits in (1, 4, 8):
        t = torch.full((5000,), 0.5 * (rank + 1))
        cgx_torch.allreduce_(t, bits=bits)
        assert torch.all(t == 0.25 * p * (p + 1)), (bits, t[:4])


@test
def uncompressed_equals_mpi_on_integers():
    """bits=0 equals the MPI sum on integer-valued data."""
    g = torch.Generator().manual_seed(rank)
    t = torch.randint(-1000, 1000, (3001,), generator=g).float()
    want = exact_sum(t)
    cgx_torch.allreduce_(t, bits=0)
    assert torch.equal(t, want)


@test
def within_sra_bound_and_same_bits():
    """Every element within the SRA's bound; the same bits on every rank."""
    n, k = 8 * 1024 + 100, 1024  # a partial last bucket
    for bits, rounding in ((8, "nearest"), (4, "stochastic"), (2, "stochastic")):
        g = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(n, generator=g) * (1 + rank)
        want = exact_sum(x)
        xs_all = torch.from_numpy(numpy.stack(comm.allgather(x.numpy()))).double()
        t = x.clone()
        cgx_torch.allreduce_(t, bits=bits, rounding=rounding)
        assert same_everywhere(t), "ranks hold different bits"
        err = (t.double() - want.double()).abs()
        for b in range(0, n, k):
            xs = xs_all[:, b:b + k]
            s = want[b:b + k].double()
            bound = sra_bound(xs.min(1).values, xs.max(1).values, s.min(), s.max(), bits, rounding == "stochastic")
            # the sum's range is that of the exact sum up to the contributions' error: 10% slack
            assert err[b:b + k].max() <= 1.1 * bound + 1e-5, (bits, b, err[b:b + k].max().item(), bound.item())


@test
def float64_and_average():
    """float64 tensors, and average=True divides by the ranks; returns the tensor."""
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(4096, dtype=torch.float64, generator=g)
    want = exact_sum(x) / p
    t = x.clone()
    out = cgx_torch.allreduce_(t, bits=8, average=True)
    assert out is t and t.dtype == torch.float64
    assert (t - want).abs().max() < 0.05 * want.abs().max() + 1e-12


@test
def small_tensor_uncompressed():
    """Tensors under min_compressed values travel uncompressed (exact)."""
    t = torch.arange(100, dtype=torch.float32) * (rank + 1)  # < min_compressed: exact
    cgx_torch.allreduce_(t, bits=2)
    assert torch.equal(t, torch.arange(100, dtype=torch.float32) * (p * (p + 1) // 2))


@test
def error_feedback_and_adaptive_run():
    """Error feedback and adaptive bits over 20 calls: finite, the same on every rank."""
    g = torch.Generator().manual_seed(rank)
    for kw in ({"error_feedback": True, "bits": 2}, {"adaptive": True}):
        for _ in range(20):
            t = torch.randn(4096, generator=g)
            cgx_torch.allreduce_(t, **kw)
            assert torch.isfinite(t).all() and same_everywhere(t)


@test
def error_feedback_decay():
    """ef_decay: 0 carries no residual (the bits of nearest rounding without error
    feedback, call after call), 0.5 differs from the whole residual from the second call,
    the same bits on every rank; out of [0, 1]: ValueError; ranks that differ: MismatchError."""
    g = torch.Generator().manual_seed(50 + rank)
    xs = [torch.randn(6000, generator=g) for _ in range(4)]
    out = {}
    for name, kw in (("nearest", dict(rounding="nearest")), ("d0", dict(error_feedback=True, ef_decay=0.0)),
                     ("d05", dict(error_feedback=True, ef_decay=0.5)), ("d1", dict(error_feedback=True))):
        out[name] = []
        for x in xs:
            t = x.clone()
            cgx_torch.allreduce_(t, bits=2, bucket=128, **kw)
            assert same_everywhere(t), name
            out[name].append(t)
    for a, b in zip(out["nearest"], out["d0"]):
        assert torch.equal(a, b)
    if p > 1:
        assert any(not torch.equal(a, b) for a, b in zip(out["d05"][1:], out["d1"][1:]))
        assert any(not torch.equal(a, b) for a, b in zip(out["d05"][1:], out["nearest"][1:]))
    raises(ValueError, lambda: cgx_torch.allreduce_(torch.ones(4096), error_feedback=True, ef_decay=-0.1), "ef_decay")
    if p > 1:
        t = torch.ones(5000)  # a shape no earlier test used: no rank has a cached plan (checked when built)
        raises(cgx_torch.MismatchError,
               lambda: cgx_torch.allreduce_(t, bits=2, error_feedback=True, ef_decay=0.5 if rank == 0 else 1.0))
        assert torch.all(t == 1)


@test
def error_feedback_contributions():
    """ef_sum=False: the error of this rank's contributions fed back, not that of the sums
    it quantizes as owner: the first call's bits as with ef_sum=True (no residual yet),
    later ones differ (p > 1), the same bits on every rank; not a bool: ValueError; ranks
    that differ: MismatchError, the tensor untouched."""
    g = torch.Generator().manual_seed(70 + rank)
    xs = [torch.randn(6003, generator=g) for _ in range(4)]  # a shape of its own: fresh plans
    out = {}
    for ef_sum in (True, False):
        out[ef_sum] = []
        for x in xs:
            t = x.clone()
            cgx_torch.allreduce_(t, bits=2, error_feedback=True, ef_sum=ef_sum)
            assert same_everywhere(t), ef_sum
            out[ef_sum].append(t)
    assert torch.equal(out[True][0], out[False][0])
    if p > 1:
        assert any(not torch.equal(a, b) for a, b in zip(out[True][1:], out[False][1:]))
    raises(ValueError, lambda: cgx_torch.allreduce_(torch.ones(4096), error_feedback=True, ef_sum="no"), "ef_sum")
    if p > 1:
        t = torch.ones(5001)  # a shape no earlier test used: no rank has a cached plan
        raises(cgx_torch.MismatchError,
               lambda: cgx_torch.allreduce_(t, bits=2, error_feedback=True, ef_sum=rank == 0))
        assert torch.all(t == 1)


@test
def half_precision_through_float32():
    """float16 and bfloat16: the float32 reduction of the same values, rounded once into
    the dtype (so the float32 bound holds up to that rounding); the same bits on every
    rank; a bucket holding an inf is non-finite everywhere; a float16 sum past 65504 is inf."""
    n = 4096 + 100
    for dt in (torch.float16, torch.bfloat16):
        g = torch.Generator().manual_seed(200 + rank)
        x = (torch.randn(n, generator=g) * (1 + rank)).to(dt)
        ref = x.float()
        cgx_torch.allreduce_(ref, bits=8, rounding="nearest", average=True)
        t = x.clone()
        out = cgx_torch.allreduce_(t, bits=8, rounding="nearest", average=True)
        assert out is t and t.dtype == dt
        assert torch.equal(t, ref.to(dt)), (dt, (t.float() - ref).abs().max().item())
        assert same_everywhere(t)
        want = exact_sum(x.float()) / p
        assert (t.float() - want).abs().max() <= 0.02 * want.abs().max(), dt
        # an inf on rank 0: its bucket (values 1024..2047) non-finite on every rank, the others finite
        y = torch.ones(n, dtype=dt)
        if rank == 0:
            y[1500] = float("inf")
        cgx_torch.allreduce_(y, bits=4)
        if p > 1:  # (one rank: nothing is quantized)
            assert not torch.isfinite(y[1024:2048]).any() and torch.isfinite(y[:1024]).all(), dt
    big = torch.full((4096,), 60000.0, dtype=torch.float16)
    cgx_torch.allreduce_(big, bits=4)
    assert torch.isinf(big).all() if p > 1 else torch.all(big == 60000.0)


@test
def exact_dtypes_through_mpi():
    """Integers, bool (logical or) and complex are reduced exactly by MPI; average for complex."""
    g = torch.Generator().manual_seed(300 + rank)
    for dt in (torch.int64, torch.int32, torch.uint8, torch.int8):
        x = torch.randint(0, 3, (5000,), generator=g).to(dt)
        want = torch.from_numpy(numpy.sum(comm.allgather(x.numpy()), axis=0, dtype=x.numpy().dtype))
        t = x.clone()
        assert cgx_torch.allreduce_(t) is t and torch.equal(t, want), dt
    b = torch.zeros(100, dtype=torch.bool)
    b[rank] = True
    cgx_torch.allreduce_(b)
    assert b[:p].all() and not b[p:].any()
    c = torch.complex(torch.randint(-50, 50, (300,), generator=g).float(), torch.full((300,), float(rank)))
    want = torch.from_numpy(numpy.sum(comm.allgather(c.numpy()), axis=0)) / p
    cgx_torch.allreduce_(c, average=True)
    assert torch.allclose(c, want), (c - want).abs().max()


@test
def errors_dtype_contiguity_settings():
    """Local errors: dtypes, non-contiguous tensors, bad settings, a bad comm."""
    with warnings.catch_warnings():  # torch: "ComplexHalf support is experimental"
        warnings.simplefilter("ignore", UserWarning)
        c32 = torch.ones(4096, dtype=torch.complex32)
    raises(TypeError, lambda: cgx_torch.allreduce_(c32), "complex32")
    raises(ValueError, lambda: cgx_torch.allreduce_(torch.ones(4096, dtype=torch.int32), average=True), "divide")
    raises(ValueError, lambda: cgx_torch.allreduce_(torch.ones(64, 128).t()), "not contiguous")
    raises(ValueError, lambda: cgx_torch.allreduce_(torch.ones(4096), bits=9), "bits")
    raises(ValueError, lambda: cgx_torch.allreduce_(torch.ones(4096), bucket=100), "bucket")
    raises(ValueError, lambda: cgx_torch.allreduce_(torch.ones(4096), rounding="up"), "rounding")
    raises((TypeError, cgx_torch.CGXError), lambda: cgx_torch.allreduce_(torch.ones(4096), comm=42), "ProcessGroup")
    raises(TypeError, lambda: cgx_torch.CGXState(bits=4, adaptive="yes"), "adaptive")


@test
def errors_on_every_rank():
    """Collective errors: differing settings or shapes, one rank's bad tensor, check='call'."""
    if p == 1:
        return
    # settings that differ: every rank raises MismatchError, nothing moves
    t = torch.ones(4096)
    e = raises(cgx_torch.MismatchError, lambda: cgx_torch.allreduce_(t, bits=8 if rank == 0 else 4), "different")
    assert isinstance(e, RuntimeError)
    assert torch.all(t == 1)
    raises(cgx_torch.MismatchError, lambda: cgx_torch.allreduce_(torch.ones(2048 + 8 * rank)))
    # one rank's bad tensor: it raises its own error, the others say another rank's was bad
    bad = torch.ones(64, 128).t() if rank == p - 1 else torch.ones(128, 64)
    raises(ValueError, lambda: cgx_torch.allreduce_(bad, bits=3), "not contiguous" if rank == p - 1 else "another")
    # check="call" catches a shape change on one rank even with cached plans
    for _ in range(2):
        cgx_torch.allreduce_(torch.ones(3000), check="call")
    raises(cgx_torch.MismatchError,
           lambda: cgx_torch.allreduce_(torch.ones(3000 if rank else 3008), check="call"))


def model():
    """A small model: two weights over 1024 values, one of 320000, 1-D parameters and small ones."""
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40), nn.LayerNorm(40), nn.Linear(40, 8000))


def grads_after_step(hook_state, bucket_mb=0.005):
    """The gradients of 3 DDP steps, with the cgx hook of hook_state (None: DDP's allreduce)."""
    m = DDP(model(), bucket_cap_mb=bucket_mb)
    if hook_state is not None:
        m.register_comm_hook(hook_state, cgx_torch.cgx_hook)
    g = torch.Generator().manual_seed(rank)
    out = []
    for _ in range(3):  # DDP rebuilds its buckets after the first step
        m.zero_grad()
        m(torch.randn(16, 48, generator=g)).square().mean().backward()
        out.append([q.grad.clone() for q in m.parameters()])
    return out


@test
def ddp_hook_matches_ddp():
    """The hook against DDP's allreduce, overlap on and off, and its layer-wise defaults."""
    ref = grads_after_step(None)
    exact = grads_after_step(cgx_torch.CGXState(bits=0))
    for a, b in zip(ref, exact):
        for x, y in zip(a, b):
            assert torch.allclose(x, y, rtol=1e-5, atol=1e-7), (x - y).abs().max()
    st = cgx_torch.CGXState(bits=8, min_compressed=256, rounding="nearest")
    q8 = grads_after_step(st)
    for a, b in zip(ref, q8):
        for x, y in zip(a, b):
            assert (x - y).abs().max() <= 0.02 * x.abs().max() + 1e-7
            assert same_everywhere(y)
    # the same bits whether the hook reduces on its background thread or inside the hook
    q8_sync = grads_after_step(cgx_torch.CGXState(bits=8, min_compressed=256, rounding="nearest", overlap=False))
    for a, b in zip(q8, q8_sync):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    # one layer per parameter; one-dimensional ones (biases, the norm) and those under
    # min_compressed uncompressed, the others at 8 bits; several buckets
    bits = st.layer_bits()
    assert len(bits) >= 2, bits
    flat = sorted(b for v in bits.values() for b in v)
    # parameters: W1 3072, b1 64, W2 2560, b2 40, norm 40 + 40, W3 320000, b3 8000 (DDP's
    # first bucket takes b3 and W3: over 1 MB)
    assert flat == [0] * 5 + [8] * 3, bits


@test
def hook_low_bit_defaults_warmup_and_param_bits():
    """Issue 37: the hook's defaults per width (1-2 bits: buckets of 128, nearest rounding,
    at 1 bit error feedback; 3-8: 1024, stochastic; explicit settings win), warmup_steps (those steps exact, then
    compressed) and param_bits (a parameter's own width; 0: uncompressed), the same bits
    on every rank."""
    for bits, bucket, rounding, ef in ((1, 128, "nearest", True), (2, 128, "nearest", False),
                                       (3, 1024, "stochastic", False), (4, 1024, "stochastic", False),
                                       (8, 1024, "stochastic", False), (0, 1024, "stochastic", False)):
        s = cgx_torch.CGXState(bits=bits, overlap=False).settings
        assert (s.bucket, s.rounding, s.error_feedback) == (bucket, rounding, ef), (bits, s)
    s = cgx_torch.CGXState(bits=1, bucket=1024, rounding="stochastic", error_feedback=False, overlap=False).settings
    assert (s.bucket, s.rounding, s.error_feedback) == (1024, "stochastic", False), s
    # the error-feedback decay: 0.5 at 1-2 bits, whole at 3-8 (and 1.0 without error feedback); explicit wins
    for kw, decay in ((dict(bits=1), 0.5), (dict(bits=2, error_feedback=True), 0.5), (dict(bits=2), 1.0),
                      (dict(bits=3, error_feedback=True), 1.0), (dict(bits=1, ef_decay=1.0), 1.0),
                      (dict(bits=4, error_feedback=True, ef_decay=0.25), 0.25)):
        assert cgx_torch.CGXState(overlap=False, **kw).settings.ef_decay == decay, kw
    raises(ValueError, lambda: cgx_torch.CGXState(bits=1, ef_decay=1.5), "ef_decay")
    # the owner's sums fed back too unless told (docs/results/tasks-adamw.txt: no gain without)
    assert cgx_torch.CGXState(bits=1, overlap=False).settings.ef_sum is True
    assert cgx_torch.CGXState(bits=1, ef_sum=False, overlap=False).settings.ef_sum is False
    raises(ValueError, lambda: cgx_torch.CGXState(bits=2, warmup_steps=-1), "warmup_steps")
    raises(ValueError, lambda: cgx_torch.CGXState(bits=2, param_bits={torch.zeros(2): 9}), "param_bits")
    # warm-up: the first 2 steps are the exact sums (as bits=0), the third is compressed
    exact = grads_after_step(cgx_torch.CGXState(bits=0))
    warm_state = cgx_torch.CGXState(bits=2, warmup_steps=2, min_compressed=256)
    warm = grads_after_step(warm_state)
    for step in range(3):
        for x, y in zip(exact[step], warm[step]):
            assert same_everywhere(y)
            if step < 2:
                assert torch.equal(x, y), (step, (x - y).abs().max())
        if step == 2:
            assert any(not torch.equal(x, y) for x, y in zip(exact[step], warm[step]))
    assert warm_state.steps == 3 and warm_state.average_bits() < 32 and not warm_state._warm_plans
    assert warm_state.state_dict()["steps"] == 3
    # param_bits: W1 uncompressed, W3 at 8 bits, W2 at the state's 2
    net = model()
    m = DDP(net, bucket_cap_mb=0.005)
    st = cgx_torch.CGXState(bits=2, min_compressed=256, param_bits={net[0].weight: 0, net[4].weight: 8})
    m.register_comm_hook(st, cgx_torch.cgx_hook)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        m.zero_grad()
        m(torch.randn(16, 48, generator=g)).square().mean().backward()
        for q in m.parameters():
            assert same_everywhere(q.grad)
    flat = sorted(b for v in st.layer_bits().values() for b in v)
    assert flat == [0] * 6 + [2, 8], st.layer_bits()
    st.free()
    warm_state.free()


@test
def hook_half_precision_buckets():
    """The hook's reduction of float16 and bfloat16 buckets (CGXState.reduce, what
    cgx_hook runs): the float32 reduction of the same values, averaged, rounded once (8-bit
    nearest: deterministic), the same on every rank; under torch 2.x (whose gloo
    broadcasts bfloat16) also a bfloat16 model in DDP."""
    layers = [(0, 3000, False), (3000, 40, True), (3040, 5000, False)]
    for dt in (torch.float16, torch.bfloat16):
        g = torch.Generator().manual_seed(400 + rank)
        x = torch.randn(8040, generator=g).to(dt)
        ref = cgx_torch.CGXState(bits=8, min_compressed=256, rounding="nearest", overlap=False)
        want = ref.reduce(0, x.float(), layers)
        st = cgx_torch.CGXState(bits=8, min_compressed=256, rounding="nearest", overlap=False)
        t = x.clone()
        assert st.reduce(0, t, layers) is t and t.dtype == dt
        assert torch.equal(t, want.to(dt)) and same_everywhere(t), dt
        assert st.layer_bits() == {0: [8, 0, 8]}
    if int(torch.__version__.split(".")[0]) < 2:
        return
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40)).to(torch.bfloat16)
    local = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40)).to(torch.bfloat16)
    local.load_state_dict(net.state_dict())
    m = DDP(net)
    m.register_comm_hook(cgx_torch.CGXState(bits=8, min_compressed=256, rounding="nearest"), cgx_torch.cgx_hook)
    x = torch.randn(16, 48, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
    m(x).float().square().mean().backward()
    local(x).float().square().mean().backward()
    for q, r in zip(m.parameters(), local.parameters()):
        assert q.grad.dtype == torch.bfloat16 and same_everywhere(q.grad)
        want = exact_sum(r.grad.float()) / p
        assert (q.grad.float() - want).abs().max() <= 0.02 * want.abs().max() + 1e-2


@test
def checkpoint_resumes_with_the_same_bits():
    """A hook state saved after 3 reductions of a bucket (pickled, as torch.save does,
    and through state_dict) and restored into a fresh state reduces the next 3 with the
    bits of the uninterrupted state: stochastic rounding with adaptive bits (the call
    counter keys the random bits; the statistics decide the widths) and 2-bit error
    feedback (the residuals). A fresh state without the checkpoint does not. Under DDP
    the saved bucket's state is taken up when DDP's rebuilt layout recurs (the second
    step after a restart: DDP's first step lays its buckets out in parameter order)."""
    layers = [(0, 3000, False), (3000, 40, True), (3040, 5000, False), (8040, 2000, False)]
    g = torch.Generator().manual_seed(500 + rank)
    xs = [torch.randn(10040, generator=g) * (1 + torch.arange(10040) / 5000) for _ in range(6)]

    def reduce(state, batch):
        return [state.reduce(0, x.clone(), layers) for x in batch]

    configs = [dict(bits=4, adaptive=cgx_torch.AdaptiveOptions(interval=2), min_compressed=256, overlap=False),
               dict(bits=2, error_feedback=True, min_compressed=256, overlap=False)]
    for cfg in configs:
        a = cgx_torch.CGXState(**cfg)
        reduce(a, xs[:3])
        blob = pickle.dumps(a)
        sd = a.state_dict()
        want = reduce(a, xs[3:])
        loaded = cgx_torch.CGXState(**cfg)
        loaded.load_state_dict(sd)
        for restored in (pickle.loads(blob), loaded):
            got = reduce(restored, xs[3:])
            for w, r in zip(want, got):
                assert torch.equal(w, r), (cfg, (w - r).abs().max())
            assert restored.calls == a.calls and restored.layer_bits() == a.layer_bits()
            restored.free()
        fresh = reduce(cgx_torch.CGXState(**cfg), xs[3:])
        assert any(not torch.equal(w, r) for w, r in zip(want, fresh)), cfg
        a.free()
    # DDP: the saved state of the rebuilt buckets is taken up in the second step after a restart
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40), nn.LayerNorm(40), nn.Linear(40, 2000))
    x = torch.randn(16, 48, generator=g)
    saved = None
    for step in range(2):
        m = DDP(net)
        st = cgx_torch.CGXState(bits=4, min_compressed=256) if saved is None else pickle.loads(saved)
        m.register_comm_hook(st, cgx_torch.cgx_hook)
        for _ in range(3):
            m.zero_grad()
            m(x).square().mean().backward()
        if saved is None:
            calls = {i: p_.calls for i, (_, p_) in st.plans.items()}
            saved = pickle.dumps(st)
        else:
            assert not st._pending and {i: p_.calls for i, (_, p_) in st.plans.items()} == \
                {i: c + 2 for i, c in calls.items()}, (calls, st.plans)
        st.free()
    # a state_dict of other settings is refused, the state unchanged
    b = cgx_torch.CGXState(bits=8)
    raises(ValueError, lambda: b.load_state_dict(sd), "settings")
    raises(ValueError, lambda: b.load_state_dict({"version": 0}), "state_dict")
    assert b.calls == 0


@test
def ddp_hook_mismatch_raises_everywhere():
    """Hook settings that differ between ranks: backward() raises on every rank."""
    if p == 1:
        return
    m = DDP(model())
    m.register_comm_hook(cgx_torch.CGXState(bits=8 if rank == 0 else 4), cgx_torch.cgx_hook)
    loss = m(torch.randn(4, 48)).sum()
    raises(RuntimeError, loss.backward, "different settings")


@test
def no_mpi_when_asked():
    """CGX_TEST_NO_MPI=1 (the torchrun job of a build without MPI): neither the extension
    nor this process has loaded MPI."""
    if os.environ.get("CGX_TEST_NO_MPI") != "1":
        return
    assert TORCHRUN and not cgx_torch._C.mpi_compiled(), cgx_torch.build_info()
    assert "mpi4py" not in sys.modules and "mpi4py.MPI" not in sys.modules
    with open("/proc/self/maps") as f:
        loaded = [line.split()[-1] for line in f if "libmpi" in line]
    assert not loaded, f"an MPI library is loaded: {loaded[:1]}"


@test
def process_group_transport_same_bits_as_mpi():
    """Under mpirun: a plan over torch.distributed's group (its gloo send/recv) gives the
    same bits as the same plan over MPI."""
    if TORCHRUN or p == 1:
        return
    g = torch.Generator().manual_seed(500 + rank)
    x = torch.randn(1 << 18, generator=g)
    a, b = x.clone(), x.clone()
    cgx_torch.allreduce_(a, bits=4)
    cgx_torch.allreduce_(b, bits=4, comm=dist.distributed_c10d._get_default_group())
    assert torch.equal(a, b) and same_everywhere(b)


@test
def wait_limit_raises_on_every_rank():
    """Under torchrun, over a group with a 3 s timeout: rank 1 skips a call; its peers raise
    CGXError (timed out, naming the rank) within the timeout and the poll, and rank 1's
    next call raises too, having heard of it, instead of waiting."""
    if not TORCHRUN or p == 1:
        return
    g = dist.new_group(timeout=datetime.timedelta(seconds=3))
    x = torch.randn(50000, generator=torch.Generator().manual_seed(600 + rank))
    cgx_torch.allreduce_(x.clone(), bits=4, comm=g)  # builds the plan on every rank
    t0 = time.monotonic()
    if rank != 1:
        raises(cgx_torch.CGXError, lambda: cgx_torch.allreduce_(x.clone(), bits=4, comm=g), "timed out")
        took = time.monotonic() - t0
        assert took < 15, f"raised after {took:.1f} s (timeout 3 s)"
    else:
        time.sleep(6)  # its peers give up meanwhile
        e = raises(cgx_torch.CGXError, lambda: cgx_torch.allreduce_(x.clone(), bits=4, comm=g), "timed out")
        assert "rank 1" in str(e), str(e)
        assert time.monotonic() - t0 < 15


def rank_that_leaves():
    """Under torchrun, last: the last rank exits between two calls; every other rank's call
    raises CGXError within the group's timeout instead of hanging. Returns 1 on failure."""
    x = torch.randn(50000, generator=torch.Generator().manual_seed(700 + rank))
    cgx_torch.allreduce_(x.clone(), bits=4)
    dist.barrier()
    if rank == p - 1:
        sys.stdout.flush()
        os._exit(0)
    t0 = time.monotonic()
    try:
        cgx_torch.allreduce_(x.clone(), bits=4)
        ok, what = False, "the call returned"
    except cgx_torch.CGXError as e:
        ok, what = time.monotonic() - t0 < 60, str(e).splitlines()[0]
    print(f"{'ok    ' if ok else 'FAILED'} rank_that_leaves (rank {rank}, {time.monotonic() - t0:.1f} s): {what}",
          flush=True)
    sys.stdout.flush()
    os._exit(0 if ok else 1)  # the group is broken: no teardown


def main():
    """Runs every test on every rank; exit status 1 when one failed on some rank."""
    failed = 0
    for f in tests:
        try:
            f()
            ok = True
        except Exception:
            ok = False
            traceback.print_exc()
        all_ok = comm.all(ok)
        failed += not all_ok
        if rank == 0:
            print(f"{'ok    ' if all_ok else 'FAILED'} {f.__name__} ({p} ranks)", flush=True)
    if rank == 0:
        print(f"cgx_torch tests: {len(tests) - failed} passed, {failed} failed ({p} ranks, "
              f"{'torchrun: torch.distributed group' if TORCHRUN else 'mpirun: MPI'})", flush=True)
    if TORCHRUN and p > 2 and not failed:
        rank_that_leaves()  # exits
    # DDP models hold the group in reference cycles: collect them (and drop cgx's references)
    # so that destroy_process_group releases the group and joins gloo's threads now; a gloo
    # thread still alive when Python shuts down can abort the process (torch 2.x).
    cgx_torch.free_plans()
    gc.collect()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
