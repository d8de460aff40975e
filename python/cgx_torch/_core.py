"""Plans, checks and the plain ``allreduce_``: the parts of cgx_torch that are not DDP."""
import atexit
import hashlib
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from . import _C

CGXError = _C.CGXError

#: dtypes cgx compresses: float32 and float64 by the plans themselves; float16 and
#: bfloat16 through a float32 copy (reduced, averaged, then rounded back once).
COMPRESSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
SUPPORTED_DTYPES = COMPRESSED_DTYPES  # the name of cgx_torch 0.1
#: Half-precision dtypes, reduced through a float32 copy.
STAGED_DTYPES = (torch.float16, torch.bfloat16)
#: dtypes reduced exactly by MPI instead (allreduce_, and DDP buckets of these dtypes):
#: integers and bool (bool: logical or, as torch.distributed's SUM), complex.
EXACT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
                torch.complex128)
_BUCKETS = (64, 128, 512, 1024, 2048)  # layerwise_buckets (the device plans: 128, 512, 1024)
_ROUNDINGS = ("stochastic", "nearest")
_CHECKS = ("build", "call")


class MismatchError(CGXError):
    """Ranks asked for different settings or buffer layouts. Raised on every rank, before
    any data moves."""


@dataclass(frozen=True)
class AdaptiveOptions:
    """CGX's adaptive bit widths (cgx::adaptive_bits): after every reduction the layers'
    sensitivities are updated from the reduced gradient (the same bits on every rank), and
    every ``interval`` reductions of a buffer its layers get new bits between ``min_bits``
    and ``max_bits`` so that the average is at most ``target_bits``. Only layers that are
    compressed by the defaults are adapted."""

    min_bits: int = 2
    max_bits: int = 8
    target_bits: float = 4.0
    interval: int = 16
    clusters: int = 3
    decay: float = 0.9
    top_fraction: float = 0.01


@dataclass(frozen=True)
class Settings:
    """Everything a plan is built from; must be the same on every rank (checked)."""

    bits: int = 4
    bucket: int = 1024
    rounding: str = "stochastic"
    min_compressed: int = 1024
    error_feedback: bool = False
    adaptive: Optional[AdaptiveOptions] = None
    check: str = "build"
    seed: int = 0x63677821
    threads: int = 1
    ef_decay: float = 1.0
    ef_sum: bool = True

    def __post_init__(self):
        """Checks the settings; ValueError/TypeError for values the plans do not take."""
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 0 <= self.bits <= 8:
            raise ValueError(f"cgx_torch: bits must be an int in 1..8, or 0 for uncompressed (got {self.bits!r})")
        if self.bucket not in _BUCKETS:
            raise ValueError(f"cgx_torch: bucket must be one of {_BUCKETS} (got {self.bucket!r})")
        if self.rounding not in _ROUNDINGS:
            raise ValueError(f"cgx_torch: rounding must be one of {_ROUNDINGS} (got {self.rounding!r})")
        if not isinstance(self.min_compressed, int) or self.min_compressed < 0:
            raise ValueError(f"cgx_torch: min_compressed must be an int >= 0 (got {self.min_compressed!r})")
        if self.check not in _CHECKS:
            raise ValueError(f"cgx_torch: check must be one of {_CHECKS} (got {self.check!r})")
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"cgx_torch: threads must be an int >= 1 (got {self.threads!r})")
        if isinstance(self.ef_decay, bool) or not isinstance(self.ef_decay, (int, float)) or \
                not 0.0 <= self.ef_decay <= 1.0:
            raise ValueError(f"cgx_torch: ef_decay must be a number in [0, 1] (got {self.ef_decay!r})")
        if not isinstance(self.ef_sum, bool):
            raise ValueError(f"cgx_torch: ef_sum must be True or False (got {self.ef_sum!r})")
        if not 0 <= int(self.seed) < 2**64:
            raise ValueError("cgx_torch: seed must be in [0, 2**64)")
        a = self.adaptive
        if a is not None:
            if not isinstance(a, AdaptiveOptions):
                raise TypeError("cgx_torch: adaptive must be None, True or a cgx_torch.AdaptiveOptions")
            if not 1 <= a.min_bits <= a.max_bits <= 8:
                raise ValueError("cgx_torch: adaptive needs 1 <= min_bits <= max_bits <= 8")
            if not isinstance(a.interval, int) or a.interval < 1:
                raise ValueError("cgx_torch: adaptive interval must be an int >= 1")

    def config(self) -> "_C.PlanConfig":
        """The extension's PlanConfig for these settings."""
        c = _C.PlanConfig()
        c.bits = self.bits
        c.bucket = self.bucket
        c.min_compressed = self.min_compressed
        c.stochastic = self.rounding == "stochastic"
        c.error_feedback = self.error_feedback
        c.ef_decay = float(self.ef_decay)
        c.ef_sum = self.ef_sum
        c.check_each_call = False  # the Python side checks (see _agree)
        c.seed = int(self.seed)
        c.threads = self.threads
        a = self.adaptive
        if a is not None:
            c.adaptive_interval = a.interval
            c.min_bits, c.max_bits, c.target_bits = a.min_bits, a.max_bits, float(a.target_bits)
            c.clusters, c.decay, c.top_fraction = a.clusters, float(a.decay), float(a.top_fraction)
        return c


