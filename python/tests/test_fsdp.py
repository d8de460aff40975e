#!/usr/bin/env python3
"""FSDP2 and DTensor over cgx (torch >= 2.9), under torchrun at 2 to 4 ranks (CPU):

    torchrun --standalone --nproc-per-node 4 python/tests/test_fsdp.py

dist.init_process_group("cgx"); a small transformer LM (two blocks, each fully_shard'ed, and
the root) trained with AdamW for STEPS steps on a synthetic Markov-chain language, the same
data and initial parameters in every run:

- every reduce-scatter FSDP2 makes, through the `cgx` backend and through
  cgx_torch.fsdp.CompressedReduceScatter (over the cgx group and over a gloo one), checked
  against the exact sum of the same inputs: each rank's own values exact up to rounding, the
  others' within the bucket's max-min bound, and not exact (compressed); the reductions
  FSDP2 asks for: AVG by default, SUM under set_force_sum_reduction_for_comms(True);
- parameters all-gathered exactly by default (the unsharded parameters equal the
  full_tensor() of the sharded ones, and full_tensor() the local shards gathered over a
  gloo group, bit for bit, on every rank);
- full_tensor() of every parameter identical on every rank;
- a torch.distributed.checkpoint save to a temporary folder and a load into a model whose
  parameters were changed gives the saved parameters back, bit for bit;
- final validation loss within 0.05 of the same run over gloo, for the backend, the
  plug-in over gloo and bf16 MixedPrecisionPolicy gradients; the opt-in 8-bit parameter
  all-gather's effect on loss printed (and checked within 0.05 too);
- HSDP by hand at 4 ranks: 1-D FSDP over half the ranks, the replicate dimension averaged
  by cgx_torch.fsdp.ReplicateAllReduce (FSDP2's set_all_reduce_hook);
- bad input: an unsupported params_bits and a model without FSDPModule raise ValueError.

Prints one line per test on rank 0 and a summary "test_fsdp: PASS/FAIL ..."; exit status 1
when a test failed.
"""
import gc
import hashlib
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import cgx_torch
from cgx_torch import fsdp as cgx_fsdp

STEPS = int(os.environ.get("CGX_TEST_FSDP_STEPS", "30"))
TOL = 0.05
VOCAB, DIM, SEQ, BATCH = 48, 64, 32, 8

# These tests check the backend's compressed reduce-scatter itself (every call compressed,
# within its bound): the measured choice (CGX_PATH=auto, the default) could send a call
# exact on this fast link. It is tested by test_path_choice.py.
os.environ["CGX_PATH"] = "compressed"
dist.init_process_group("cgx")
rank, p = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo")  # the baseline's group, and the checks' exact sums
tests = []
results = {}


def test(f):
    tests.append(f)
    return f


def gather(x):
    out = [None] * p
    dist.all_gather_object(out, x, group=GLOO)
    return out


