"""Which transport a torch.distributed group's CUDA tensors take (CGX_TORCH_DEVICE_TRANSPORT),
checked in one process on any build (CI's is CPU-only):

- unset or "host": staged through the host (the default); "auto": cuda_ipc only where it is
  compiled, a GPU is visible and torchrun's LOCAL_WORLD_SIZE equals WORLD_SIZE; a value
  that is none of host, cuda_ipc, auto: ValueError;
- "cuda_ipc" where the build lacks it: CGXError at the group's first use, never a silent
  host copy; build_info() and device_transports() say what was compiled;
- the extension's Store plan refuses CPU tensors and an unknown transport, and where CUDA
  is not compiled says so (CGXError).
Run: python test_device_choice.py  (prints "test_device_choice: PASS").
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import cgx_torch
from cgx_torch import _C, _core

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, flush=True)


def raises(exc, fn, says=""):
    try:
        fn()
    except exc as e:
        if says and says not in str(e):
            failures.append(f"{exc.__name__} without {says!r}: {e}")
            print(f"FAIL: {exc.__name__} without {says!r}: {e}", flush=True)
        return
    except Exception as e:  # noqa: BLE001
        failures.append(f"expected {exc.__name__}, got {type(e).__name__}: {e}")
        print(f"FAIL: expected {exc.__name__}, got {type(e).__name__}: {e}", flush=True)
        return
    failures.append(f"expected {exc.__name__} ({says}), got no error")
    print(f"FAIL: expected {exc.__name__} ({says}), got no error", flush=True)


def with_env(**kv):
    for k, v in kv.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def main():
    compiled = _C.device_transports()
    info = cgx_torch.build_info()
    print(f"device_transports: {compiled!r}; build_info: {info}", flush=True)
    check(("cuda_ipc" in compiled) == _C.device_plans_compiled(), "device_transports() and device_plans_compiled() disagree")
    if _C.device_plans_compiled():
        check("transports: " in info and "cuda_ipc (Store)" in info, "build_info() does not name the transports")
    else:
        check("device plans: not compiled" in info, "build_info() does not say 'device plans: not compiled'")

    with_env(CGX_TORCH_DEVICE_TRANSPORT=None)
    check(_core.device_transport_choice() is None, "unset: not host staging")
    for v in ("host", " HOST ", ""):
        with_env(CGX_TORCH_DEVICE_TRANSPORT=v)
        check(_core.device_transport_choice() is None, f"{v!r}: not host staging")
    with_env(CGX_TORCH_DEVICE_TRANSPORT="nvlink")
    raises(ValueError, _core.device_transport_choice, "not one of host, cuda_ipc, auto")
    # auto: cuda_ipc only with every condition
    with_env(CGX_TORCH_DEVICE_TRANSPORT="auto", LOCAL_WORLD_SIZE="2", WORLD_SIZE="4")
    check(_core.device_transport_choice() is None, "auto on two nodes: not host staging")
    with_env(LOCAL_WORLD_SIZE="4", WORLD_SIZE="4")
    want = "cuda_ipc" if ("cuda_ipc" in compiled and torch.cuda.is_available()) else None
    check(_core.device_transport_choice() == want, f"auto on one node: {_core.device_transport_choice()!r}, not {want!r}")
    check(_core.device_transport_choice(have_store=False) is None, "auto without a Store: not host staging")
    with_env(CGX_TORCH_DEVICE_TRANSPORT="cuda_ipc")
    if "cuda_ipc" not in compiled:
        raises(_C.CGXError, _core.device_transport_choice, "no device plans over cuda_ipc")
    else:
        check(_core.device_transport_choice() == "cuda_ipc", "cuda_ipc asked for and compiled: not chosen")
    raises(_C.CGXError, lambda: _core.device_transport_choice(have_store=False), "hides the group's Store")

    # A one-rank group: its first use with an explicit cuda_ipc the build lacks is an error.
    with tempfile.TemporaryDirectory() as d:
        with_env(CGX_TORCH_DEVICE_TRANSPORT=None)
        dist.init_process_group("gloo", init_method=f"file://{d}/rendezvous", rank=0, world_size=1)
        store = dist.distributed_c10d._get_default_store()
        if "cuda_ipc" not in compiled:
            with_env(CGX_TORCH_DEVICE_TRANSPORT="cuda_ipc")
            raises(_C.CGXError, lambda: _core.TorchGroup(dist.group.WORLD), "no device plans over cuda_ipc")
            with_env(CGX_TORCH_DEVICE_TRANSPORT=None)
        g = _core.TorchGroup(dist.group.WORLD)
        check(g.stages_cuda and g.device_transport is None, "the default group does not stage CUDA tensors")
        cfg = _C.PlanConfig()
        layers = [(0, 4096, False)]
        raises(ValueError, lambda: _C.Plan(store, "p/cpu", 0, 1, 1000, "cuda_ipc", "float32", "cpu", -1, 4096,
                                           layers, cfg), "reduces CUDA tensors")
        raises(ValueError, lambda: _C.Plan(store, "p/x", 0, 1, 1000, "nvlink", "float32", "cuda", 0, 4096, layers,
                                           cfg), "not one of cuda_ipc, nccl")
        if not _C.device_plans_compiled():
            raises(_C.CGXError, lambda: _C.Plan(store, "p/cuda", 0, 1, 1000, "cuda_ipc", "float32", "cuda", 0,
                                                4096, layers, cfg), "built without CUDA")
        cgx_torch.free_plans()
        dist.destroy_process_group()

    if failures:
        print(f"test_device_choice: FAIL ({len(failures)})", flush=True)
        return 1
    print("test_device_choice: PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
