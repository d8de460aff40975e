"""``from cgx_utils import CGXState, cgx_hook``: the DDP communication hook of the original
CGX system (torch_cgx), with its constructor and its settings, on cgx_torch's layer-wise hook.

.. code-block:: python

    state = CGXState(dist.group.WORLD, layer_min_size=1024,
                     compression_params={"bits": 4, "bucket_size": 512})
    model.register_comm_hook(state, cgx_hook)

Each DDP bucket is reduced by one cgx layer-wise plan, one layer per parameter:

- bits: ``compression_params["bits"]``, else ``CGX_COMPRESSION_QUANTIZATION_BITS``, else
  32; 32 (or 0) means uncompressed, 1..8 compressed;
- bucket size: ``compression_params["bucket_size"]``, else ``CGX_COMPRESSION_BUCKET_SIZE``,
  else cgx's measured default for the width (128 at 1-2 bits, 1024 from 3 bits on);
- layers with one dimension (biases, norms) or fewer values than ``layer_min_size``
  (at least ``CGX_COMPRESSION_MINIMAL_SIZE``, default 16) go uncompressed;
- per-layer settings from ``torch_cgx.register_layer`` / ``set_quantization_bits`` /
  ``set_quantization_bucket_size`` win over these for their layer.

Rounding is cgx's default for the width (stochastic from 3 bits on, nearest at 1-2 bits),
with error feedback at 1 bit (cgx_torch.CGXState's defaults). The hook returns the
average over the group, as torch_cgx's did, and compresses from the first step (torch_cgx
compressed from the third: its hook registered the layers at step 2). It reduces over
the ``cgx`` backend's group or any other torch.distributed group (gloo), on the state's
background thread while the backward pass goes on. See docs/torch_cgx.md.
"""
import os
import warnings

import torch
import torch.distributed as dist

import torch_cgx
from cgx_torch import _core
from cgx_torch import backend as _backend
from cgx_torch import ddp as _ddp

VALUE_NO_COMPRESS = torch_cgx.NO_COMPRESSION
_BITS = "CGX_COMPRESSION_QUANTIZATION_BITS"
_BUCKET = "CGX_COMPRESSION_BUCKET_SIZE"
_MIN_SIZE = "CGX_COMPRESSION_MINIMAL_SIZE"
_PARAMS = ("bits", "bucket_size")


def _env_int(name, default):
    """The environment variable `name` as an int (`default` when unset or empty)."""
    v = os.environ.get(name, "")
    if v.strip() == "":
        return default
    try:
        return int(v, 10)
    except ValueError:
        raise ValueError(f"cgx_utils: {name}={v!r} is not an integer") from None


def _state_bits(bits, where):
    """torch_cgx's bits (1..8; 0 or 32: uncompressed) as cgx's (0: uncompressed)."""
    if bits == 0:
        return 0
    try:
        torch_cgx.check_bits(bits)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{e} (from {where})") from None
    return 0 if bits == VALUE_NO_COMPRESS else bits


