"""The ``cgx`` torch.distributed backend (torch >= 2.x): ``import cgx_torch`` registers it, so
that ``dist.init_process_group("cgx")`` (or ``"cpu:cgx,cuda:cgx"``) works as it does with
torch_cgx. Inside, each group has a gloo backend over the same Store, rank and size:

- ``all_reduce`` of one float tensor (float32, float64; float16 and bfloat16 through a
  float32 copy) with SUM or AVG is cgx's compressed layer-wise plan, one layer, over the
  gloo backend's send/recv (cgx_torch's process group transport); CUDA tensors through a
  host copy;
- ``reduce_scatter_tensor`` of such a tensor (SUM, AVG) is cgx's compressed reduce-scatter
  (``layerwise_plan::reduce_scatter``: one layer per rank's shard, the first phase of the
  allreduce alone, half its bytes): each rank's shard of the sum, its own values exact
  and the others' compressed;
- every other op, dtype and reduction goes to gloo unchanged and exact.

Settings come from the environment, with torch_cgx's names where it has them:
``CGX_COMPRESSION_QUANTIZATION_BITS`` (1..8; 32 or 0: uncompressed; default 4),
``CGX_COMPRESSION_BUCKET_SIZE`` (128, 512 or 1024; default 1024),
``CGX_COMPRESSION_MINIMAL_SIZE`` (tensors with fewer values go uncompressed; default 1024),
and cgx's own ``CGX_COMPRESSION_ROUNDING`` (stochastic or nearest) and
``CGX_COMPRESSION_SEED``; ``cgx_torch.backend.configure(bits=..., ...)`` overrides them for
the groups created after it. Every rank must use the same settings (checked once per
tensor shape: MismatchError on every rank).

The compressed calls run on the calling thread and return a completed Work (DDP's
buckets are reduced one after the other, not overlapped with the backward pass; the
``cgx_hook`` overlaps them).
"""
import datetime
import os

import torch
import torch.distributed as dist

from . import _C, _core

try:  # torch >= 2.x: Python subclasses of c10d's Backend
    from torch._C._distributed_c10d import Backend as _C10dBackend
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError:  # torch 1.13: no `cgx` backend (the hook and allreduce_ work)
    _C10dBackend = None

_overrides = {}

_ENV = {
    "bits": "CGX_COMPRESSION_QUANTIZATION_BITS",
    "bucket": "CGX_COMPRESSION_BUCKET_SIZE",
    "min_compressed": "CGX_COMPRESSION_MINIMAL_SIZE",
    "rounding": "CGX_COMPRESSION_ROUNDING",
    "seed": "CGX_COMPRESSION_SEED",
}


def configure(**settings):
    """Overrides the environment's settings for `cgx` groups created from now on:
    bits, bucket, min_compressed, rounding, seed (see cgx_torch.make_settings)."""
    unknown = set(settings) - set(_ENV)
    if unknown:
        raise TypeError(f"cgx_torch.backend.configure: unknown settings {sorted(unknown)} (known: {sorted(_ENV)})")
    _core.make_settings(**{**_env_settings(), **settings})  # checks them now
    _overrides.update(settings)


def _env_settings():
    """The settings the environment gives (ValueError for a value that is not a number)."""
    out = {}
    for key, var in _ENV.items():
        v = os.environ.get(var)
        if v is None or v == "":
            continue
        if key == "rounding":
            out[key] = v
            continue
        try:
            n = int(v, 0)
        except ValueError:
            raise ValueError(f"cgx_torch: {var}={v!r} is not an integer") from None
        if key == "bits" and n == 32:
            n = 0  # torch_cgx's "no compression"
        out[key] = n
    return out


def settings():
    """The settings a `cgx` group created now would use."""
    return _core.make_settings(**{**_env_settings(), **_overrides})


def _done(tensors):
    """A completed Work holding `tensors` (what a compressed call returns)."""
    fut = torch.futures.Future()
    fut.set_result(tensors)
    return _create_work_from_future(fut)


