"""cgx for FSDP2 (``torch.distributed.fsdp.fully_shard``): compressed gradient
reduce-scatter and an opt-in quantized parameter all-gather, through FSDP2's own
plug-in points (``FSDPModule.set_custom_reduce_scatter`` / ``set_custom_all_gather``,
torch >= 2.9). See docs/fsdp.md.

- ``CompressedReduceScatter(bits=4)``: the gradients' reduce-scatter by cgx's layer-wise
  plan (``layerwise_plan::reduce_scatter``: one layer per rank's shard; each rank's shard
  of the sum holds its own values exact and the others' quantized once, at ``bits`` with
  max-min buckets). It runs over a private gloo group of the FSDP group's ranks, so it
  works whatever the FSDP group's backend is (gloo, ``cgx``, NCCL through a host copy).
  SUM and AVG are compressed (FSDP2 uses AVG for float32/bfloat16 gradients, SUM with a
  post-division under ``set_force_sum_reduction_for_comms(True)`` and for float16); MAX,
  MIN and PRODUCT are exact; a pre-multiplied sum (``set_gradient_divide_factor`` with a
  factor other than the group's size, without forced sums) raises ValueError.
- ``QuantizedAllGather(bits=8)``: the parameters' all-gather as 8-bit codes with one
  float32 minimum and scale per bucket of ``bucket`` values (ZeRO++'s qwZ idea): each
  rank quantizes its shard with torch ops (nearest rounding), the codes and scales are
  all-gathered exactly over the FSDP group, every rank dequantizes every shard (its own
  too), so every rank computes with the same unsharded parameters. The sharded
  parameters the optimizer updates stay exact. A bucket holding a NaN or an inf comes
  back all NaN.
- ``compress(model, bits=4, params_bits=None)`` installs them on every FSDPModule of
  ``model``.

Over the ``cgx`` backend (``init_process_group("cgx")``) FSDP2's default reduce-scatter is
already compressed by the backend, with the backend's settings; these plug-ins give the
same over any backend, with their own settings.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.distributed as dist

from . import _core

try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # torch < 2.6: FSDP2 lives elsewhere or not at all
    try:
        from torch.distributed._composable.fsdp import FSDPModule
    except ImportError:
        FSDPModule = None

try:  # torch >= 2.9: FSDP2's Comm interfaces
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:
    _AllGatherBase = _ReduceScatterBase = object

from .backend import _Work  # a Work whose wait() raises its future's error (torch's own does not)

#: The first torch whose FSDP2 has set_custom_reduce_scatter / set_custom_all_gather.
TORCH_NEEDED = "2.9"


def available():
    """Whether this torch has FSDP2's plug-in points (set_custom_reduce_scatter/all_gather)."""
    return (FSDPModule is not None and hasattr(FSDPModule, "set_custom_reduce_scatter")
            and hasattr(FSDPModule, "set_custom_all_gather") and _ReduceScatterBase is not object)


def _require():
    if not available():
        raise RuntimeError(f"cgx_torch.fsdp needs torch >= {TORCH_NEEDED} (FSDP2's FSDPModule.set_custom_reduce_scatter"
                           f" and set_custom_all_gather); this is torch {torch.__version__}. Over the `cgx` backend "
                           "(init_process_group(\"cgx\")) FSDP2's reduce-scatter is compressed without them.")


def _ranks(group):
    return tuple(dist.get_process_group_ranks(group))


_gloo_groups = {}


def _private_group(group):
    """cgx's TorchGroup over a gloo group of `group`'s ranks (made once per set of ranks;
    collective over those ranks the first time)."""
    key = _ranks(group)
    g = _gloo_groups.get(key)
    if g is None:
        pg = dist.new_group(list(key), backend="gloo", use_local_synchronization=True)
        g = _gloo_groups[key] = _core.TorchGroup(pg)
    return g


def _is(op, which):
    """op (ReduceOp or RedOpType) is `which` (a RedOpType)."""
    try:
        return op == which
    except TypeError:
        return False


def _op_name(op):
    for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if _is(op, getattr(dist.ReduceOp, name, None)):
            return name
    return repr(op)