def default_bucket(bits):
    """The bucket for `bits` when none is given (issue 37, docs/results/lm-adam.md): the hook,
    the backend and allreduce_ alike."""
    return 128 if 1 <= bits <= 2 else 1024


def default_rounding(bits):
    """The rounding for `bits` when none is given (the hook, the backend and allreduce_)."""
    return "nearest" if 1 <= bits <= 2 else "stochastic"


def default_error_feedback(bits):
    """Whether the hook keeps error feedback at `bits` when not told (CPU buckets)."""
    return bits == 1


def default_ef_decay(bits):
    """The factor the hook carries error-feedback residuals with at `bits` when not told."""
    return DEFAULT_EF_DECAY.get(bits, 1.0)


# The error-feedback decay per width (docs/results/lm-adam.md, "Error feedback with a
# decay"): on the transformer LM with AdamW, 1 bit +0.025 over fp32 at 0.5 against +0.050
# with the whole residual (0.25: +0.028, 0.75: +0.032), 2 bits with error feedback +0.013
# against +0.024; under SGD 0.5 was the best decay at 1 bit as well. 3-8 bits: whole.
DEFAULT_EF_DECAY = {1: 0.5, 2: 0.5}

# Whether the hook's error feedback also feeds back the error of the sums a rank quantizes
# as the owner of a chunk (layerwise_options::error_feedback_sum). Measured with AdamW, 4
# ranks, 3 seeds (docs/results/tasks-adamw.txt): on the transformer LM 2 bits +0.014 with
# it, +0.012 without, 1 bit +0.026 / +0.028; on the digits MLP 2 bits +0.020 / +0.018, 1 bit
# +0.073 / +0.101: not the reason error feedback costs under Adam; the default stays.
DEFAULT_EF_SUM = True


def make_settings(bits=4, bucket=1024, rounding="stochastic", min_compressed=1024, error_feedback=False,
                  adaptive=None, check="build", seed=0x63677821, threads=1, ef_decay=1.0, ef_sum=True) -> Settings:
    """Settings from keyword arguments; ``adaptive=True`` means ``AdaptiveOptions()``."""
    if adaptive is True:
        adaptive = AdaptiveOptions()
    elif adaptive is False:
        adaptive = None
    elif isinstance(adaptive, dict):
        adaptive = AdaptiveOptions(**adaptive)
    return Settings(bits, bucket, rounding, min_compressed, error_feedback, adaptive, check, seed, threads,
                    float(ef_decay) if isinstance(ef_decay, int) and not isinstance(ef_decay, bool) else ef_decay,
                    ef_sum)


class Worker:
    """One background thread that runs submitted calls one after the other, in the order
    they were submitted (every rank submits a group's collectives in the same order): the
    hook's reductions, the backend's compressed calls."""

    def __init__(self, name):
        """Starts the thread."""
        self.q = queue.SimpleQueue()
        self.t = threading.Thread(target=self._loop, name=name, daemon=True)
        self.t.start()

    def _loop(self):
        """Runs the submitted calls in order until stop()."""
        while True:
            item = self.q.get()
            if item is None:
                return
            fn, fut = item
            try:
                r = fn()
            except BaseException as e:  # noqa: B902 (handed to whoever waits on fut)
                fut.set_exception(e)
            else:
                fut.set_result(r)

    def submit(self, fn, fut):
        """Queues fn; its result (or exception) completes fut (a torch.futures.Future)."""
        self.q.put((fn, fut))

    def stop(self):
        """Finishes the queued calls and ends the thread."""
        self.q.put(None)
        self.t.join()


