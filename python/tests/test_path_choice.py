#!/usr/bin/env python3
"""Tests of the measured choice between cgx's compressed path and the exact one (issue 50)
in the `cgx` backend and the DDP hook, under torchrun at any number of ranks >= 2:

    torchrun --standalone --nproc-per-node 2 python/tests/test_path_choice.py

The choice is cgx's own algorithm (cgx::detail::path_choice, bound as _C.PathChoice): per
size class of call, the first PathChoice.probe_calls (8) calls alternate exact and
compressed, the ranks agree on
the slowest rank's times and keep the faster path, re-checked every 16 to 256 calls.
Checked here: it is the default (CGX_PATH, min_compressed and torch_cgx's profile choose
the fixed rules); every rank takes the same path on every call and holds the same bits;
forcing either path works; the picks are readable; it picks the exact path when the
compressed one is made much slower, and the compressed one when the exact one is; the
hook's exact path never reorders with DDP's own collectives (find_unused_parameters).
Prints one line per test on rank 0; exit status 1 when one failed.
"""
import gc
import hashlib
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cgx_torch
import cgx_torch.backend as B
from cgx_torch import _C

os.environ.pop("CGX_PATH", None)
os.environ.pop("CGX_COMPRESSION_MINIMAL_SIZE", None)
dist.init_process_group("cgx")
rank, p = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
backend = B._backend_of(None)
tests = []
SLOW = 0.1  # seconds added to every call of the path a test makes slow
P = _C.PathChoice.probe_calls  # calls of a class before its first decision (cgx's path_choice)


def test(f):
    tests.append(f)
    return f


def gather(x):
    """x from every rank (objects)."""
    out = [None] * p
    dist.all_gather_object(out, x, group=gloo)
    return out


def digest(t):
    return hashlib.blake2b(t.detach().contiguous().view(torch.uint8).numpy().tobytes(), digest_size=12).hexdigest()


def same_everywhere(x):
    return len(set(json.dumps(v, sort_keys=True, default=str) for v in gather(x))) == 1


def raises(exc, f, text):
    try:
        f()
    except exc as e:
        assert text in str(e), (text, str(e))
        return
    raise AssertionError(f"no {exc.__name__} ({text})")


def class_of(nbytes):
    return _C.PathChoice.size_class(nbytes)