class CompressedReduceScatter(_ReduceScatterBase):
    """FSDP2 reduce-scatter Comm: cgx's compressed reduce-scatter (see the module comment).

    bits: 1..8 (0: exact, through the private gloo group); bucket, rounding: as
    cgx_torch.allreduce_ (default: the width's measured defaults); min_compressed: shards
    of fewer values go exact. Every rank must use the same settings (checked when a plan
    is built: MismatchError on every rank)."""

    def __init__(self, bits=4, *, bucket=None, rounding=None, min_compressed=1024, seed=0x63677821, threads=1):
        _require()
        if bucket is None:
            bucket = getattr(_core, "default_bucket", lambda b: 128 if 1 <= b <= 2 else 1024)(bits)
        if rounding is None:
            rounding = getattr(_core, "default_rounding", lambda b: "nearest" if 1 <= b <= 2 else "stochastic")(bits)
        self.settings = _core.make_settings(bits, bucket, rounding, min_compressed, seed=seed, threads=threads)
        self._plans = {}
        self.calls = 0
        self.compressed_calls = 0
        # the plans' bytes_sent summed over the compressed calls: the figure of a whole allreduce
        # with these layers (both phases), about twice what the reduce-scatter itself sends
        self.allreduce_bytes = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def _plan(self, g, n, dtype):
        key = (g.key, n, str(dtype))
        plan = self._plans.get(key)
        if plan is None:
            _core.agree(g, ("fsdp_reduce_scatter", n, str(dtype), self.settings), None)
            p = g.size
            buf = torch.empty(n, dtype=dtype)
            plan = _core.new_plan(g, buf, [(r * (n // p), n // p, False) for r in range(p)], self.settings)
            self._plans[key] = plan = (plan, buf)
        return plan

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        g = _private_group(group)
        p, r = g.size, g.rank
        n, m = input_tensor.numel(), output_tensor.numel()
        if n != p * m:
            raise ValueError(f"cgx_torch.fsdp: reduce-scatter of {n} values into {m} on {p} ranks")
        if _is(op, dist.ReduceOp.PREMUL_SUM) or _op_name(op) == repr(op):
            raise ValueError(f"cgx_torch.fsdp: reduce-scatter with {_op_name(op)} is not supported (SUM, AVG: "
                             "compressed; MAX, MIN, PRODUCT: exact). FSDP2 asks for a pre-multiplied sum when "
                             "set_gradient_divide_factor differs from the group size: add "
                             "set_force_sum_reduction_for_comms(True)")
        self.calls += 1
        compressible = (self.settings.bits > 0 and input_tensor.dtype in _core.COMPRESSED_DTYPES
                        and (_is(op, dist.ReduceOp.SUM) or _is(op, dist.ReduceOp.AVG)))
        if compressible:
            wdt = torch.float64 if input_tensor.dtype == torch.float64 else torch.float32
            plan, buf = self._plan(g, n, wdt)
            buf.copy_(input_tensor.reshape(-1))
            plan.reduce_scatter(buf)
            shard = buf[r * m:(r + 1) * m]
            if _is(op, dist.ReduceOp.AVG):
                shard.div_(p)
            output_tensor.view(-1).copy_(shard)
            self.compressed_calls += 1
            self.allreduce_bytes += plan.bytes_sent
        else:  # exact: the whole sum (or max, min, product) over the gloo group, this rank's part
            host = input_tensor.detach().to("cpu", copy=True).reshape(-1)
            avg = _is(op, dist.ReduceOp.AVG)
            dist.all_reduce(host, op=dist.ReduceOp.SUM if avg else op, group=g.pg)
            shard = host[r * m:(r + 1) * m]
            if avg:
                shard.div_(p)
            output_tensor.view(-1).copy_(shard)
        return _done(output_tensor) if async_op else None


def _done(t):
    """A completed Work (what an async_op=True call of a finished collective returns)."""
    fut = torch.futures.Future()
    fut.set_result([t])
    return _Work(fut)


class QuantizedAllGather(_AllGatherBase):
    """FSDP2 all-gather Comm: parameters sent as 8-bit codes with a float32 minimum and
    scale per bucket of ``bucket`` values (see the module comment). Output dtypes
    float32, bfloat16, float16 and float64 are quantized; any other (e.g. the uint8 of a
    module whose parameters have several dtypes) is gathered exactly.

    Buckets restart at every parameter's shard where the layout of the flat shard is known
    (``add_layout``, which compress() calls for each FSDPModule): a bucket then never mixes
    two parameters' ranges (a LayerNorm weight near 1 beside a matrix near 0). A flat shard
    of a size with no layout, or with two different layouts, is cut into buckets from its
    start."""

    def __init__(self, bits=8, *, bucket=256):
        _require()
        if bits != 8:
            raise ValueError(f"cgx_torch.fsdp: the quantized all-gather sends 8-bit codes (got bits={bits!r})")
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 8:
            raise ValueError(f"cgx_torch.fsdp: bucket must be an int >= 8 (got {bucket!r})")
        self.bits, self.bucket = bits, bucket
        self.calls = 0
        self.quantized_calls = 0
        self.bytes_sent = 0  # this rank's payload, over all calls
        self.bytes_exact = 0  # what the same calls would have sent exactly
        self._layouts = {}  # flat shard size -> tuple of segment sizes, or None (no single layout)
        self._index = {}  # flat shard size -> (gather index into the padded order, positions of the values)

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def add_layout(self, segments):
        """Declares that a flat shard of sum(segments) values is made of these segments (one
        per parameter, in order); buckets then restart at each. The same on every rank."""
        segments = tuple(int(x) for x in segments)
        if not segments or min(segments) < 0:
            raise ValueError(f"cgx_torch.fsdp: bad layout {segments!r}")
        n = sum(segments)
        if n in self._layouts and self._layouts[n] != segments:
            self._layouts[n] = None  # two layouts of one size: buckets from the start
        else:
            self._layouts.setdefault(n, segments)
        self._index.pop(n, None)

    def _padded(self, n):
        """(padded size, gather index or None, value positions or None) for a flat shard of n."""
        got = self._index.get(n)
        if got is None:
            b, segs = self.bucket, self._layouts.get(n)
            if not segs:
                got = (-(-n // b) * b, None, None)
            else:
                idx, keep, start, at = [], [], 0, 0
                for s in segs:
                    if s:
                        padded = -(-s // b) * b
                        idx.append(torch.arange(start, start + s))
                        idx.append(torch.full((padded - s,), start + s - 1))  # the last value again
                        keep.append(torch.arange(at, at + s))
                        at += padded
                    start += s
                got = (at, torch.cat(idx), torch.cat(keep))
            self._index[n] = got
        return got

    def payload_bytes(self, n):
        """Bytes one rank sends for a shard of n values."""
        npad = self._padded(n)[0]
        return npad + 8 * (npad // self.bucket)

    def quantize(self, x):
        """The payload (uint8) for the flat tensor x: codes, then float32 minima, then scales."""
        n, b = x.numel(), self.bucket
        npad, idx, _ = self._padded(n)
        nb = npad // b
        v = x.detach().reshape(-1).float()
        if idx is not None:
            v = v[idx.to(v.device)]
        elif npad != n:  # pad with the last value: the last bucket's range stays its own
            v = torch.cat([v, v[-1:].expand(npad - n)])
        v = v.view(nb, b)
        lo, hi = v.min(1).values, v.max(1).values
        bad = ~torch.isfinite(v).all(1)
        scale = (hi - lo) / 255.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = ((v - lo[:, None]) / scale[:, None]).round_().clamp_(0, 255)
        lo = torch.where(bad, torch.full_like(lo, float("nan")), lo)
        out = torch.empty(npad + 8 * nb, dtype=torch.uint8, device=x.device)
        out[:npad].copy_(codes.view(-1).to(torch.uint8))
        out[npad:npad + 4 * nb].view(torch.float32).copy_(lo)
        out[npad + 4 * nb:].view(torch.float32).copy_(scale)
        return out

    def dequantize(self, payload, n, out):
        """Writes the values of the gathered payloads (p rows) into out (p * n values)."""
        b = self.bucket
        npad, _, keep = self._padded(n)
        nb = npad // b
        p = payload.numel() // (npad + 8 * nb)
        rows = payload.view(p, -1)
        codes = rows[:, :npad].reshape(p, nb, b).float()
        lo = rows[:, npad:npad + 4 * nb].contiguous().view(torch.float32).view(p, nb, 1)
        scale = rows[:, npad + 4 * nb:].contiguous().view(torch.float32).view(p, nb, 1)
        vals = (codes * scale + lo).view(p, npad)
        vals = vals[:, keep.to(vals.device)] if keep is not None else vals[:, :n]
        out.view(p, n).copy_(vals)
        return out

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.calls += 1
        n = input_tensor.numel()
        exact_bytes = n * input_tensor.element_size()
        self.bytes_exact += exact_bytes
        if output_tensor.dtype not in _core.COMPRESSED_DTYPES or n == 0:
            self.bytes_sent += exact_bytes
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        p = group.size()
        payload = self.quantize(input_tensor)
        gathered = torch.empty(p * payload.numel(), dtype=torch.uint8, device=payload.device)
        self.quantized_calls += 1
        self.bytes_sent += payload.numel()
        if not async_op:
            dist.all_gather_into_tensor(gathered, payload, group=group)
            self.dequantize(gathered, n, output_tensor)
            return None
        work = dist.all_gather_into_tensor(gathered, payload, group=group, async_op=True)

        def finish(fut):
            fut.wait()
            self.dequantize(gathered, n, output_tensor)
            return [output_tensor]

        return _Work(work.get_future().then(finish))


class ReplicateAllReduce:
    """FSDP2 all-reduce hook (``FSDPModule.set_all_reduce_hook``) for HSDP built by hand:
    ``fully_shard`` over the shard group only (1-D), and this hook averaging each
    reduce-scatter output over ``group``, the replicate group (the ranks holding the same
    shard), with cgx's compressed allreduce (``cgx_torch.allreduce_``, ``average=True``).
    FSDP2's own HSDP all-reduce (a 2-D mesh) cannot be replaced: its hook runs after it.
    Correct with FSDP2's AVG and with forced sums (its post-division by the shard group's
    size runs after the hook)."""

    def __init__(self, group, bits=4, *, bucket=None, rounding=None, min_compressed=1024):
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"cgx_torch.fsdp: the replicate group must be a ProcessGroup (got {type(group).__name__})")
        self.group, self.bits = group, bits
        self.kw = {"bucket": bucket, "rounding": rounding, "min_compressed": min_compressed}
        if bits:
            _core.make_settings(bits, bucket or 1024, rounding or "stochastic", min_compressed)  # checks them now
        self.calls = 0

    def __call__(self, reduce_output):
        self.calls += 1
        if self.bits:
            kw = {k: v for k, v in self.kw.items() if v is not None}
            _core.allreduce_(reduce_output, self.bits, average=True, comm=self.group, **kw)
        else:
            dist.all_reduce(reduce_output, group=self.group)
            reduce_output.div_(self.group.size())


@dataclass
class Installed:
    """What compress() installed: the Comm objects (their counters), the HSDP hook and the modules."""

    reduce_scatter: Optional[CompressedReduceScatter]
    all_gather: Optional[QuantizedAllGather]
    modules: List[torch.nn.Module] = field(default_factory=list)
    replicate: Optional[ReplicateAllReduce] = None


def _shard_layout(module):
    """The sizes of the parameters' padded shards in FSDPModule `module`'s flat all-gather
    input, in FSDP2's order (FSDP2's internals: None where this torch lays them out otherwise
    or the module has several parameter groups)."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) != 1:
            return None
        return [fp.padded_sharded_param_size.numel() for fp in groups[0].fsdp_params]
    except (AttributeError, TypeError):
        return None


def compress(module, bits=4, *, params_bits=None, bucket=None, rounding=None, min_compressed=1024,
             params_bucket=256, replicate_group=None):
    """Installs cgx on every FSDPModule inside ``module`` (``fully_shard`` it first):
    gradients reduce-scattered by cgx at ``bits`` (0: leave FSDP2's own reduce-scatter)
    and, with ``params_bits=8``, parameters all-gathered as 8-bit codes with per-bucket
    scales (buckets of ``params_bucket`` values); with ``replicate_group`` (HSDP by hand:
    the model sharded over a 1-D shard group), each reduce-scatter output averaged over that
    group by cgx's compressed allreduce at ``bits`` (a ReplicateAllReduce hook). Collective
    only in what these do on first use. Returns an Installed."""
    _require()
    if params_bits not in (None, 0, 8):
        raise ValueError(f"cgx_torch.fsdp.compress: params_bits must be None (exact all-gather) or 8 (got "
                         f"{params_bits!r})")
    mods = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not mods:
        raise ValueError("cgx_torch.fsdp.compress: no FSDPModule in the model: call fully_shard on it (and its "
                         "blocks) first")
    rs = CompressedReduceScatter(bits, bucket=bucket, rounding=rounding, min_compressed=min_compressed) if bits \
        else None
    ag = QuantizedAllGather(params_bits, bucket=params_bucket) if params_bits else None
    if ag is not None:
        for m in mods:
            segs = _shard_layout(m)
            if segs is not None:
                ag.add_layout(segs)
    rep = None
    if replicate_group is not None:
        rep = ReplicateAllReduce(replicate_group, bits, bucket=bucket, rounding=rounding,
                                 min_compressed=min_compressed)
    for m in mods:
        if rs is not None:
            m.set_custom_reduce_scatter(rs)
        if ag is not None:
            m.set_custom_all_gather(ag)
        if rep is not None:
            m.set_all_reduce_hook(rep)
    return Installed(rs, ag, mods, rep)


def free():
    """Drops the private gloo groups' cgx channels (their plans live in the Comm objects)."""
    _gloo_groups.clear()


__all__ = ["CompressedReduceScatter", "Installed", "QuantizedAllGather", "ReplicateAllReduce", "TORCH_NEEDED",
           "available", "compress", "free"]