#: How the `cgx` backend and the DDP hook send an eligible call: "auto" (the measured
#: choice, MeasuredPath), "compressed" (always cgx's plan: the fixed min_compressed rule
#: inside it) or "exact" (always the group's exact allreduce).
PATHS = ("auto", "compressed", "exact")


def check_path(path, what="path"):
    """path, lower-cased, if it is one of PATHS (ValueError otherwise)."""
    p = path.strip().lower() if isinstance(path, str) else path
    if p not in PATHS:
        raise ValueError(f"cgx_torch: {what} must be one of {', '.join(PATHS)} (got {path!r})")
    return p


class MeasuredPath:
    """The measured choice between cgx's compressed path and the exact one for the calls
    of one group (the `cgx` backend's, a CGXState's): cgx's own algorithm,
    cgx::detail::path_choice (include/cgx/detail/path_choice.hpp, bound as _C.PathChoice),
    one per kind of call (``kind``: dtype, settings, operation). Per size class of call
    (bytes rounded down to a power of two; calls under 4096 bytes always exact) the first
    PathChoice.probe_calls (8) calls alternate exact and compressed (the first pair warms
    both up), then the ranks
    agree (the slowest rank's time of each path counts: ``agree``, a collective MAX of two
    integers) and keep the faster path; every 16 to 256 calls two calls take the other
    path and the ranks agree again. Which path a call takes depends only on the number of
    calls of its class before it and on agreed decisions, so every rank takes the same path
    on every call. ``agree(list of 2 ints) -> list of 2 ints`` must be collective on the
    thread that runs the calls, in their order."""

    def __init__(self, agree):
        self.agree = agree
        self._choices = {}  # kind -> _C.PathChoice
        self._seen = {}  # kind -> {size class: bytes of its latest call}
        self.compressed = 0  # calls that took the compressed path
        self.exact = 0  # calls that took the exact path
        self.log = None  # a list to append (kind, bytes, compressed) to, per call (tests)

    def run(self, kind, nbytes, compressed, exact):
        """Runs compressed() or exact(), the one the choice picks for a call of `nbytes`
        bytes of `kind`, times it and records it (agreeing at decision points). Returns
        True if it took the compressed path."""
        c = self._choices.get(kind)
        if c is None:
            if len(self._choices) >= 64:  # kinds that come and go: keep it bounded
                old = next(iter(self._choices))
                del self._choices[old]
                self._seen.pop(old, None)
            c = self._choices[kind] = _C.PathChoice()
        comp = c.compress_next(nbytes)
        timed = c.times_next(nbytes)  # as cgx::detail::run_chosen: most decided calls read no clock
        t0 = time.perf_counter_ns() if timed else 0
        if comp:
            compressed()
        else:
            exact()
        c.record(nbytes, comp, time.perf_counter_ns() - t0 if timed else 0, self.agree)
        if comp:
            self.compressed += 1
        else:
            self.exact += 1
        if nbytes >= _C.PathChoice.measured_floor_bytes:
            self._seen.setdefault(kind, {})[_C.PathChoice.size_class(nbytes)] = nbytes
        if self.log is not None:
            self.log.append((kind, nbytes, comp))
        return comp

    def picks(self):
        """What was picked: a list of dicts, one per (kind, size class) measured so far:
        kind (repr), size_class (floor(log2(bytes))), bytes (of its latest call), and
        PathChoice.pick_for's measured, inferred, compressed, native_s, compressed_s (the agreed,
        slowest rank's times, seconds), calls, decisions, flips."""
        out = []
        for kind, classes in self._seen.items():
            c = self._choices.get(kind)
            if c is None:
                continue
            for cls, nbytes in sorted(classes.items()):
                out.append({"kind": repr(kind), "size_class": cls, "bytes": nbytes, **c.pick_for(nbytes)})
        return out

    def stats(self):
        """{"compressed": calls, "exact": calls, "picks": picks()}."""
        return {"compressed": self.compressed, "exact": self.exact, "picks": self.picks()}