class CGXState(_ddp.CGXState):
    """torch_cgx's hook state (see the module): ``process_group`` (default: the default
    group), ``layer_min_size``, ``compression_params`` ({"bits": ..., "bucket_size": ...}).
    The same settings on every rank (checked when a bucket's plan is built: MismatchError
    on every rank). Everything cgx_torch.CGXState offers (average_bits(), layer_bits(),
    state_dict(), free()) works on it."""

    def __init__(self, process_group=None, layer_min_size=1024, compression_params=None):
        """ValueError/TypeError for bad settings, in the arguments or the environment."""
        params = dict(compression_params or {})
        unknown = sorted(set(params) - set(_PARAMS))
        if unknown:
            raise ValueError(f"cgx_utils: compression_params takes {list(_PARAMS)} (got {unknown})")
        if isinstance(layer_min_size, bool) or not isinstance(layer_min_size, int) or layer_min_size < 0:
            raise ValueError(f"cgx_utils: layer_min_size must be an int >= 0 (got {layer_min_size!r})")
        if "bits" in params:
            bits = _state_bits(params["bits"], 'compression_params["bits"]')
        else:
            bits = _state_bits(_env_int(_BITS, VALUE_NO_COMPRESS), _BITS)
        if "bucket_size" in params:
            bucket = torch_cgx.check_bucket_size(params["bucket_size"])
        else:
            bucket = _env_int(_BUCKET, None)
            bucket = _core.default_bucket(bits) if bucket is None else torch_cgx.check_bucket_size(bucket)
        self.layer_min_size = max(layer_min_size, _env_int(_MIN_SIZE, 16))
        self.quantization_bits = bits or VALUE_NO_COMPRESS
        self.quantization_bucket_size = bucket
        _backend._answer_travel_variables()  # torch_cgx's transport variables: a warning, or an error
        pg = dist.group.WORLD if process_group is None else process_group
        self.process_group = pg
        super().__init__(pg, bits=bits, bucket=bucket, min_compressed=self.layer_min_size)
        # what pickling keeps (the resolved settings: cgx_torch.CGXState.__setstate__ calls __init__ with them)
        self._ctor = {"layer_min_size": self.layer_min_size,
                      "compression_params": {"bits": self.quantization_bits, "bucket_size": bucket}}
        self._warned = set()

    @property
    def step(self):
        """Steps begun (reductions of bucket 0)."""
        return self.steps

    def should_compress_(self, tensor):
        """Whether a gradient of this shape is compressed by default (torch_cgx's rule)."""
        return tensor.dim() > 1 and tensor.numel() >= self.layer_min_size

    def layer_settings(self, index, layers):
        """(bits, bucket) of each layer of bucket `index`, laid out as `layers` ((offset,
        count, one-dimensional) each; bits 0: uncompressed): the state's, or torch_cgx's
        per-layer settings where set for a layer of that size."""
        out = []
        default_bits, bucket = self.settings.bits, self.settings.bucket
        for i, (_, count, one_dimensional) in enumerate(layers):
            bits = default_bits if not one_dimensional and count >= self.layer_min_size else 0
            b, k = torch_cgx.layer_setting(index, i, count)
            if b == "mismatch":
                if (index, i) not in self._warned:
                    self._warned.add((index, i))
                    warnings.warn(f"cgx_utils: torch_cgx.register_layer({index}, {i}, ...) was for {k} values; that "
                                  f"layer has {count}: its default settings apply", stacklevel=2)
                b, k = None, None
            if b is not None:
                bits = 0 if b == VALUE_NO_COMPRESS else b
            out.append((bits, bucket if k is None else k))
        return out

    def reduce(self, index, buf, layers, overrides=None):
        """cgx_torch.CGXState.reduce with every layer's (bits, bucket) from layer_settings()."""
        if overrides is None and not (isinstance(buf, torch.Tensor) and buf.dtype in _core.EXACT_DTYPES):
            overrides = self.layer_settings(index, layers)
        return super().reduce(index, buf, layers, overrides)

    def plan_for(self, index, buf, layers, work=None, warm=False, overrides=None):
        """The plan of bucket `index` with every layer's (bits, bucket) given by
        `overrides` (collective when built: the layout and every layer's setting agreed);
        cgx_torch.CGXState's plan where no overrides are given."""
        if warm or overrides is None:
            return super().plan_for(index, buf, layers, work, warm)
        if index == 0:
            # Once per step (every rank reduces bucket 0 first): torch_cgx's per-layer settings,
            # set locally, must be the same on every rank, or a rank that alone changed one would
            # build a new plan while the others run the old one.
            _core.agree(self.group, ("torch_cgx.register_layer", sorted(torch_cgx.registered_layers().items())),
                        None)
        overrides = tuple(overrides)
        layers = tuple((o, c, b == 0) for (o, c, _), (b, _) in zip(layers, overrides))
        key = (str(buf.dtype), _core.device_key(buf), buf.numel(), layers, self.settings, overrides)
        cached = self.plans.get(index)
        if cached is not None and cached[0] == key:
            return cached[1]
        if index == 0:  # DDP laid its buckets out anew: the old plans are stale
            self.plans.clear()
        self.plans.pop(index, None)
        _core.agree(self.group, (index, "torch_cgx") + key,
                    _core.tensor_problem(buf, True if self.group.stages_cuda else None))
        plan = _core.new_plan(self.group, buf if work is None else work, list(layers), self.settings)
        snap = plan.snapshot()
        snap["settings"] = [(b, k) for b, k in overrides]
        plan.restore(snap)
        self.plans[index] = (key, plan)
        return plan


def cgx_hook(state: CGXState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch_cgx's DDP communication hook: reduces the bucket with cgx, each layer with
    its settings (see the module), and returns a Future holding the average."""
    if not isinstance(state, CGXState):
        raise TypeError(f"cgx_utils.cgx_hook needs a cgx_utils.CGXState (got {type(state).__name__})")
    return _ddp.cgx_hook(state, bucket)


__all__ = ["CGXState", "VALUE_NO_COMPRESS", "cgx_hook"]
