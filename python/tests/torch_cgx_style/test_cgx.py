"""The `cgx` backend as torch_cgx's users test it: `import torch_cgx`, init_process_group("cgx")
with env://, launched with mpirun (Open MPI's or MPICH's rank variables), CPU tensors, the
CGX_COMPRESSION_* variables changed between calls. Run: mpirun -np 2 python test_cgx.py

CGX_TEST_MAX_SIZE (default 1000000, as torch_cgx's) is the largest tensor, CGX_TEST_REPS (default 2) the
number of calls per case; the tests' groups use the ports above MASTER_PORT (default 4040),
one each."""
import os
import pickle
import unittest
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch_cgx
from cgx_utils import CGXState, cgx_hook

MAX_SIZE = int(os.environ.get("CGX_TEST_MAX_SIZE", "1000000"))
REPS = int(os.environ.get("CGX_TEST_REPS", "2"))
BASE_PORT = int(os.environ.get("MASTER_PORT", "4040"))  # the test runner passes one per test: ports above it
CGX_VARIABLES = ("CGX_COMPRESSION_QUANTIZATION_BITS", "CGX_COMPRESSION_BUCKET_SIZE", "CGX_COMPRESSION_MINIMAL_SIZE",
                 "CGX_INNER_COMMUNICATOR_TYPE")


def launcher_rank():
    """(rank, size) from Open MPI's or MPICH's (PMI) variables."""
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    raise AssertionError("Launch with mpirun")