def gloo_max_agree(pg):
    """An ``agree`` for MeasuredPath over gloo backend/group pg: the elementwise MAX of a
    list of ints over the ranks (an int64 allreduce, waited for)."""

    def agree(v):
        t = torch.tensor(list(v), dtype=torch.int64)
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.MAX
        pg.allreduce([t], o).wait()
        return t.tolist()

    return agree


def comm_handle(comm):
    """(comm, Fortran handle) for an mpi4py communicator; None means MPI.COMM_WORLD."""
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    try:
        return comm, int(comm.py2f())
    except AttributeError:
        raise TypeError("cgx_torch: comm must be a torch.distributed ProcessGroup or an mpi4py communicator "
                        f"(got {type(comm).__name__})") from None


#: Environment variables an MPI launcher (mpirun/mpiexec of Open MPI, MPICH, Slurm's PMI)
#: sets in each rank: under one, comm=None means MPI.COMM_WORLD.
_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


class MPIGroup:
    """The ranks of an mpi4py communicator: plans over comm::mpi (cgx's MPI transport)."""

    stages_cuda = False  # device plans take CUDA tensors themselves

    def __init__(self, comm):
        """comm: an mpi4py intra-communicator."""
        self.comm, self.comm_f = comm_handle(comm)
        self.size, self.rank = self.comm.size, self.comm.rank
        self.key = ("mpi", self.comm_f)

    def check(self, hash_, bad):
        """Collective: (every rank passed the same hash, some rank passed bad)."""
        return _C.collective_check(self.comm_f, hash_, bad)

    def plan(self, t, layers, settings):
        """A plan for tensor t's buffer (collective)."""
        dev = t.device
        index = dev.index if dev.index is not None else (torch.cuda.current_device() if dev.type == "cuda" else -1)
        return _C.Plan(self.comm_f, str(t.dtype).replace("torch.", ""), dev.type, index, t.numel(), layers,
                       settings.config())

    def exact_allreduce_(self, t):
        """Sums t in place with MPI itself (exact; bool: logical or); CUDA through a host copy."""
        from mpi4py import MPI

        host = t if t.device.type == "cpu" else t.cpu()
        self.comm.Allreduce(MPI.IN_PLACE, host.numpy(), op=MPI.LOR if t.dtype == torch.bool else MPI.SUM)
        if host is not t:
            t.copy_(host)
        return t

    def threads_ok(self):
        """Whether a background thread may reduce (MPI initialized with MPI_THREAD_MULTIPLE)."""
        from mpi4py import MPI

        return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def _group_store(pg):
    """The Store torch.distributed keeps for process group pg (None when this torch hides it)."""
    c10d = dist.distributed_c10d
    for get in (lambda: c10d._world.pg_map[pg][1], lambda: c10d._pg_map[pg][1]):  # torch >= 2.0 / 1.13
        try:
            return get()
        except (AttributeError, KeyError, IndexError, TypeError):
            pass
    return None


def _group_name(pg):
    """pg's name in torch.distributed (the same on every rank of the group; "" when hidden)."""
    c10d = dist.distributed_c10d
    for get in (lambda: c10d._world.pg_names[pg], lambda: c10d._pg_names[pg]):  # torch >= 2.0 / 1.13
        try:
            return str(get())
        except (AttributeError, KeyError, TypeError):
            pass
    return ""


def _group_timeout_ms(pg):
    """pg's timeout in milliseconds (init_process_group's / new_group's `timeout`), else torch's default."""
    import datetime

    c10d = dist.distributed_c10d
    t = None
    for get in (lambda: pg.options._timeout, lambda: pg._get_backend(torch.device("cpu")).options._timeout,
                lambda: c10d._world.pg_timeout[pg] if hasattr(c10d._world, "pg_timeout") else None):
        try:
            t = get()
        except (AttributeError, KeyError, RuntimeError, TypeError):
            t = None
        if isinstance(t, datetime.timedelta):
            break
    if not isinstance(t, datetime.timedelta):
        t = getattr(c10d, "default_pg_timeout", datetime.timedelta(minutes=30))
    return max(1, int(t.total_seconds() * 1000))


#: CGX_TORCH_DEVICE_TRANSPORT's values: how a torch.distributed group reduces CUDA tensors.
DEVICE_TRANSPORTS = ("host", "cuda_ipc", "auto")

#: Device plans made so far per group name: their Store keys' prefixes (never reused in a
#: process; every rank makes its plans in the same order, so the counts agree).
_device_plan_seq = {}


