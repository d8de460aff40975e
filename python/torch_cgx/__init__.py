"""``import torch_cgx``: the name the original CGX system (IST-DASLab's torch_cgx) gave its
PyTorch backend, so that its users' scripts run unchanged on cgx.

- Importing it registers the ``cgx`` torch.distributed backend (``import cgx_torch``) and
  switches that backend to torch_cgx's defaults (``cgx_torch.backend.use_defaults
  ("torch_cgx")``): nothing is compressed unless ``CGX_COMPRESSION_QUANTIZATION_BITS`` is
  below 32, tensors of 16 values and more are compressed then, and the
  ``CGX_COMPRESSION_*`` variables are read at every call.
- ``register_layer``, ``set_quantization_bits`` and ``set_quantization_bucket_size`` keep
  per-layer settings, keyed by (DDP bucket index, layer index in the bucket), which
  ``cgx_utils.cgx_hook`` applies (torch_cgx's backend applied them; here the hook reduces
  the buckets itself, so they take effect through it).
- Under an MPI launcher (Open MPI's mpirun, MPICH's hydra or another PMI one) the import fills in
  ``RANK`` and ``WORLD_SIZE`` (and ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) from the
  launcher's variables where the script has not set them, so that
  ``init_process_group("cgx", init_method="env://")`` finds them; ``MASTER_ADDR`` and
  ``MASTER_PORT`` stay the script's (or the job's) to set.
- At exit cgx_torch frees cgx's plans, collects DDP's reference cycles and destroys the
  default group if the script did not, so that the process exits with status 0
  (cgx_torch._core._end_cleanly: every script that uses cgx_torch gets it).

See docs/torch_cgx.md.
"""
import os
import threading

import cgx_torch  # noqa: F401,E501 (registers the `cgx` backend; its exit handlers end the job cleanly)
from cgx_torch import _core
from cgx_torch import backend as _backend

#: (rank, size, local rank, local size) variables of the MPI launchers, first match wins.
_LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def fill_rank_from_launcher(environ=None):
    """Sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from an MPI launcher's
    variables where they are unset (never overrides one that is set). Returns the names
    it set."""
    env = os.environ if environ is None else environ
    for rank, size, local_rank, local_size in _LAUNCHERS:
        if rank in env and size in env:
            pairs = [("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", local_rank),
                     ("LOCAL_WORLD_SIZE", local_size)]
            done = []
            for name, src in pairs:
                if src is not None and src in env and name not in env:
                    env[name] = env[src]
                    done.append(name)
            return done
    return []


fill_rank_from_launcher()
_backend.use_defaults("torch_cgx")

#: Bucket sizes the host plans are compiled for (what set_quantization_bucket_size takes).
BUCKET_SIZES = tuple(_core._BUCKETS)
#: The bits torch_cgx means "uncompressed" by.
NO_COMPRESSION = 32

_lock = threading.Lock()
# (bucket index, layer index) -> [values or None (unknown: set_* before register_layer), bits, bucket size or None]
_layers = {}


def _index(name, v):
    """v as a non-negative int (ValueError/TypeError naming the argument otherwise)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"torch_cgx: {name} must be an int (got {type(v).__name__} {v!r})")
    if v < 0:
        raise ValueError(f"torch_cgx: {name} must be >= 0 (got {v})")
    return v


def check_bits(bits):
    """bits if it is 1..8 or 32 (uncompressed); ValueError/TypeError otherwise."""
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"torch_cgx: bits must be an int (got {type(bits).__name__} {bits!r})")
    if not (1 <= bits <= 8 or bits == NO_COMPRESSION):
        raise ValueError(f"torch_cgx: bits must be 1..8, or 32 for uncompressed (got {bits})")
    return bits


def check_bucket_size(bucket_size):
    """bucket_size if the plans are compiled for it; ValueError/TypeError otherwise."""
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int):
        raise TypeError(f"torch_cgx: bucket_size must be an int (got {type(bucket_size).__name__} {bucket_size!r})")
    if bucket_size not in BUCKET_SIZES:
        raise ValueError(f"torch_cgx: bucket size {bucket_size} is not compiled into cgx's plans; the compiled sizes "
                         f"are {', '.join(map(str, BUCKET_SIZES))}")
    return bucket_size


def register_layer(bucket_idx, layer_idx, numel, bits, bucket_size):
    """Sets layer ``layer_idx`` of DDP bucket ``bucket_idx`` (``numel`` values) to ``bits``
    (1..8; 32: uncompressed) with max-min buckets of ``bucket_size`` values. Applied by
    cgx_utils.cgx_hook from its next reduction of that bucket, where the layer still has
    ``numel`` values (DDP lays its buckets out anew after the first step). Local: every
    rank must make the same calls (the hook checks that, collectively, when it builds the
    bucket's plan)."""
    key = (_index("bucket_idx", bucket_idx), _index("layer_idx", layer_idx))
    entry = [_index("numel", numel), check_bits(bits), check_bucket_size(bucket_size)]
    with _lock:
        _layers[key] = entry


def _set(bucket_idx, layer_idx, slot, value):
    """Sets one field of a layer's entry (created, for any size, when not registered)."""
    key = (_index("bucket_idx", bucket_idx), _index("layer_idx", layer_idx))
    with _lock:
        entry = _layers.setdefault(key, [None, None, None])
        entry[slot] = value


def set_quantization_bits(bucket_idx, layer_idx, bits):
    """Sets the bits (1..8; 32: uncompressed) of layer ``layer_idx`` of DDP bucket ``bucket_idx``."""
    _set(bucket_idx, layer_idx, 1, check_bits(bits))


def set_quantization_bucket_size(bucket_idx, layer_idx, bucket_size):
    """Sets the max-min bucket size of layer ``layer_idx`` of DDP bucket ``bucket_idx`` (its
    bits are left as they are; torch_cgx set the bits to the size here)."""
    _set(bucket_idx, layer_idx, 2, check_bucket_size(bucket_size))


def layer_setting(bucket_idx, layer_idx, numel):
    """(bits or None, bucket size or None) set for that layer, if it has ``numel`` values
    (None, None where nothing applies); 'mismatch' as the first item where an entry was
    registered for another number of values."""
    with _lock:
        entry = _layers.get((bucket_idx, layer_idx))
        if entry is None:
            return None, None
        n, bits, bucket = entry
    if n is not None and n != numel:
        return "mismatch", n
    return bits, bucket


def registered_layers():
    """{(bucket index, layer index): (values or None, bits or None, bucket size or None)}: a copy."""
    with _lock:
        return {k: tuple(v) for k, v in _layers.items()}


def clear_layers():
    """Forgets every per-layer setting."""
    with _lock:
        _layers.clear()


__all__ = ["BUCKET_SIZES", "NO_COMPRESSION", "clear_layers", "fill_rank_from_launcher", "layer_setting",
           "register_layer", "registered_layers", "set_quantization_bits", "set_quantization_bucket_size"]