if _C10dBackend is not None:

    class _BackendGroup(_core.TorchGroup):
        """TorchGroup over the gloo backend inside a CGXBackend."""

        def __init__(self, gloo, store, timeout):
            self.pg = gloo
            self.timeout_ms = max(1, int(timeout.total_seconds() * 1000))
            self.channel = _C.Channel(gloo, store, self.timeout_ms, "cgx_torch/backend-failure")
            self.size, self.rank = self.channel.size, self.channel.rank
            self.key = ("backend", id(self))

        def exact_allreduce_(self, t):
            """Sums t in place with the gloo backend (exact)."""
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            self.pg.allreduce([t], opts).wait()
            return t

    class CGXBackend(_C10dBackend):
        """torch.distributed backend ``cgx`` (see the module comment)."""

        def __init__(self, store, rank, size, timeout):
            """Called by init_process_group / new_group with the group's Store, rank, size, timeout."""
            super().__init__(rank, size)
            if not isinstance(timeout, datetime.timedelta):
                timeout = datetime.timedelta(milliseconds=int(timeout))
            self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
            self._settings = settings()
            self._group = _BackendGroup(self._gloo, store, timeout)
            self._plans = {}

        def getBackendName(self):
            return "cgx"

        def shutdown(self):
            """destroy_process_group: frees the plans and the channel (its watcher thread)."""
            self._plans.clear()
            self._group = None

        # The compressed ops.
        def _compressible(self, t, op):
            """Whether cgx compresses this reduction of t."""
            return (isinstance(t, torch.Tensor) and t.dtype in _core.COMPRESSED_DTYPES and t.layout == torch.strided
                    and t.device.type in ("cpu", "cuda") and t.is_contiguous()
                    and (op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG))  # (SUM == op is False)

        def _entry(self, t, scatter):
            """(plan, staging buffer or None) for t, built once per shape, dtype, device and
            operation (collective when built): one layer (allreduce) or one layer per rank's
            shard (reduce-scatter). A float16, bfloat16 or CUDA tensor, and every
            reduce-scatter's input, goes through a float32 (or float64) host buffer kept
            with the plan."""
            s = self._settings
            key = (tuple(t.shape), str(t.dtype), t.device.type, "reduce_scatter" if scatter else "allreduce")
            entry = self._plans.get(key)
            if entry is None:
                _core.agree(self._group, key + (s,), None)
                # (a reduce-scatter leaves all but its shard unspecified: always on a copy)
                staged = scatter or t.dtype in _core.STAGED_DTYPES or t.device.type != "cpu"
                buf = torch.empty(t.numel(), dtype=torch.float32 if t.dtype in _core.STAGED_DTYPES else t.dtype) \
                    if staged else None
                n, p = t.numel(), self._group.size
                layers = [(r * (n // p), n // p, False) for r in range(p)] if scatter else [(0, n, False)]
                plan = _core.new_plan(self._group, buf if staged else t, layers, s)
                entry = self._plans[key] = (plan, buf)
            return entry

        def _reduce(self, t, average):
            """Sums (or averages) t over the group in place with cgx (collective)."""
            plan, buf = self._entry(t, False)
            work = t if buf is None else buf.view(t.shape).copy_(t)
            plan.run(work)
            if average:
                work.div_(self._group.size)
            if work is not t:
                t.copy_(work)
            return t

        def allreduce(self, tensors, opts):
            op = opts.reduceOp
            if len(tensors) == 1 and self._compressible(tensors[0], op):
                self._reduce(tensors[0], op == dist.ReduceOp.AVG)
                return _done(tensors)
            if op == dist.ReduceOp.AVG:  # gloo has no AVG: its sum, divided
                sum_opts = dist.AllreduceOptions()
                sum_opts.reduceOp = dist.ReduceOp.SUM
                self._gloo.allreduce(tensors, sum_opts).wait()
                for t in tensors:
                    t.div_(self._group.size)
                return _done(tensors)
            return self._gloo.allreduce(tensors, opts)

        def reduce_scatter_single(self, output, input, opts):  # noqa: A002 (torch's name)
            return self._reduce_scatter(output, input, opts)

        def _reduce_scatter_base(self, output, input, opts):  # noqa: A002
            return self._reduce_scatter(output, input, opts)

        def _reduce_scatter(self, output, input, opts):  # noqa: A002
            op = opts.reduceOp
            p = self._group.size
            if (self._compressible(input, op) and input.numel() == p * output.numel()
                    and output.dtype == input.dtype):
                plan, buf = self._entry(input, True)
                work = buf.view(input.shape).copy_(input).view(-1)
                plan.reduce_scatter(work)
                m = output.numel()
                shard = work[self._group.rank * m:(self._group.rank + 1) * m]
                if op == dist.ReduceOp.AVG:
                    shard.div_(p)
                output.view(-1).copy_(shard)
                return _done([output])
            chunks = list(input.view(-1).chunk(p)) if input.numel() == p * output.numel() else None
            if chunks is None:
                raise ValueError(f"cgx: reduce_scatter_tensor: input of {input.numel()} values for an output of "
                                 f"{output.numel()} on {p} ranks")
            sum_op = dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op
            w = torch.empty_like(input)
            w.copy_(input)
            o = dist.AllreduceOptions()
            o.reduceOp = sum_op
            self._gloo.allreduce([w], o).wait()
            m = output.numel()
            output.view(-1).copy_(w.view(-1)[self._group.rank * m:(self._group.rank + 1) * m])
            if op == dist.ReduceOp.AVG:
                output.div_(p)
            return _done([output])

        # Everything else: gloo, unchanged.
        def broadcast(self, tensors, opts):
            return self._gloo.broadcast(tensors, opts)

        def allreduce_coalesced(self, tensors, opts):
            return self._gloo.allreduce_coalesced(tensors, opts)

        def reduce(self, tensors, opts):
            return self._gloo.reduce(tensors, opts)

        def allgather(self, outputs, inputs, opts):
            return self._gloo.allgather(outputs, inputs, opts)

        def all_gather_single(self, output, input, opts):  # noqa: A002
            return self._gloo._allgather_base(output, input, opts)

        def _allgather_base(self, output, input, opts):  # noqa: A002
            return self._gloo._allgather_base(output, input, opts)

        def allgather_coalesced(self, outputs, inputs, opts):
            return self._gloo.allgather_coalesced(outputs, inputs, opts)

        def gather(self, outputs, inputs, opts):
            return self._gloo.gather(outputs, inputs, opts)

        def scatter(self, outputs, inputs, opts):
            return self._gloo.scatter(outputs, inputs, opts)

        def reduce_scatter(self, outputs, inputs, opts):
            return self._gloo.reduce_scatter(outputs, inputs, opts)

        def alltoall(self, outputs, inputs, opts):
            return self._gloo.alltoall(outputs, inputs, opts)

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):  # noqa: A002
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

        def send(self, tensors, dst, tag):
            return self._gloo.send(tensors, dst, tag)

        def recv(self, tensors, src, tag):
            return self._gloo.recv(tensors, src, tag)

        def recv_anysource(self, tensors, tag):
            return self._gloo.recv_anysource(tensors, tag)

        def barrier(self, opts):
            return self._gloo.barrier(opts)

    def _create(store, rank, size, timeout):
        """The backend's constructor for torch.distributed."""
        return CGXBackend(store, rank, size, timeout)

    def register():
        """Registers ``cgx`` with torch.distributed (once; import cgx_torch does it)."""
        if "cgx" in getattr(dist.Backend, "backend_list", []) or hasattr(dist.Backend, "CGX"):
            return
        dist.Backend.register_backend("cgx", _create, devices=["cpu", "cuda"])

else:

    def register():
        """torch 1.13: no `cgx` backend (the hook and allreduce_ work over gloo or MPI)."""