def device_transport_choice(have_store=True):
    """The device transport of a torch.distributed group's CUDA tensors, from
    CGX_TORCH_DEVICE_TRANSPORT: None for "host" (the default: staged through a pinned host
    copy over the group, as before), "cuda_ipc" (cgx's device plans over comm::cuda_ipc,
    set up through the group's Store: the ranks of one node; CGXError where this build
    lacks it), or, for "auto", "cuda_ipc" when it is compiled, a GPU is visible and the
    whole job runs on one node (torchrun's LOCAL_WORLD_SIZE equals WORLD_SIZE), else None.
    The choice must be the same on every rank (the plans' agreement checks it)."""
    v = os.environ.get("CGX_TORCH_DEVICE_TRANSPORT", "host").strip().lower() or "host"
    if v not in DEVICE_TRANSPORTS:
        raise ValueError(f"cgx_torch: CGX_TORCH_DEVICE_TRANSPORT={v!r} is not one of {', '.join(DEVICE_TRANSPORTS)}")
    if v == "host":
        return None
    compiled = "cuda_ipc" in _C.device_transports() and have_store
    if v == "cuda_ipc":
        if not compiled:
            raise CGXError("cgx_torch: CGX_TORCH_DEVICE_TRANSPORT=cuda_ipc, but "
                           + ("this torch hides the group's Store" if not have_store else
                              "this build has no device plans over cuda_ipc (" + _C.build_info() + ")")
                           + "; unset it to stage CUDA tensors through the host")
        return "cuda_ipc"
    one_node = os.environ.get("LOCAL_WORLD_SIZE") is not None and \
        os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE")
    return "cuda_ipc" if compiled and one_node and torch.cuda.is_available() else None


class TorchGroup:
    """The ranks of a torch.distributed process group (gloo): plans over the group's own
    send/recv (the extension's Channel), failure reports through its Store. Needs no MPI.
    CUDA tensors are staged through a host copy, or, with CGX_TORCH_DEVICE_TRANSPORT
    (device_transport_choice), reduced on the device by plans over comm::cuda_ipc set up
    through the group's Store."""

    stages_cuda = True
    device_transport = None

    def _init_device(self, store, name):
        """The transport of this group's CUDA tensors, and what their plans set up
        through: the group's Store (None: hidden) and a name unique to the group."""
        self.device_transport = device_transport_choice(store is not None)
        self.stages_cuda = self.device_transport is None
        self._dev_store, self._dev_name = store, name

    def __init__(self, pg):
        """pg: a torch.distributed ProcessGroup (dist.group.WORLD for the default one)."""
        if pg is None or pg == dist.GroupMember.WORLD:
            pg = dist.distributed_c10d._get_default_group()
        self.pg = pg
        self.timeout_ms = _group_timeout_ms(pg)
        # The failure key names the group: torch 1.13 gives every group the same Store.
        self.channel = _C.Channel(pg, _group_store(pg), self.timeout_ms, "cgx_torch/failure/" + _group_name(pg))
        self.size, self.rank = self.channel.size, self.channel.rank
        self.key = ("torch", id(pg))
        self._init_device(_group_store(pg), "group/" + _group_name(pg))

    def check(self, hash_, bad):
        """Collective: (every rank passed the same hash, some rank passed bad). The
        device transport is part of what must agree."""
        if self.device_transport is not None:
            hash_ = stable_hash((hash_, self.device_transport))
        return self.channel.check(hash_, bad)

    def plan(self, t, layers, settings):
        """A plan for tensor t's buffer (collective): over the group's channel for a CPU
        tensor, over the device transport for a CUDA one (not staged)."""
        dtype = str(t.dtype).replace("torch.", "")
        if t.device.type != "cuda":
            return _C.Plan(self.channel, dtype, "cpu", -1, t.numel(), layers, settings.config())
        if self.device_transport is None:
            raise CGXError("cgx_torch: a CUDA tensor reached a group that stages CUDA tensors through the host")
        seq = _device_plan_seq[self._dev_name] = _device_plan_seq.get(self._dev_name, 0) + 1
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return _C.Plan(self._dev_store, f"cgx_torch/device/{self._dev_name}/{seq}", self.rank, self.size,
                       self.timeout_ms, self.device_transport, dtype, "cuda", index, t.numel(), layers,
                       settings.config())

    def exact_allreduce_(self, t):
        """Sums t in place with the group's own allreduce (exact; bool: logical or)."""
        if t.dtype == torch.bool:
            u = t.to(torch.uint8)
            dist.all_reduce(u, op=dist.ReduceOp.MAX, group=self.pg)
            return t.copy_(u.bool())
        dist.all_reduce(t, group=self.pg)
        return t

    def threads_ok(self):
        """gloo's operations may come from a background thread."""
        return True


