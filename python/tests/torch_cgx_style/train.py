"""A small DDP training script written the way torch_cgx's CIFAR example is (mpirun, env://,
`import torch_cgx`, `from cgx_utils import CGXState, cgx_hook`, compression_params), on
synthetic images (no downloads) and a small CNN, on CPU.

    mpirun -np 4 python train.py --dist-backend cgx --quantization-bits 4

It trains twice from the same start: uncompressed (32 bits) and at --quantization-bits,
and checks: the loss drops, the parameters are the same on every rank, the compressed
run's layers are compressed from the first step, and its validation loss is within
--tolerance of the uncompressed run's.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser(description="torch_cgx-style DDP training on synthetic images",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
parser.add_argument("--epochs", type=int, default=4, help="number of epochs to train")
parser.add_argument("--train-size", type=int, default=2048, help="synthetic training images")
parser.add_argument("--base-lr", type=float, default=0.02, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--dist-backend", choices=["cgx", "gloo"], default="cgx", help="backend for torch distributed")
parser.add_argument("--quantization-bits", type=int, default=4, help="bits of max-min quantization")
parser.add_argument("--quantization-bucket-size", type=int, default=512, help="bucket size of max-min quantization")
parser.add_argument("--tolerance", type=float, default=0.05,
                    help="largest allowed validation-loss difference from the uncompressed run")
parser.add_argument("--local_rank", type=int, default=-1, help="local rank in distributed launch")
args = parser.parse_args()

# As torch_cgx's users do under mpirun (Open MPI's variables, or MPICH's PMI ones).
if "OMPI_COMM_WORLD_SIZE" in os.environ:
    args.local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
elif "PMI_SIZE" in os.environ:
    args.local_rank = int(os.environ.get("MPI_LOCALRANKID", os.environ["PMI_RANK"]))
    os.environ["WORLD_SIZE"] = os.environ["PMI_SIZE"]
    os.environ["RANK"] = os.environ["PMI_RANK"]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "4040")

import torch_cgx  # noqa: E402,F401  (the `cgx` backend)

dist.init_process_group(backend=args.dist_backend, init_method="env://")
args.world_size = dist.get_world_size()
rank = dist.get_rank()
verbose = rank == 0
torch.set_num_threads(1)

from cgx_utils import CGXState, cgx_hook  # noqa: E402


def synthetic_images(n, seed):
    """n images 3x16x16 of 10 classes: a class's fixed random pattern under noise
    (the same images on every rank)."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(1234))
    y = torch.randint(0, 10, (n,), generator=g)
    x = patterns[y] + 1.5 * torch.randn(n, 3, 16, 16, generator=g)
    return torch.utils.data.TensorDataset(x, y)


train_dataset = synthetic_images(args.train_size, args.seed)
val_dataset = synthetic_images(512, args.seed + 1)


class Net(torch.nn.Module):
    """A small CNN: two convolutions, two linear layers (the second conv and the first linear
    have 1024 values and more: compressed)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def validate(model):
    """Mean cross-entropy over the validation set (every rank the whole set)."""
    model.eval()
    with torch.no_grad():
        x, y = val_dataset.tensors
        return F.cross_entropy(model(x), y).item()


def train(bits, bucket_size):
    """Trains from the seed's start with cgx_hook at `bits`; returns (first epoch's loss, last
    epoch's loss, validation loss, flat parameters, the hook's layer bits after step 1)."""
    torch.manual_seed(args.seed)
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.base_lr, momentum=args.momentum)
    model = DDP(model)
    state = CGXState(torch.distributed.group.WORLD, layer_min_size=1024,
                     compression_params={"bits": bits, "bucket_size": bucket_size})
    model.register_comm_hook(state, cgx_hook)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=args.world_size,
                                                                    rank=rank, seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    epoch_loss, first_step_bits = [], None
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        total, n = 0.0, 0
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            if first_step_bits is None:
                first_step_bits = state.layer_bits()
            total, n = total + loss.item(), n + 1
        epoch_loss.append(total / n)
        if verbose:
            print(f"bits {bits}: epoch {epoch + 1} train loss {epoch_loss[-1]:.4f}", flush=True)
    val = validate(model)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    state.free()
    return epoch_loss[0], epoch_loss[-1], val, flat, first_step_bits


def same_on_every_rank(t):
    """Whether t is bit-identical on every rank (compared with rank 0's, exactly)."""
    ref = t.clone()
    dist.broadcast(ref, 0)
    ok = torch.tensor([1 if torch.equal(ref, t) else 0], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


first_u, last_u, val_u, params_u, _ = train(32, args.quantization_bucket_size)
first_c, last_c, val_c, params_c, bits_c = train(args.quantization_bits, args.quantization_bucket_size)
if verbose:
    print(f"uncompressed: train loss {first_u:.4f} -> {last_u:.4f}, validation {val_u:.4f}")
    print(f"{args.quantization_bits} bits, bucket {args.quantization_bucket_size}: train loss {first_c:.4f} -> "
          f"{last_c:.4f}, validation {val_c:.4f} ({val_c - val_u:+.4f}); layer bits after step 1: {bits_c}")
failures = []
if not last_u < 0.7 * first_u or not last_c < 0.7 * first_c:
    failures.append("the loss did not drop by 30%")
if not same_on_every_rank(params_u) or not same_on_every_rank(params_c):
    failures.append("parameters differ between ranks")
if not any(b == args.quantization_bits for bits in bits_c.values() for b in bits):
    failures.append(f"no layer compressed at step 1: {bits_c}")
if torch.equal(params_u, params_c):
    failures.append("the compressed run's parameters equal the uncompressed run's")
if abs(val_c - val_u) > args.tolerance:
    failures.append(f"validation loss {val_c:.4f} is {val_c - val_u:+.4f} from the uncompressed {val_u:.4f} "
                    f"(tolerance {args.tolerance})")
for f in failures:
    print(f"rank {rank}: FAILED: {f}", flush=True)
dist.barrier()
dist.destroy_process_group()
if failures:
    raise SystemExit(1)
if verbose:
    print("train.py: OK")
