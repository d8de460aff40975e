"""A DDP script written the way torch's DDP tutorial writes one for torchrun (a toy model,
one process per rank, the backend from the command line). It knows nothing of cgx: run
with ``--backend cgx`` it gets cgx through torch's backend entry points alone.

    torchrun --nproc-per-node 2 ddp_tutorial.py --backend cgx
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(256, 512)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(512, 8)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(steps):
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    inputs = torch.randn(64, 256, generator=g)
    labels = torch.randn(64, 8, generator=g)
    for step in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs), labels)
        loss.backward()
        optimizer.step()
    # every rank must hold the same parameters after DDP's averaged steps
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    same = bool(torch.equal(lo, hi))
    print(f"rank {rank}: final loss {loss.item():.6f}, parameters identical on every rank: {same}")
    if not same:
        raise SystemExit("parameters differ between ranks")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    print(f"[{os.getpid()}] world_size = {dist.get_world_size()}, rank = {dist.get_rank()}, "
          f"backend = {dist.get_backend()}")
    demo_basic(args.steps)
    dist.destroy_process_group()