class PrivateGroup(TorchGroup):
    """The same ranks as TorchGroup `parent`, over a gloo backend of their own (made over
    the parent's Store under `key`, which must be the same on every rank): plans, checks
    and exact sums that run on a background thread while the parent group is used by
    others (DDP's own collectives on its group: find_unused_parameters' map, buffers),
    so that their collectives never interleave differently on different ranks.
    Construction is collective (gloo's rendezvous)."""

    def __init__(self, parent, key):
        import datetime

        store = _group_store(parent.pg)
        if store is None:
            raise CGXError("cgx_torch: this torch hides the process group's Store (needed for cgx's own gloo "
                           "connections)")
        self.timeout_ms = parent.timeout_ms
        self.size, self.rank = parent.size, parent.rank
        self._store = prefixed = dist.PrefixStore(key, store)
        self.pg = dist.ProcessGroupGloo(prefixed, self.rank, self.size,
                                        datetime.timedelta(milliseconds=self.timeout_ms))
        self.channel = _C.Channel(self.pg, prefixed, self.timeout_ms, "failure")
        self.key = ("private", key, id(self))
        self._init_device(prefixed, "private/" + key)
        self._exact_pg = None

    def exact_pg(self):
        """The gloo backend of the exact sums: a second one, made at the first exact sum
        (collective; every rank reaches it at the same call), so that the big exact
        allreduces never share connections (and their socket buffers) with the plans'
        messages."""
        if self._exact_pg is None:
            import datetime

            self._exact_pg = dist.ProcessGroupGloo(dist.PrefixStore("exact", self._store), self.rank, self.size,
                                                   datetime.timedelta(milliseconds=self.timeout_ms))
        return self._exact_pg

    def allreduce_(self, t, op):
        """Allreduce of t in place with op on this group's exact gloo (waited for)."""
        o = dist.AllreduceOptions()
        o.reduceOp = op
        self.exact_pg().allreduce([t], o).wait()
        return t

    def exact_allreduce_(self, t):
        """Sums t in place on this group's gloo (exact; bool: logical or)."""
        if t.dtype == torch.bool:
            u = t.to(torch.uint8)
            return t.copy_(self.allreduce_(u, dist.ReduceOp.MAX).bool())
        return self.allreduce_(t, dist.ReduceOp.SUM)


_groups = {}


def group_of(comm):
    """The group cgx reduces over: an mpi4py communicator, a torch.distributed
    ProcessGroup, or None: MPI.COMM_WORLD under an MPI launcher (mpirun) where this build
    has MPI, else torch.distributed's default group (torchrun), else MPI.COMM_WORLD."""
    if comm is None:
        under_mpi = _C.mpi_compiled() and any(v in os.environ for v in _MPI_LAUNCHER_VARS)
        if not under_mpi and dist.is_available() and dist.is_initialized():
            comm = dist.distributed_c10d._get_default_group()
        elif not _C.mpi_compiled():
            raise CGXError("cgx_torch: no process group: call torch.distributed.init_process_group first (torchrun "
                           "sets its environment), or pass comm=; this build has no MPI (" + _C.build_info() + ")")
    if isinstance(comm, dist.ProcessGroup):
        g = _groups.get(id(comm))
        if g is None or g.pg is not comm:
            g = _groups[id(comm)] = TorchGroup(comm)
        return g
    if not _C.mpi_compiled():
        raise CGXError("cgx_torch: this build has no MPI (mpi4py was not importable when it was built): pass a "
                       f"torch.distributed ProcessGroup, not a {type(comm).__name__}")
    c, f = comm_handle(comm)
    g = _groups.get(("mpi", f))
    if g is None:
        g = _groups[("mpi", f)] = MPIGroup(c)
    return g


