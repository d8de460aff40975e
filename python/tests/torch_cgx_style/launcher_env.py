"""A torch_cgx-style script that sets only MASTER_ADDR and MASTER_PORT: `import torch_cgx`
fills in RANK and WORLD_SIZE from the MPI launcher (Open MPI's OMPI_COMM_WORLD_* or MPICH's
PMI_*), so init_process_group("cgx", init_method="env://") needs nothing else.

    mpirun -np 2 python launcher_env.py
"""
import os

os.environ.pop("RANK", None)
os.environ.pop("WORLD_SIZE", None)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "4040")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch_cgx  # noqa: E402

if "OMPI_COMM_WORLD_RANK" in os.environ:
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
else:
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
assert os.environ.get("RANK") == str(rank) and os.environ.get("WORLD_SIZE") == str(size), \
    (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"), rank, size)

# a variable the script set is never overridden; without a launcher nothing is set
env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "RANK": "1"}
assert torch_cgx.fill_rank_from_launcher(env) == ["WORLD_SIZE"] and env["RANK"] == "1" and env["WORLD_SIZE"] == "4"
env = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
assert torch_cgx.fill_rank_from_launcher(env) == ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"], env
assert env["RANK"] == "2" and env["WORLD_SIZE"] == "3" and env["LOCAL_RANK"] == "0", env
env = {"RANK": "0"}
assert torch_cgx.fill_rank_from_launcher(env) == [] and env == {"RANK": "0"}

dist.init_process_group("cgx", init_method="env://")
assert dist.get_rank() == rank and dist.get_world_size() == size
os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4"
t = torch.full((4096,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((4096,), float(size * (size + 1) // 2))), t
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print(f"launcher_env.py: OK (RANK and WORLD_SIZE from the launcher, {size} ranks)")
