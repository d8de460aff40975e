"""cgx_torch._C.StoreBootstrap (cgx::comm::store_bootstrap over the job's c10d Store) under
torchrun, on CPU: the set-up path of the device transports with no MPI, checked where NCCL
cannot run. Run: torchrun --standalone --nproc-per-node 3 test_store_bootstrap.py

- a fake NCCL id exchange: rank 0's 128 random bytes (an ncclUniqueId's size) reach every
  rank through the Store, and every rank's own blob arrives in rank order;
- same_node() is True (torchrun --standalone: one node);
- a rank late for the set-up: the others raise CGXError naming it within the limit, the
  late rank raises at once (it never succeeds alone);
- unequal lengths: CGXError on every rank.
Prints "test_store_bootstrap: PASS" on rank 0 (ctest's pass expression).
"""
import os
import sys
import time

import torch.distributed as dist

import cgx_torch  # noqa: F401  (loads the extension)
from cgx_torch import _C


def fail(msg):
    print(f"test_store_bootstrap: FAIL rank {dist.get_rank()}: {msg}", flush=True)
    sys.exit(1)


def expect_error(fn, says, within_s):
    t0 = time.monotonic()
    try:
        fn()
    except _C.CGXError as e:
        dt = time.monotonic() - t0
        if says not in str(e):
            fail(f"the error does not say {says!r}: {e}")
        if dt > within_s:
            fail(f"the error came after {dt:.2f} s (at most {within_s} s expected): {e}")
        return str(e)
    fail(f"no error (expected one saying {says!r})")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()

    # 1. The exchange comm::nccl makes: rank 0's id to everyone (with every rank's blob).
    b = _C.StoreBootstrap(store, rank, world, "cgx-test/nccl-id", 30000)
    if (b.rank, b.size) != (rank, world):
        fail(f"rank/size {(b.rank, b.size)}")
    mine = os.urandom(128)
    blobs = b.allgather(mine)
    if len(blobs) != world or blobs[rank] != mine:
        fail("own blob not at its rank")
    seen = [None] * world
    dist.all_gather_object(seen, (mine, blobs))
    for r in range(world):
        if seen[r][1] != blobs:
            fail(f"rank {r} got other blobs than rank {rank}")
        if blobs[r] != seen[r][0]:
            fail(f"blob {r} is not what rank {r} passed")
    b.barrier()
    if not b.same_node():
        fail("same_node() is False under torchrun --standalone")
    if b.allgather(b"") != [b""] * world:
        fail("empty allgather")

    # 2. A rank late for the set-up (1 s limit, the last rank 2.5 s late).
    last = world - 1
    dist.barrier()
    if rank != last:
        msg = expect_error(lambda: _C.StoreBootstrap(store, rank, world, "cgx-test/late", 1000),
                           f"rank(s) {last}", 1.0 + 10.0)
        print(f"rank {rank}: {msg}", flush=True)
    else:
        time.sleep(2.5)
        msg = expect_error(lambda: _C.StoreBootstrap(store, rank, world, "cgx-test/late", 1000),
                           "before this rank arrived", 1.0)
        print(f"rank {rank} (late): {msg}", flush=True)
    dist.barrier()

    # 3. Unequal lengths: every rank sees every blob, so every rank raises.
    expect_error(lambda: b.allgather(bytes(8 if rank == 1 else 4)), "one length on every rank", 30.0)

    dist.barrier()
    if rank == 0:
        print("test_store_bootstrap: PASS", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
