"""The MLP of the DDP benchmarks (ddp_bench.py, ddp_compare.py): Linear layers of the
given widths with ReLU between them, initialized from seed 0, so that every rank and
every configuration starts from the same weights. No MPI or cgx import here."""
import torch
import torch.nn as nn


def make_model(dims):
    """nn.Sequential of Linear(dims[i], dims[i+1]) with ReLU between, seeded with 0."""
    torch.manual_seed(0)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
