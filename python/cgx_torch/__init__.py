"""cgx_torch: cgx's compressed allreduce for PyTorch.

- ``ddp_model.register_comm_hook(cgx_torch.CGXState(bits=4), cgx_torch.cgx_hook)``: a
  DDP communication hook reducing each bucket with cgx's layer-wise plan (one layer per
  parameter, small and one-dimensional ones uncompressed; adaptive bits and error
  feedback optional).
- ``cgx_torch.allreduce_(tensor, bits=4)``: an in-place compressed sum over an mpi4py
  communicator, for code that is not DDP.
- the ``cgx`` torch.distributed backend: ``dist.init_process_group("cgx")``, found by
  torch through its entry points once cgx_torch is installed (no import needed; see
  cgx_torch.backend), with FSDP2's plug-ins in ``cgx_torch.fsdp``; torch_cgx's scripts
  run through the ``torch_cgx`` and ``cgx_utils`` modules installed with it.

The ranks share torch.distributed's process group (launch with torchrun; cgx's messages
go over the group's own gloo send/recv, no MPI needed) or an MPI communicator (launch
with mpirun; mpi4py's MPI.COMM_WORLD or one you pass). CPU tensors (float32, float64; float16 and bfloat16 through a float32
copy) go through the host plans; CUDA tensors through the device plans where this build
has them (``device_plans_compiled()``); integer, bool and complex tensors are reduced
exactly by MPI. See docs/pytorch.md.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from ._C import PathChoice, PlanConfig, Plan, build_info, device_plans_compiled, mpi_compiled
from ._core import (COMPRESSED_DTYPES, EXACT_DTYPES, SUPPORTED_DTYPES, AdaptiveOptions, CGXError, MismatchError, Settings, allreduce_, free_plans,
                    make_settings)
from .ddp import CGXState, bucket_layers, cgx_hook, init_process_group_from_mpi
from . import backend

backend.register()  # dist.init_process_group("cgx") (torch >= 2.x; installed: registered by torch itself)
path_stats = backend.path_stats  # what a `cgx` group's measured choice picked (CGXState.path_stats: the hook's)


def __getattr__(name):
    """cgx_torch.fsdp (FSDP2's plug-ins) is imported when first used: it imports FSDP2."""
    if name == "fsdp":
        import importlib

        return importlib.import_module(".fsdp", __name__)
    raise AttributeError(f"module 'cgx_torch' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "AdaptiveOptions", "COMPRESSED_DTYPES", "CGXError", "EXACT_DTYPES", "CGXState", "MismatchError", "PathChoice", "Plan",
    "PlanConfig", "SUPPORTED_DTYPES", "path_stats",
    "Settings", "allreduce_", "bucket_layers", "build_info", "cgx_hook", "device_plans_compiled", "free_plans",
    "init_process_group_from_mpi", "make_settings", "mpi_compiled",
]