def digest(t):
    return hashlib.blake2b(t.detach().contiguous().view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()


def same_everywhere(t):
    return len(set(gather(digest(t)))) == 1


# ---------------------------------------------------------------- the model and data


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln, self.out = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.out(self.ln(x))


def markov_chain():
    """A sparse random transition matrix: a language with something to learn."""
    g = torch.Generator().manual_seed(1234)
    logits = torch.randn(VOCAB, VOCAB, generator=g) * 3
    return torch.softmax(logits, 1)


CHAIN = markov_chain()


def sample(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, SEQ + 1, dtype=torch.long)
    x[:, 0] = torch.randint(VOCAB, (n,), generator=g)
    for t in range(SEQ):
        x[:, t + 1] = torch.multinomial(CHAIN[x[:, t]], 1, generator=g).squeeze(1)
    return x[:, :-1], x[:, 1:]


VAL = sample(64, 999)


def build(mesh=None, mp=None):
    torch.manual_seed(0)
    m = LM()
    kw = {"mesh": mesh} if mesh is not None else {}
    if mp is not None:
        kw["mp_policy"] = mp
    for b in m.blocks:
        fully_shard(b, **kw)
    fully_shard(m, **kw)
    return m


def train(m, steps=STEPS):
    """AdamW for `steps` steps, each rank its own batches; the validation loss (the same on every rank)."""
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)
    for s in range(steps):
        x, y = sample(BATCH, 10_000 * s + rank)
        loss = F.cross_entropy(m(x).float().reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        v = F.cross_entropy(m(VAL[0]).float().reshape(-1, VOCAB), VAL[1].reshape(-1)).item()
    m.reshard()  # the root keeps its parameters unsharded after a forward (no backward follows)
    return v


def unsharded_params(m):
    """{name: the unsharded parameter} after FSDP2's all-gather of every FSDPModule."""
    mods = [x for x in m.modules() if isinstance(x, cgx_fsdp.FSDPModule)]
    for x in mods:
        x.unshard()
    out = {n: q.detach().clone() for n, q in m.named_parameters()}
    for x in mods:
        x.reshard()
    assert not any(hasattr(t, "to_local") for t in out.values()), "unshard() left DTensors"
    return out


def gloo_full_params(m):
    """{name: the full parameter} from the local shards, gathered over the gloo group (Shard(0)
    on the 1-D mesh: the ranks' shards one after the other): the reference for full_tensor()."""
    return {n: torch.cat([torch.as_tensor(a) for a in gather(q.to_local().detach().numpy().copy())])
            for n, q in m.named_parameters()}


def full_params(m):
    return {n: q.full_tensor().detach() for n, q in m.named_parameters()}


# ---------------------------------------------------------------- the reduce-scatter checks


class Checked:
    """Wraps a reduce-scatter Comm: every call's result compared with the exact sum of the
    same inputs (all-gathered over gloo): this rank's own values exact up to the dtype's
    rounding, each other rank's within (max - min) / (2^bits - 1) of its bucket (stochastic
    rounding: less than one step; the shard's buckets start at the shard's start)."""

    def __init__(self, inner, bits, bucket):
        self.inner, self.bits, self.bucket = inner, bits, bucket
        self.ops, self.calls, self.worst, self.compressed = set(), 0, 0.0, 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        q = group.size()
        r = dist.get_group_rank(group, rank)
        m = output_tensor.numel()
        xs = [torch.empty(input_tensor.numel(), dtype=input_tensor.dtype) for _ in range(q)]
        dist.all_gather(xs, input_tensor.reshape(-1).contiguous(), group=group)
        work = self.inner(output_tensor, input_tensor, group, op, async_op)
        if work is not None:
            work.wait()
        name = "AVG" if op == dist.ReduceOp.AVG else "SUM" if op == dist.ReduceOp.SUM else repr(op)
        self.ops.add(name)
        div = q if name == "AVG" else 1
        shards = [x[r * m:(r + 1) * m].double() for x in xs]
        want = sum(shards) / div
        got = output_tensor.reshape(-1).double()
        err = (got - want).abs()
        levels = 2 ** self.bits - 1
        ulp = 2.0 ** -7 if output_tensor.dtype == torch.bfloat16 else 2.0 ** -10 if output_tensor.dtype == \
            torch.float16 else 1e-6
        for b in range(0, m, self.bucket):
            bound = sum(float(s[b:b + self.bucket].max() - s[b:b + self.bucket].min())
                        for j, s in enumerate(shards) if j != r) / levels / div
            room = bound + ulp * float(want[b:b + self.bucket].abs().max()) + 1e-7
            e = float(err[b:b + self.bucket].max())
            assert e <= room, f"reduce-scatter bucket {b}: error {e:.3g} > bound {room:.3g} ({name}, {q} ranks)"
            self.worst = max(self.worst, e / room)
        if float(err.max()) > 1e-6 * float(want.abs().max()):
            self.compressed += 1
        self.calls += 1
        return work


def install_checked(m, inner, bits, bucket):
    c = Checked(inner, bits, bucket)
    for mod in m.modules():
        if isinstance(mod, cgx_fsdp.FSDPModule):
            mod.set_custom_reduce_scatter(c)
    return c


class BackendRS:
    """FSDP2's default reduce-scatter (dist.reduce_scatter_tensor on the FSDP group): over the
    `cgx` backend, the backend's compressed one."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


BACKEND_BITS = cgx_torch.backend.settings().bits
BACKEND_BUCKET = cgx_torch.backend.settings().bucket


# ---------------------------------------------------------------- the tests


@test
def baseline_over_gloo():
    """The reference: the same training over a gloo mesh (FSDP2's own exact collectives)."""
    m = build(DeviceMesh.from_group(GLOO, "cpu"))
    results["gloo"] = train(m)
    assert math.isfinite(results["gloo"])


@test
def backend_reduce_scatter_within_bound_full_tensor_checkpoint():
    """Over the `cgx` backend, unchanged FSDP2: its reduce-scatters (AVG) compressed within the
    bound; exact all-gather; full_tensor identical everywhere; DCP round trip; loss within TOL."""
    m = build()
    c = install_checked(m, BackendRS(), BACKEND_BITS, BACKEND_BUCKET)
    results["cgx backend"] = v = train(m)
    assert c.calls > 0 and c.ops == {"AVG"}, (c.calls, c.ops)
    assert c.compressed == c.calls, f"{c.calls - c.compressed} of {c.calls} reduce-scatters exact: not compressed"
    full = full_params(m)
    ref = gloo_full_params(m)
    for n, t in full.items():
        assert same_everywhere(t), f"full_tensor() of {n} differs between ranks"
        assert torch.equal(t, ref[n]), f"full_tensor() of {n} is not the exact gather of the shards"
    # exact all-gather: the unsharded parameters are the sharded ones gathered, bit for bit
    for n, t in unsharded_params(m).items():
        assert torch.equal(t, full[n]), f"unsharded {n} differs from its full_tensor()"
    # checkpoint: save, scramble, load
    path = [tempfile.mkdtemp(prefix="cgx_fsdp_dcp_") if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    try:
        dcp.save({"model": get_model_state_dict(m)}, checkpoint_id=path[0])
        with torch.no_grad():
            for q in m.parameters():
                q.add_(1.0)
        state = {"model": get_model_state_dict(m)}
        dcp.load(state, checkpoint_id=path[0])
        set_model_state_dict(m, state["model"])
        for n, t in full_params(m).items():
            assert torch.equal(t, full[n]), f"{n} not restored by the checkpoint"
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path[0], ignore_errors=True)
    assert abs(v - results["gloo"]) <= TOL, (v, results["gloo"])
    results["worst bound use, backend"] = c.worst


@test
def plugin_over_gloo_and_force_sum():
    """CompressedReduceScatter over a gloo FSDP mesh (any backend): AVG within the bound, loss
    within TOL; with set_force_sum_reduction_for_comms(True) FSDP2 asks for SUM, within the
    bound too."""
    m = build(DeviceMesh.from_group(GLOO, "cpu"))
    inst = cgx_fsdp.compress(m, bits=4)
    c = install_checked(m, inst.reduce_scatter, 4, inst.reduce_scatter.settings.bucket)
    results["plugin over gloo"] = v = train(m)
    assert c.ops == {"AVG"} and c.compressed == c.calls > 0, (c.ops, c.compressed, c.calls)
    assert inst.reduce_scatter.compressed_calls == c.calls
    assert abs(v - results["gloo"]) <= TOL, (v, results["gloo"])
    m2 = build()  # over the cgx backend, the plug-in's own plans
    inst2 = cgx_fsdp.compress(m2, bits=4)
    for mod in inst2.modules:
        mod.set_force_sum_reduction_for_comms(True)
    c2 = install_checked(m2, inst2.reduce_scatter, 4, inst2.reduce_scatter.settings.bucket)
    results["plugin, forced sum"] = v2 = train(m2)
    assert c2.ops == {"SUM"} and c2.compressed == c2.calls > 0, (c2.ops, c2.compressed, c2.calls)
    assert abs(v2 - results["gloo"]) <= TOL, (v2, results["gloo"])
    results["worst bound use, plugin"] = max(c.worst, c2.worst)


@test
def backend_forced_sum():
    """Unchanged FSDP2 over the backend with set_force_sum_reduction_for_comms(True): SUM
    reduce-scatters, compressed, within the bound."""
    m = build()
    for mod in m.modules():
        if isinstance(mod, cgx_fsdp.FSDPModule):
            mod.set_force_sum_reduction_for_comms(True)
    c = install_checked(m, BackendRS(), BACKEND_BITS, BACKEND_BUCKET)
    v = train(m, 5)
    assert c.ops == {"SUM"} and c.compressed == c.calls > 0, (c.ops, c.compressed, c.calls)
    assert math.isfinite(v)


@test
def quantized_all_gather():
    """params_bits=8: every rank computes with the same dequantized parameters (not the
    exact ones, each within half a step of its bucket), the optimizer's shards stay exact;
    the effect on loss measured against the exact all-gather over the backend."""
    m = build()
    inst = cgx_fsdp.compress(m, bits=0, params_bits=8)
    assert inst.reduce_scatter is None and inst.all_gather is not None
    results["cgx backend + 8-bit all-gather"] = v = train(m)
    ag = inst.all_gather
    assert ag.quantized_calls > 0 and ag.bytes_sent < 0.3 * ag.bytes_exact, (ag.bytes_sent, ag.bytes_exact)
    full = full_params(m)  # DTensor's own (exact) gather
    # buckets restart at each parameter's shard: bound by the parameter's own range (with
    # FSDP2's zero padding where its first dimension does not split evenly)
    changed = 0
    for n, t in unsharded_params(m).items():
        assert same_everywhere(t), f"unsharded {n} differs between ranks"
        ref = full[n]
        lo, hi = float(ref.min()), float(ref.max())
        if ref.shape[0] % p:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        err = (t - ref).abs().max().item()
        assert err <= (hi - lo) / 510 * 1.001 + 1e-7, (n, err, hi - lo)
        changed += err > 0
    assert changed > len(full) // 2, f"only {changed} of {len(full)} parameters quantized"
    assert abs(v - results["cgx backend"]) <= TOL, (v, results["cgx backend"])


@test
def quantized_all_gather_comm():
    """QuantizedAllGather called directly (sync and async): each value within half a step of
    its bucket's range (nearest rounding), every rank the same result; with a layout the
    buckets restart at each segment (a small-ranged segment after a wide one keeps its own
    precision); a bucket holding an inf comes back NaN and the others do not."""
    ag = cgx_fsdp.QuantizedAllGather(bucket=64)
    n = 1000
    for async_op in (False, True):
        out = torch.empty(p * n)
        mine = out[rank * n:(rank + 1) * n]
        mine.copy_(torch.randn(n, generator=torch.Generator().manual_seed(50 + rank)) * (rank + 1))
        exact = torch.cat([torch.from_numpy(a) for a in gather(mine.numpy().copy())])
        w = ag(out, mine, dist.group.WORLD, async_op=async_op)
        assert (w is not None) == async_op
        if w is not None:
            w.wait()
        assert same_everywhere(out)
        for r in range(p):
            for b in range(0, n, 64):
                e = exact[r * n + b:r * n + min(b + 64, n)]
                g = out[r * n + b:r * n + min(b + 64, n)]
                assert (g - e).abs().max() <= float(e.max() - e.min()) / 510 * 1.0001 + 1e-7, (r, b)
        assert not torch.equal(out, exact)
    # a layout: buckets restart at the second segment, whose range is 1e-6 of the first's
    lay = cgx_fsdp.QuantizedAllGather(bucket=64)
    lay.add_layout([100, 900])
    out = torch.empty(p * n)
    mine = out[rank * n:(rank + 1) * n]
    mine[:100] = torch.linspace(-1000, 1000, 100)
    mine[100:] = torch.linspace(0, 1e-3, 900) * (rank + 1)
    exact = torch.cat([torch.from_numpy(a) for a in gather(mine.numpy().copy())])
    lay(out, mine, dist.group.WORLD)
    for r in range(p):
        e, g = exact[r * n + 100:(r + 1) * n], out[r * n + 100:(r + 1) * n]
        assert (g - e).abs().max() <= float(e.max() - e.min()) / 510 * 1.0001 + 1e-12, (g - e).abs().max()
    assert lay.payload_bytes(n) == 128 + 960 + 8 * (2 + 15)
    out = torch.zeros(p * n)
    mine = out[rank * n:(rank + 1) * n]
    mine.copy_(torch.linspace(-1, 1, n))
    mine[130] = float("inf")
    ag(out, mine, dist.group.WORLD)
    for r in range(p):
        seg = out[r * n:(r + 1) * n]
        assert seg[128:192].isnan().all() and torch.isfinite(torch.cat([seg[:128], seg[192:]])).all()


@test
def bf16_mixed_precision():
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16): bf16 gradients
    reduce-scattered compressed by the backend (within the bound), and by the plug-in with
    the 8-bit all-gather of bf16 parameters; loss within TOL of gloo's fp32 run."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    m = build(mp=mp)
    c = install_checked(m, BackendRS(), BACKEND_BITS, BACKEND_BUCKET)
    results["cgx backend, bf16"] = v = train(m)
    assert c.compressed == c.calls > 0, (c.compressed, c.calls)
    assert abs(v - results["gloo"]) <= TOL, (v, results["gloo"])
    m2 = build(DeviceMesh.from_group(GLOO, "cpu"), mp=mp)
    inst = cgx_fsdp.compress(m2, bits=4, params_bits=8)
    c2 = install_checked(m2, inst.reduce_scatter, 4, inst.reduce_scatter.settings.bucket)
    results["plugin + 8-bit all-gather, bf16"] = v2 = train(m2)
    assert c2.compressed == c2.calls > 0 and inst.all_gather.quantized_calls > 0
    assert abs(v2 - results["gloo"]) <= TOL, (v2, results["gloo"])


@test
def hsdp_by_hand():
    """HSDP built from 1-D FSDP (at 4 ranks and more, an even number): sharded over half the
    ranks, the reduce-scatter outputs averaged over the replicate group by
    ReplicateAllReduce (cgx's compressed allreduce); every rank ends with the same full
    parameters, loss within TOL of gloo's. Skipped below 4 ranks."""
    if p < 4 or p % 2:
        results["hsdp by hand (skipped: needs an even number of ranks >= 4)"] = float("nan")
        return
    half = p // 2
    shards = [dist.new_group(list(range(i * half, (i + 1) * half)), backend="gloo") for i in range(2)]
    reps = [dist.new_group([j, j + half], backend="gloo") for j in range(half)]
    m = build(DeviceMesh.from_group(shards[rank // half], "cpu"))
    inst = cgx_fsdp.compress(m, bits=4, replicate_group=reps[rank % half])
    c = install_checked(m, inst.reduce_scatter, 4, inst.reduce_scatter.settings.bucket)
    results["hsdp by hand, 2 replicas"] = v = train(m)
    assert inst.replicate.calls == c.calls > 0 and c.compressed == c.calls, (inst.replicate.calls, c.calls)
    for n, t in full_params(m).items():
        assert same_everywhere(t), f"full_tensor() of {n} differs between ranks"
    assert abs(v - results["gloo"]) <= TOL, (v, results["gloo"])


@test
def bad_input():
    """Clear errors: params_bits other than 8, no FSDPModule, bits out of range, a torch
    without FSDP2's plug-in points (RuntimeError naming the version needed), PREMUL_SUM
    (ValueError naming forced sums); MAX exact."""
    m = build()
    for call, what in ((lambda: cgx_fsdp.compress(m, params_bits=4), "params_bits"),
                       (lambda: cgx_fsdp.compress(nn.Linear(2, 2)), "no FSDPModule"),
                       (lambda: cgx_fsdp.CompressedReduceScatter(bits=9), "bits")):
        try:
            call()
        except ValueError as e:
            assert str(e), what
        else:
            raise AssertionError(f"{what}: no ValueError")
    saved = cgx_fsdp.FSDPModule  # a torch without FSDP2 (as torch < 2.6 imports it)
    cgx_fsdp.FSDPModule = None
    try:
        cgx_fsdp.compress(m)
    except RuntimeError as e:
        assert f">= {cgx_fsdp.TORCH_NEEDED}" in str(e) and torch.__version__ in str(e), e
    else:
        raise AssertionError("no FSDP2: no RuntimeError")
    finally:
        cgx_fsdp.FSDPModule = saved
    rs = cgx_fsdp.CompressedReduceScatter(bits=4)
    try:
        rs(torch.empty(4), torch.ones(4 * p), dist.group.WORLD, dist.ReduceOp.PREMUL_SUM(0.5))
    except ValueError as e:
        assert "force_sum" in str(e), e
    else:
        raise AssertionError("PREMUL_SUM: no ValueError")
    out = torch.empty(4)  # MAX: exact
    x = torch.arange(4 * p, dtype=torch.float32) * (rank + 1)
    rs(out, x, dist.group.WORLD, dist.ReduceOp.MAX)
    assert torch.equal(out, torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float32) * p), out


def main():
    failed = 0
    t0 = time.time()
    if not cgx_fsdp.available():
        if rank == 0:
            print(f"test_fsdp: FAIL: torch {torch.__version__} has no FSDP2 plug-in points "
                  f"(needs >= {cgx_fsdp.TORCH_NEEDED})", flush=True)
        sys.exit(1)
    for f in tests:
        t = time.time()
        try:
            f()
            ok = True
        except Exception:  # noqa: BLE001
            ok = False
            traceback.print_exc()
        all_ok = all(gather(ok))
        failed += not all_ok
        if rank == 0:
            print(f"{'ok    ' if all_ok else 'FAILED'} {f.__name__} ({p} ranks, {time.time() - t:.1f} s)", flush=True)
    if rank == 0:
        for k, v in results.items():
            if math.isnan(v):
                print(f"  {k}", flush=True)
                continue
            d = f" ({v - results['gloo']:+.4f} vs gloo)" if "gloo" in results and not k.startswith("worst") \
                and k != "gloo" else ""
            print(f"  {k}: {v:.4f}{d}", flush=True)
        print(f"test_fsdp: {'PASS' if not failed else 'FAIL'}: {len(tests) - failed} passed, {failed} failed "
              f"({p} ranks, {STEPS} steps, torch {torch.__version__}, {time.time() - t0:.0f} s)", flush=True)
    gc.collect()
    cgx_torch.free_plans()
    cgx_fsdp.free()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
