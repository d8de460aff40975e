"""Registers the ``cgx`` torch.distributed backend without ``import cgx_torch``.

Installed with cgx_torch as two entry points that torch calls itself:

- ``torch.backends`` (torch >= 2.5): ``autoload()`` runs at ``import torch`` (unless
  TORCH_DEVICE_BACKEND_AUTOLOAD=0);
- ``torch.distributed.backends`` (newer torch): ``register()`` runs when a process group
  asks for a backend torch does not know yet.

So ``dist.init_process_group("cgx")``, ``"cpu:cgx,cuda:cgx"``, ``new_group(backend="cgx")``
and a script's ``--backend=cgx`` work with no cgx in the script. This module is imported
inside ``import torch``: it imports nothing of cgx_torch (its extension is loaded when the
first ``cgx`` group is created), initialises neither MPI nor CUDA, and never raises (a
failure is a warning; the group's creation then says what went wrong).
"""
import warnings

_NAME = "cgx"


def _create(dist_backend_opts, backend_options):
    """torch.distributed's constructor of a `cgx` backend (extended API): cgx_torch's."""
    from cgx_torch import backend  # the extension: loaded here, at the first group

    return backend.create_backend(dist_backend_opts, backend_options)


def register():
    """Registers `cgx` with torch.distributed unless it is registered (by this or by
    cgx_torch.backend). Returns whether `cgx` is registered afterwards."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return False
        if _NAME.upper() in getattr(dist.Backend, "_plugins", {}) or _NAME in getattr(dist.Backend, "backend_list", []):
            return True
        dist.Backend.register_backend(_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
        return True
    except Exception as e:  # noqa: BLE001 (never raise out of torch's import)
        warnings.warn(f"cgx_torch: could not register the `cgx` torch.distributed backend ({e!r}); "
                      "`import cgx_torch` registers it and says why it cannot", RuntimeWarning, stacklevel=2)
        return False


def autoload():
    """The `torch.backends` entry point (called by `import torch`): register()."""
    register()