def tensor_problem(t, device_plans=None):
    """The exception a tensor would raise (TypeError/ValueError/CGXError), or None."""
    if not isinstance(t, torch.Tensor):
        return TypeError(f"cgx_torch: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in COMPRESSED_DTYPES and t.dtype not in EXACT_DTYPES:
        return TypeError(
            f"cgx_torch: dtype {t.dtype} cannot be reduced: cgx compresses float32, float64, float16 and "
            "bfloat16, and reduces integers, bool and complex64/128 exactly")
    if t.layout != torch.strided:
        return ValueError(f"cgx_torch: {t.layout} tensors are not supported (dense tensors only)")
    if t.device.type not in ("cpu", "cuda"):
        return ValueError(f"cgx_torch: tensors on {t.device} are not supported (cpu or cuda)")
    if t.device.type == "cuda" and not (_C.device_plans_compiled() if device_plans is None else device_plans):
        return CGXError("cgx_torch: this build has no device plans (it was built against a CPU-only torch or "
                        "without the CUDA toolkit): CUDA tensors cannot be reduced; " + _C.build_info())
    if not t.is_contiguous():
        return ValueError(f"cgx_torch: the tensor is not contiguous (shape {tuple(t.shape)}, strides "
                          f"{t.stride()}); reduce t.contiguous() and copy the result back")
    return None


def stable_hash(obj) -> int:
    """A 62-bit hash of repr(obj), the same in every process (unlike hash())."""
    d = hashlib.blake2b(repr(obj).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") & ((1 << 62) - 1)


def agree(group, key, problem):
    """Collective over group: every rank passes its key (settings + layout) and its own
    problem (an exception or None). Raises, on every rank, this rank's problem, or
    ValueError when another rank had one, or MismatchError when the keys differ."""
    same, bad = group.check(stable_hash(key), problem is not None)
    judge(key, same, bad, problem)


def judge(key, same, bad, problem=None, peer=" passed an invalid tensor"):
    """The verdict of an agreement on key (see agree): raises this rank's problem, or
    ValueError when another rank had one ("another rank" + peer), or MismatchError when
    the keys differ."""
    if problem is not None:
        raise problem
    if bad:
        raise ValueError(f"cgx_torch: another rank{peer} (see its error); nothing was reduced")
    if not same:
        raise MismatchError("cgx_torch: ranks passed different settings or buffer layouts (bits, bucket, "
                            "rounding, adaptive, error feedback, dtype, shape or layers); nothing was reduced. "
                            f"This rank: {key!r}")


def new_plan(group, t, layers, settings: Settings):
    """A plan for tensor t's buffer over group (collective; call agree() first)."""
    return group.plan(t, layers, settings)


def staged(t, to_host=False):
    """The tensor a plan reduces for t: t itself (float32, float64), or a float32 copy of
    a float16/bfloat16 t (on t's device, or on the host with to_host: a CUDA tensor over
    a torch.distributed group)."""
    if to_host and t.device.type != "cpu":
        return t.to("cpu", torch.float32 if t.dtype in STAGED_DTYPES else t.dtype)
    return t.float() if t.dtype in STAGED_DTYPES else t


def unstage(t, work):
    """Writes a staged reduction back: work (float32) rounded once into t's dtype.
    Non-finite values stay non-finite; a float16 sum beyond 65504 becomes inf, as
    float16 arithmetic would give."""
    if work is not t:
        t.copy_(work)
    return t


def device_key(t):
    """(device type, CUDA index or None): the part of a plan's key that names where the tensor lives."""
    return (t.device.type, t.device.index if t.device.type == "cuda" else None)


_plans = {}
_EXACT = "exact"  # _plans' entry for a key reduced by MPI (EXACT_DTYPES)


def allreduce_(tensor, bits=4, *, bucket=None, rounding=None, min_compressed=1024, error_feedback=False,
               adaptive=None, average=False, comm=None, check="build", seed=0x63677821, threads=1, ef_decay=1.0,
               ef_sum=True):
    """Sums ``tensor`` over the ranks of ``comm`` in place (a torch.distributed ProcessGroup
    or an mpi4py communicator; default: MPI.COMM_WORLD under mpirun, else
    torch.distributed's default group, as torchrun sets up),
    compressed with cgx's layer-wise plan, and returns it. Collective: every rank calls it
    with the same shape, dtype and settings.

    The tensor is one layer: ``bits`` (1..8, 0 = uncompressed) with max-min buckets of
    ``bucket`` values (64, 128, 512, 1024, 2048) and ``rounding`` ("stochastic", unbiased, or
    "nearest"), by default the measured ones of the width as in the hook and the backend
    (1-2 bits: 128 and nearest; 3-8 bits: 1024 and stochastic); a tensor of fewer than ``min_compressed`` values goes uncompressed.
    ``error_feedback`` keeps this rank's quantization residual for the next call with
    the same shape and settings (host only), carried into that call multiplied by
    ``ef_decay`` (in [0, 1]; 1: whole); ``ef_sum=False`` feeds back only the error of this
    rank's own contributions, not that of the sums it quantizes for the others (see the
    hook's ``CGXState``); ``adaptive`` (True or AdaptiveOptions)
    re-picks the bits from the reduced values; ``average`` divides the sum by the number
    of ranks.

    One plan per (communicator, shape, dtype, device, settings) is built on first use
    and cached (``free_plans()`` releases them). The first call with a new key checks, in
    one small collective exchange, that every rank asked for the same (MismatchError on
    every rank otherwise); ``check="call"`` repeats that check on every call.

    float16 and bfloat16 tensors are reduced through a float32 copy (the plans' values and
    metadata in float32), rounded back once after the average. Integer, bool (logical
    or) and complex tensors are reduced exactly by MPI or the group's own allreduce
    (``average`` only for complex).

    Raises TypeError for a dtype none of these covers, ValueError for a non-contiguous
    tensor or an average of integers, CGXError (a RuntimeError) for CUDA tensors in a
    build without device plans and for failures inside cgx.
    """
    bucket = default_bucket(bits) if bucket is None else bucket
    rounding = default_rounding(bits) if rounding is None else rounding
    s = make_settings(bits, bucket, rounding, min_compressed, error_feedback, adaptive, check, seed, threads,
                      ef_decay, ef_sum)
    group = group_of(comm)
    problem = tensor_problem(tensor, True if group.stages_cuda else None)
    if problem is None and error_feedback and tensor.device.type == "cuda":
        problem = ValueError("cgx_torch: error feedback is implemented for CPU tensors only")
    exact = problem is None and tensor.dtype in EXACT_DTYPES
    if exact and average and not (tensor.dtype.is_complex or tensor.dtype.is_floating_point):
        problem = ValueError(f"cgx_torch: average=True on a {tensor.dtype} tensor: integer and bool tensors are "
                             "summed exactly; divide the sum yourself")
    key = (group.key, tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None,
           str(getattr(tensor, "dtype", None)), device_key(tensor) if isinstance(tensor, torch.Tensor) else None,
           s)
    plan = _plans.get(key)
    if plan is None or s.check == "call":
        agree(group, key[1:] + ((plan.settings() if plan not in (None, _EXACT) else None),), problem)
    elif problem is not None:
        raise problem
    if exact:
        _plans[key] = _EXACT  # agreed once, as a plan is
        group.exact_allreduce_(tensor)
        return tensor.div_(group.size) if average else tensor
    work = staged(tensor, group.stages_cuda)
    if plan is None:
        plan = new_plan(group, work, [(0, work.numel(), False)], s)
        _plans[key] = plan
    plan.run(work)
    if average:
        work.div_(plan.world)
    return unstage(tensor, work)


def free_plans():
    """Releases the cached plans of allreduce_ (their MPI communicators and workspace) and
    the groups' channels. Called at exit, before mpi4py finalizes MPI."""
    _plans.clear()
    _groups.clear()


def _end_cleanly():
    """At exit, after cgx_torch's other exit handlers (the hook threads stopped, the
    `cgx` groups shut down, the plans freed): collects the reference cycles DDP models sit
    in and destroys the default process group if the script did not, while the
    interpreter is whole. Left to the interpreter's shutdown, a group held by such a cycle
    is destroyed with its threads still running and aborts the process ("terminate called
    without an active exception"): many scripts never call destroy_process_group."""
    import gc
    import warnings

    try:
        gc.collect()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()
    except Exception as e:  # noqa: BLE001 (at exit: say it, never raise)
        warnings.warn(f"cgx_torch: at exit: {type(e).__name__}: {e}", RuntimeWarning)


atexit.register(_end_cleanly)  # registered first: runs last
atexit.register(free_plans)