def constant_cases(rank, world_size):
    """(input, expected sum) for constant tensors of every dtype and size: exact at any width."""
    cases = []
    for dtype in (torch.float16, torch.float32, torch.int32):
        for size in (1, 2, 8, 128, 1024, MAX_SIZE):
            cases.append((torch.full((size,), rank + 1, dtype=dtype),
                          torch.full((size,), world_size * (world_size + 1) // 2, dtype=dtype)))
    return cases


def ramp_cases(rank, world_size):
    """(input, expected sum, bits) for ramps (rank + 1) * [-size/2, size/2): not exact when compressed."""
    cases = []
    for bits in (2, 3, 4, 6, 8):
        for dtype in (torch.float16, torch.float32):
            for size in (128, 1024, 1025, 16384, MAX_SIZE):
                ramp = np.arange(-size / 2, size / 2, 1.0)
                if dtype == torch.float16:
                    ramp *= 1e-3
                cases.append((torch.tensor((rank + 1) * ramp, dtype=dtype),
                              torch.tensor(world_size * (world_size + 1) / 2 * ramp, dtype=dtype), bits))
    return cases


class CGXTests(unittest.TestCase):
    groups = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        warnings.simplefilter("module")

    def assertTensorEqual(self, t1, t2, msg=None):
        self.assertIsInstance(t1, torch.Tensor)
        self.assertIsInstance(t2, torch.Tensor)
        if not torch.equal(t1, t2):
            self.fail(f"tensors differ: {t1} != {t2}. {msg}")

    def setUp(self):
        super().setUp()
        self.addTypeEqualityFunc(torch.Tensor, "assertTensorEqual")
        self.rank, self.world_size = launcher_rank()
        self.saved = {v: os.environ.get(v) for v in CGX_VARIABLES}
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        # a port of its own for each test's group: a rank that re-initialises at once could
        # otherwise reach the previous group's store before rank 0 has closed it
        CGXTests.groups += 1
        os.environ["MASTER_PORT"] = str(BASE_PORT + CGXTests.groups)
        os.environ["WORLD_SIZE"] = str(self.world_size)
        dist.init_process_group(backend="cgx", init_method="env://", rank=self.rank)

    def tearDown(self):
        dist.barrier()
        dist.destroy_process_group()
        for v, old in self.saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old

    def sum_of(self, t):
        """t summed over the ranks by the backend (a copy)."""
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def test_compressed_exact(self):
        cases = constant_cases(self.rank, self.world_size)
        for bits in (2, 4, 8):
            os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = str(bits)
            for inp, expected in cases:
                for _ in range(REPS):
                    self.assertEqual(self.sum_of(inp), expected, f"bits {bits}, {inp.dtype}, size {inp.numel()}")

    def test_compressed_non_exact(self):
        coef = self.world_size * (self.world_size + 1)
        errors = {}
        for inp, expected, bits in ramp_cases(self.rank, self.world_size):
            os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = str(bits)
            for bucket in (64, 512, 2048):
                os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = str(bucket)
                size = inp.numel()
                for _ in range(REPS):
                    t = self.sum_of(inp)
                    err = torch.norm(t.double() - expected.double(), p=float("inf")).item()
                    self.assertLess(err, 2 * min(bucket, size) / ((1 << bits) - 1) * coef,
                                    f"bits {bits}, bucket {bucket}, {inp.dtype}, size {size}")
                    if inp.dtype == torch.float32:
                        errors[bits, bucket, size] = max(err, errors.get((bits, bucket, size), 0.0))
        # The variables were read at every call: a 2048-value bucket at 2 bits misses by more
        # than a 64-value one may; 8 bits by far less than 2; a 128-value tensor is compressed
        # (torch_cgx's minimal size is 16).
        self.assertGreater(errors[2, 2048, 16384], 2 * 64 / 3 * coef)
        self.assertLess(errors[8, 512, 16384] * 10, errors[2, 512, 16384])
        self.assertGreater(errors[4, 64, 128], 0.0)

    def test_minimal_size(self):
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4"
        ramp = torch.arange(-512.0, 513.0) * (self.rank + 1)
        expected = torch.arange(-512.0, 513.0) * (self.world_size * (self.world_size + 1) // 2)
        self.assertNotEqual(torch.norm(self.sum_of(ramp) - expected, p=float("inf")).item(), 0.0)
        os.environ["CGX_COMPRESSION_MINIMAL_SIZE"] = "2048"
        self.assertEqual(self.sum_of(ramp), expected)
        os.environ["CGX_COMPRESSION_MINIMAL_SIZE"] = "1"  # never below 16: still compressed
        small = torch.arange(8.0) * (self.rank + 1)
        self.assertEqual(self.sum_of(small), torch.arange(8.0) * (self.world_size * (self.world_size + 1) // 2))

    def test_uncompressed(self):
        # values that compression could not keep exact: 32 bits must
        expected = torch.zeros(MAX_SIZE)
        inputs = []
        for r in range(self.world_size):
            x = torch.randint(-1000, 1000, (MAX_SIZE,), generator=torch.Generator().manual_seed(7 + r)).float()
            expected += x
            inputs.append(x)
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "32"
        self.assertEqual(self.sum_of(inputs[self.rank]), expected)
        os.environ.pop("CGX_COMPRESSION_QUANTIZATION_BITS")  # torch_cgx's default: uncompressed
        self.assertEqual(self.sum_of(inputs[self.rank]), expected)
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4"
        self.assertFalse(torch.equal(self.sum_of(inputs[self.rank]), expected))

    def test_bad_settings(self):
        """Bad values raise on every rank (every rank has the same environment), naming what
        is accepted; the group works afterwards."""
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4"
        os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = "100"
        with self.assertRaisesRegex(Exception, "2048"):
            self.sum_of(torch.ones(4096))
        os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = "512"
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "9"
        with self.assertRaisesRegex(Exception, "bits"):
            self.sum_of(torch.ones(4096))
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4"
        os.environ["CGX_INNER_COMMUNICATOR_TYPE"] = "CARRIER_PIGEON"
        with self.assertRaisesRegex(Exception, "CGX_INNER_COMMUNICATOR_TYPE"):
            self.sum_of(torch.ones(4096))
        os.environ["CGX_INNER_COMMUNICATOR_TYPE"] = "SHM"
        with self.assertWarnsRegex(RuntimeWarning, "CGX_INNER_COMMUNICATOR_TYPE"):
            t = self.sum_of(torch.ones(4096))
        self.assertEqual(t, torch.full((4096,), float(self.world_size)))

    def test_module_functions(self):
        """register_layer / set_quantization_* take what the plans are compiled for, and say so."""
        with self.assertRaisesRegex(ValueError, "64, 128, 512, 1024, 2048"):
            torch_cgx.register_layer(0, 0, 4096, 4, 100)
        with self.assertRaisesRegex(ValueError, "64, 128, 512, 1024, 2048"):
            torch_cgx.set_quantization_bucket_size(0, 0, 256)
        for bad in (0, 9, 16, 33, -1):
            with self.assertRaisesRegex(ValueError, "1..8, or 32"):
                torch_cgx.set_quantization_bits(0, 0, bad)
        with self.assertRaises(TypeError):
            torch_cgx.register_layer(0, 0, 4096, 4.0, 512)
        with self.assertRaisesRegex(ValueError, "layer_idx"):
            torch_cgx.register_layer(0, -1, 4096, 4, 512)
        self.assertEqual(torch_cgx.registered_layers(), {})
        torch_cgx.register_layer(3, 1, 4096, 4, 512)
        torch_cgx.set_quantization_bucket_size(3, 1, 2048)  # the bits stay 4 (torch_cgx set them to 2048)
        self.assertEqual(torch_cgx.registered_layers(), {(3, 1): (4096, 4, 2048)})
        torch_cgx.set_quantization_bits(3, 1, 32)
        self.assertEqual(torch_cgx.layer_setting(3, 1, 4096), (32, 2048))
        self.assertEqual(torch_cgx.layer_setting(3, 1, 100)[0], "mismatch")
        torch_cgx.clear_layers()

    def test_state_settings(self):
        """CGXState: compression_params over the variables, torch_cgx's defaults, clear errors."""
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "3"
        os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = "2048"
        os.environ["CGX_COMPRESSION_MINIMAL_SIZE"] = "4096"
        s = CGXState(None, layer_min_size=1024)
        self.assertEqual((s.quantization_bits, s.quantization_bucket_size, s.layer_min_size), (3, 2048, 4096))
        s = CGXState(None, layer_min_size=8192, compression_params={"bits": 2, "bucket_size": 64})
        self.assertEqual((s.quantization_bits, s.quantization_bucket_size, s.layer_min_size), (2, 64, 8192))
        for v in CGX_VARIABLES:
            os.environ.pop(v, None)
        s = CGXState(None)
        self.assertEqual((s.quantization_bits, s.settings.bits, s.layer_min_size), (32, 0, 1024))
        self.assertEqual(CGXState(None, layer_min_size=0).layer_min_size, 16)  # never below the variable's 16
        self.assertEqual(CGXState(None, compression_params={"bits": 2}).quantization_bucket_size, 128)
        with self.assertRaisesRegex(ValueError, "1..8, or 32"):
            CGXState(None, compression_params={"bits": 9})
        with self.assertRaisesRegex(ValueError, "bucket_size"):
            CGXState(None, compression_params={"bucket": 512})
        with self.assertRaisesRegex(ValueError, "64, 128, 512, 1024, 2048"):
            CGXState(None, compression_params={"bits": 4, "bucket_size": 100})
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "four"
        with self.assertRaisesRegex(ValueError, "CGX_COMPRESSION_QUANTIZATION_BITS"):
            CGXState(None)
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4"
        s = pickle.loads(pickle.dumps(CGXState(None, 2048, {"bits": 6, "bucket_size": 512})))
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "2"
        self.assertEqual((s.settings.bits, s.settings.bucket, s.layer_min_size), (6, 512, 2048))

    def test_hook_layer_settings(self):
        """cgx_hook applies torch_cgx's per-layer settings; ranks that set different ones
        get an error on every rank."""
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.ReLU(), torch.nn.Linear(64, 64))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = CGXState(None, layer_min_size=1024, compression_params={"bits": 32})
        seen = {}

        def hook(s, bucket):
            seen[bucket.index()] = [g.numel() for g in bucket.gradients()]
            return cgx_hook(s, bucket)

        ddp.register_comm_hook(state, hook)
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(self.rank))

        def step():
            ddp.zero_grad()
            ddp(x).square().mean().backward()
            return [p.grad.clone() for p in model.parameters()]

        step()
        step()  # DDP's buckets are laid out anew after the first step
        self.assertEqual(sorted(seen[0]), [64, 4096, 4096])
        self.assertEqual(state.layer_bits(), {0: [0, 0, 0]})
        big = [i for i, n in enumerate(seen[0]) if n == 4096]
        torch_cgx.register_layer(0, big[0], 4096, 4, 64)
        torch_cgx.set_quantization_bucket_size(0, big[1], 2048)  # bits stay the state's (uncompressed)
        try:
            grads = step()
            settings = state.plans[0][1].settings()
            self.assertEqual(settings[big[0]], (4, 64))
            self.assertEqual(settings[big[1]][0], 0)
            self.assertEqual(sum(b for b, _ in settings), 4)
            for g in grads:  # the same average on every rank
                ref = g.clone()
                dist.broadcast(ref, 0)
                self.assertEqual(g, ref)
            if self.rank == 0:
                torch_cgx.set_quantization_bits(0, big[0], 8)
            with self.assertRaisesRegex(RuntimeError, "different settings"):
                step()
        finally:
            torch_cgx.clear_layers()
            state.free()


if __name__ == "__main__":
    unittest.main()
