"""The MLP of the DDP benchmarks (ddp_bench.py, ddp_compare.py): Linear layers of the
given widths with ReLU between them, initialized from seed 0, so that every rank and
every configuration starts from the same weights (ddp_lm.py's digits task seeds it itself). No MPI or cgx import here."""
import torch
import torch.nn as nn


def make_model(dims, seed=0):
    """nn.Sequential of Linear(dims[i], dims[i+1]) with ReLU between, seeded with `seed`
    (None: drawn from torch's current generator, as the caller seeded it)."""
    if seed is not None:
        torch.manual_seed(seed)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