@test
def binding_is_cgx_path_choice():
    """_C.PathChoice is cgx::detail::path_choice: its schedule (native under 4096 bytes;
    probe_calls alternating, first native; then the pick), its agreement at decision
    points only, and pick_for."""
    c = _C.PathChoice()
    assert _C.PathChoice.measured_floor_bytes == 4096 and _C.PathChoice.first_interval == 16
    assert not c.compress_next(4095)
    agreed = []

    def agree(v):
        agreed.append(list(v))
        return [v[0], v[1]]

    seq = []
    for k in range(P + 16 + 2):
        comp = c.compress_next(8192)
        seq.append(comp)
        # native 1 ms, compressed 3 ms: the native path wins
        c.record(8192, comp, 3_000_000 if comp else 1_000_000, agree)
    assert seq[:P] == [False, True] * (P // 2), seq
    assert seq[P:P + 16] == [False] * 16 and seq[P + 16:] == [True, True], seq  # the pick, then a re-check
    assert agreed == [[1_000_000, 3_000_000], [1_000_000, 3_000_000]], agreed
    pk = c.pick_for(9000)
    assert pk["measured"] and not pk["compressed"] and pk["decisions"] == 2 and pk["flips"] == 0, pk
    assert abs(pk["native_s"] - 1e-3) < 1e-12 and pk["calls"] == P + 18, pk
    assert not c.pick_for(1 << 20)["measured"]
    # native won by 3x at 8 KiB: a larger class is still probed (native's lead may be its
    # latency, which larger calls outgrow)
    assert c.compress_next(1 << 20) is False  # probing starts with native
    c.record(1 << 20, False, 1, agree)
    assert not c.pick_for(1 << 20)["inferred"]
    assert c.compress_next(1 << 20) is True
    c2 = _C.PathChoice()
    for k in range(P):
        comp = c2.compress_next(1 << 20)
        c2.record(1 << 20, comp, 1_000_000 if comp else 3_000_000, agree)  # compressed by 3x
    assert c2.pick_for(1 << 20)["compressed"]
    assert c2.compress_next(4 << 20) is True  # a larger class: compressed from its first call
    c2.record(4 << 20, True, 1, agree)
    pk = c2.pick_for(4 << 20)
    assert pk["inferred"] and pk["measured"] and pk["compressed"] and pk["decisions"] == 0, pk


@test
def auto_is_the_default():
    """CGX_PATH unset and no minimum given: "auto"; a minimum (env or configure), CGX_PATH
    and torch_cgx's profile choose the fixed rules."""
    try:
        assert B.path() == "auto", B.path()
        B.configure(min_compressed=2048)
        assert B.path() == "compressed" and B.settings().min_compressed == 2048
        B.configure(min_compressed="auto")
        assert B.path() == "auto" and B.settings().min_compressed == 1024
        B.reset()
        os.environ["CGX_COMPRESSION_MINIMAL_SIZE"] = "4096"
        assert B.path() == "compressed"
        os.environ["CGX_COMPRESSION_MINIMAL_SIZE"] = "auto"
        assert B.path() == "auto"
        del os.environ["CGX_COMPRESSION_MINIMAL_SIZE"]
        for v in ("exact", "compressed", "AUTO"):
            os.environ["CGX_PATH"] = v
            assert B.path() == v.lower()
        os.environ["CGX_PATH"] = "fast"
        raises(ValueError, B.path, "CGX_PATH")
        del os.environ["CGX_PATH"]
        B.configure(path="exact")
        assert B.path() == "exact"
        raises(ValueError, lambda: B.configure(path="sometimes"), "CGX_PATH")
        B.reset()
        B.use_defaults("torch_cgx")
        assert B.path() == "compressed" and B.settings().min_compressed == 16  # torch_cgx's fixed minimum
        os.environ["CGX_PATH"] = "auto"
        assert B.path() == "auto"
    finally:
        os.environ.pop("CGX_PATH", None)
        os.environ.pop("CGX_COMPRESSION_MINIMAL_SIZE", None)
        B.use_defaults("cgx")
        B.reset()
    # the hook: the same default, the same ways to force a path
    assert cgx_torch.CGXState(gloo, bits=4).path == "auto"
    assert cgx_torch.CGXState(gloo, bits=4, min_compressed=256).path == "compressed"
    assert cgx_torch.CGXState(gloo, bits=4, min_compressed="auto").settings.min_compressed == 1024
    assert cgx_torch.CGXState(gloo, bits=4, path="exact").path == "exact"
    os.environ["CGX_PATH"] = "compressed"
    try:
        assert cgx_torch.CGXState(gloo, bits=4).path == "compressed"
    finally:
        del os.environ["CGX_PATH"]
    raises(ValueError, lambda: cgx_torch.CGXState(gloo, path="maybe"), "path")


@test
def backend_same_path_and_bits_everywhere():
    """The measured choice over mixed sizes, dtypes and ops, asynchronous calls interleaved
    with exact ones on the caller's thread: every rank takes the same path on every call,
    holds the same bits after every call, and reads the same picks."""
    backend._paths.log = []
    before = backend.path_stats()
    sizes = (300, 1500, 12000, 70000, 260000)
    g = torch.Generator().manual_seed(100 + rank)
    hashes = []
    try:
        for step in range(30):
            pend = []
            for n in sizes:
                t = torch.randn(n, generator=g)
                pend.append((t, dist.all_reduce(t, async_op=True)))
                if n == 12000:
                    d = torch.randn(n // 2, generator=g, dtype=torch.float64)
                    pend.append((d, dist.all_reduce(d, op=dist.ReduceOp.AVG, async_op=True)))
                    i = torch.arange(50, dtype=torch.int64) * (rank + 1)
                    dist.all_reduce(i)  # exact, on the caller's thread, between the worker's calls
                    assert torch.equal(i, torch.arange(50, dtype=torch.int64) * (p * (p + 1) // 2))
            if step % 5 == 0:
                m = 4096 * p
                x = torch.randn(m, generator=g)
                o = torch.empty(m // p)
                pend.append((o, dist.reduce_scatter_tensor(o, x, async_op=True)))
            for t, w in pend:
                w.wait()
                # a reduce-scatter's shard differs by rank: its digest is gathered as None
                hashes.append(None if t.numel() == 4096 else digest(t))
        log = [(repr(k[0]), b, c) for k, b, c in backend._paths.log]
    finally:
        backend._paths.log = None
    assert same_everywhere(log), "ranks took different paths"
    assert same_everywhere(hashes), "ranks hold different bits"
    st = backend.path_stats()
    assert st["compressed"] + st["exact"] - before["compressed"] - before["exact"] == len(log)
    assert any(not c for _, b, c in log if b >= 4096), "no exact call of a measured class"
    assert any(c for _, _, c in log), "no compressed call"
    assert all(not c for _, b, c in log if b < 4096), "a call under 4096 bytes was compressed"
    picks = [{k: v for k, v in pk.items()} for pk in st["picks"]]
    assert same_everywhere(picks), "ranks read different picks"
    assert all(pk["measured"] for pk in picks if pk["calls"] >= P), picks
    json.dumps(st)  # the report's line holds it
    if rank == 0:
        print("    picks on this link:", ", ".join(f"{pk['bytes']}B:{'cgx' if pk['compressed'] else 'exact'}"
                                                 f"({pk['native_s'] * 1e3:.2f}/{pk['compressed_s'] * 1e3:.2f} ms)"
                                                 for pk in picks if "allreduce" in pk["kind"]), flush=True)


def calls_with(cfg, n, calls, slow=None):
    """`calls` SUMs of n random float32 values with configure(**cfg); `slow`: the backend's
    method to make SLOW seconds slower. Returns (results, log of this run, stats delta)."""
    B.configure(**cfg)
    orig = None
    if slow is not None:
        orig = getattr(backend, slow)

        def slowed(*a):
            time.sleep(SLOW)
            return orig(*a)

        setattr(backend, slow, slowed)
    backend._paths.log = []
    before = backend.path_stats()
    g = torch.Generator().manual_seed(7 + rank)
    out = []
    try:
        for _ in range(calls):
            t = torch.randint(-50, 50, (n,), generator=g).float()
            dist.all_reduce(t)
            out.append(t)
        log = [c for _, _, c in backend._paths.log]
    finally:
        backend._paths.log = None
        if slow is not None:
            delattr(backend, slow)  # the class's method again
        B.reset()
    st = backend.path_stats()
    return out, log, {k: st[k] - before[k] for k in ("compressed", "exact")}, st


@test
def forcing_either_path():
    """configure(path="exact"): every call exact (the exact sums of integer-valued floats);
    path="compressed": every call compressed, also under 4096 bytes."""
    out, log, d, _ = calls_with({"path": "exact", "seed": 11}, 20000, 12)
    assert log == [] and d == {"compressed": 0, "exact": 12}, (log, d)
    g = [torch.Generator().manual_seed(7 + r) for r in range(p)]
    for t in out:
        want = sum(torch.randint(-50, 50, (20000,), generator=gr).float() for gr in g)
        assert torch.equal(t, want)
    out, log, d, _ = calls_with({"path": "compressed", "seed": 12}, 20000, 12)
    assert log == [] and d == {"compressed": 12, "exact": 0}, (log, d)
    assert any(not torch.equal(t, t.round()) for t in out), "not compressed"
    _, _, d, _ = calls_with({"path": "compressed", "seed": 12}, 500, 3)
    assert d == {"compressed": 3, "exact": 0}, d


@test
def picks_exact_when_compressed_is_slower():
    """The compressed path made SLOW seconds slower on every rank: after its probe calls
    the class picks exact, and the calls after it go exact (until a re-check)."""
    n = 16384
    _, log, _, st = calls_with({"seed": 21}, n, P + 8, slow="_reduce")
    assert log[:P] == [False, True] * (P // 2) and log[P:] == [False] * 8, log
    pk = [x for x in st["picks"] if "seed=21" in x["kind"] and x["size_class"] == class_of(4 * n)]
    assert len(pk) == 1 and pk[0]["measured"] and not pk[0]["compressed"], pk
    assert pk[0]["compressed_s"] > SLOW > pk[0]["native_s"], pk


@test
def picks_compressed_when_exact_is_slower():
    """The exact path made SLOW seconds slower: the class picks compressed."""
    n = 16384
    _, log, _, st = calls_with({"seed": 22}, n, P + 4, slow="_worker_exact_allreduce")
    assert log[:P] == [False, True] * (P // 2) and log[P:] == [True] * 4, log
    pk = [x for x in st["picks"] if "seed=22" in x["kind"] and x["size_class"] == class_of(4 * n)]
    assert len(pk) == 1 and pk[0]["measured"] and pk[0]["compressed"], pk
    # a size under 4096 bytes stays exact however slow exact is
    _, log, _, _ = calls_with({"seed": 22}, 1000, 8, slow="_worker_exact_allreduce")
    assert log == [False] * 8, log


def model(seed=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def train(state, steps=20, find_unused=False, bucket_mb=0.2, net=None):
    """Trains over the gloo group with the hook; returns (model, losses)."""
    net = net or model()
    m = DDP(net, process_group=gloo, bucket_cap_mb=bucket_mb, find_unused_parameters=find_unused)
    if state is not None:
        m.register_comm_hook(state, cgx_torch.cgx_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(32, 64, generator=g)  # one batch per rank, learned over the steps
    y = torch.randint(0, 10, (32,), generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return net, losses


def params_digest(net):
    return [digest(q) for q in net.parameters()]


@test
def hook_same_path_and_bits_everywhere():
    """The hook's default (measured) over several buckets: the same path for every bucket on
    every rank, the same parameters everywhere, the same picks."""
    st = cgx_torch.CGXState(gloo, bits=4)
    assert st.path == "auto"
    st._paths.log = []
    net, losses = train(st, steps=30)
    log = [(b, c) for _, b, c in st._paths.log]
    ps = st.path_stats()
    st.free()
    assert len(log) >= 30, len(log)
    assert same_everywhere(log), "ranks took different paths"
    assert same_everywhere(params_digest(net)), "parameters differ"
    assert same_everywhere(ps["picks"]) and ps["compressed"] + ps["exact"] == len(log), ps
    assert any(pk["measured"] for pk in ps["picks"]), ps
    assert losses[-1] < losses[0], losses
    if rank == 0:
        print("    hook picks on this link:", ", ".join(
            f"{pk['bytes']}B:{'cgx' if pk['compressed'] else 'exact'}" for pk in ps["picks"]), flush=True)


@test
def hook_exact_path_beside_ddp_collectives():
    """find_unused_parameters: DDP allreduces its map of used parameters on its group during
    the backward pass while the hook's thread reduces buckets; the hook's exact path and its
    agreements go over the state's own gloo backend, so nothing reorders (no hang), and the
    parameters stay identical (before, the hook's agreements went over DDP's group and
    could meet DDP's allreduce instead: "another rank passed an invalid tensor").
    path="exact" gives the exact average."""
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(4)
            self.a = model()
            self.unused = nn.Linear(64, 10)

        def forward(self, x):
            return self.a(x)

    for path in ("auto", "exact", "compressed"):
        st = cgx_torch.CGXState(gloo, bits=4, path=path)
        net, _ = train(st, steps=12, find_unused=True, net=Branchy())
        ps = st.path_stats()
        st.free()
        assert same_everywhere(params_digest(net)), path
        if path == "exact":
            assert ps["compressed"] == 0 and ps["exact"] > 0, ps
    # the exact path against DDP's own gloo allreduce: the same average (to rounding)
    st = cgx_torch.CGXState(gloo, bits=4, path="exact")
    a, _ = train(st, steps=5)
    st.free()
    b, _ = train(None, steps=5)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-6), (x - y).abs().max()


@test
def hook_picks_exact_when_compressed_is_slower():
    """The hook's compressed plans made SLOW seconds slower: every measured bucket class
    picks exact; forced compressed (min_compressed given) reduces every bucket by the plan."""
    st = cgx_torch.CGXState(gloo, bits=4)
    plan_for = st.plan_for

    class Slow:
        def __init__(self, plan):
            self.plan = plan

        def run(self, t):
            time.sleep(SLOW)
            return self.plan.run(t)

        def __getattr__(self, name):
            return getattr(self.plan, name)

    st.plan_for = lambda *a, **k: Slow(plan_for(*a, **k))
    st._paths.log = []
    train(st, steps=P + 4, bucket_mb=25)  # one bucket
    log = [c for _, _, c in st._paths.log]
    ps = st.path_stats()
    st.free()
    assert log[:P] == [False, True] * (P // 2) and log[P:] == [False] * 4, log
    assert len(ps["picks"]) == 1 and ps["picks"][0]["measured"] and not ps["picks"][0]["compressed"], ps
    st = cgx_torch.CGXState(gloo, bits=4, min_compressed=1024)
    train(st, steps=4)
    ps = st.path_stats()
    st.free()
    assert ps["path"] == "compressed" and ps["exact"] == 0 and ps["compressed"] > 0, ps


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
        print(f"cgx path choice tests: {len(tests) - failed} passed, {failed} failed ({p} ranks)", flush=True)
    gc.collect()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
