"""The DDP communication hook: ``ddp_model.register_comm_hook(CGXState(...), cgx_hook)``."""
import atexit
import os
import weakref

import torch
import torch.distributed as dist

from . import _core

_states = weakref.WeakSet()
_exact_serials = {}  # group name -> CGXStates made over it so far (the same count on every rank)


def _bucket_buffer(bucket):
    """The bucket's flat gradient buffer (torch >= 1.10: buffer(); before: get_tensor())."""
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()  # torch >= 1.10 / older


def _bucket_index(bucket):
    """The bucket's index (index(), or get_index() in older torch)."""
    return bucket.index() if hasattr(bucket, "index") else bucket.get_index()


def _bucket_gradients(bucket):
    """The bucket's per-parameter gradient views (gradients(), or get_per_parameter_tensors())."""
    if hasattr(bucket, "gradients"):
        return bucket.gradients()
    return bucket.get_per_parameter_tensors()  # torch < 1.10


def bucket_layers(buf, grads):
    """One layer (offset, count, one_dimensional) per parameter of a DDP bucket: the
    gradients are views of the flat buffer (found by address), else laid end to end."""
    es, base, n = buf.element_size(), buf.data_ptr(), buf.numel()
    layers = []
    for g in grads:
        off, rem = divmod(g.data_ptr() - base, es)
        layers.append((off, g.numel(), g.dim() <= 1))
        if rem or off < 0 or off + g.numel() > n:
            layers = None
            break
    if layers is not None:
        spans = sorted((o, o + c) for o, c, _ in layers if c)
        if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
            layers = None
    if layers is None:
        layers, off = [], 0
        for g in grads:
            layers.append((off, g.numel(), g.dim() <= 1))
            off += g.numel()
    return layers


class CGXState:
    """State of the cgx DDP communication hook: the settings (the same on every rank) and
    one cached plan per DDP bucket.

    Each bucket's fused gradient buffer is reduced by cgx's layer-wise host plan (CPU
    tensors) or device plan (CUDA tensors, where compiled), one layer per parameter: by
    CGX's defaults parameters with fewer than ``min_compressed`` values and
    one-dimensional ones (biases, norms) go uncompressed, the others with ``bits`` (1..8)
    and max-min buckets of ``bucket`` values (64, 128, 512, 1024, 2048), ``rounding`` "stochastic"
    (unbiased; CGX's) or "nearest". ``error_feedback`` keeps each rank's quantization
    residual (CPU only). ``adaptive`` (True or AdaptiveOptions) re-assigns bits per layer
    from the reduced gradients every ``interval`` steps. Defaults per width (issue 37,
    measured on a transformer LM with AdamW and SGD, docs/results/lm-adam.md): at 1 and
    2 bits buckets of 128 and nearest rounding, at 1 bit also error feedback (CPU
    buckets; CUDA buckets go without, as error feedback is host-only), at 3-8 bits
    buckets of 1024 and stochastic rounding (settings given explicitly win).
    ``ef_decay`` (in [0, 1]) is the factor each residual is carried into the next step
    with; by default 0.5 at 1 and 2 bits (halved each step: better under Adam, where a
    whole residual sends small gradients in bursts), 1 (whole) at 3-8 bits.
    ``ef_sum`` (default True): also feed back the error of the sums this rank quantizes as
    the owner of a chunk; False feeds back its own contributions' error only.
    ``warmup_steps``: the first steps reduced uncompressed (exact), then ``bits``.

    ``path`` says how a bucket travels: "auto", the measured choice (the default where
    ``min_compressed`` is not given): per size class of bucket (its bytes rounded down to
    a power of two) the hook times cgx's compressed plan and the exact allreduce (gloo's,
    on a gloo backend of the state's own, on the thread that reduces the buckets, in
    DDP's order) on the job's own buckets, the ranks agree (the slowest rank's time of
    each path decides) and the faster path is kept, re-checked every 16 to 256 calls:
    cgx's own algorithm (``cgx::detail::path_choice``, docs/threshold.md), the same path
    on every rank for every bucket. Buckets under 4096 bytes go exact. On a fast link
    (loopback, shared memory) it keeps DDP as fast as gloo's; on a slow one it compresses.
    "compressed": every bucket through the plan (layers under ``min_compressed`` values
    uncompressed inside it; giving ``min_compressed`` selects this, and so does
    ``bits=0``: the uncompressed plan, as in the warm-up steps); "exact": every bucket by
    the exact allreduce. Default: the environment's ``CGX_PATH`` when set, else
    as said. Over an mpi4py communicator "auto" means "compressed" (the measured choice
    needs a torch.distributed group). A bucket that takes the exact path leaves its plan
    untouched (error-feedback residuals wait for the next compressed call, adaptive
    statistics see compressed calls only; the same on every rank). What was picked:
    ``path_stats()``.
    ``param_bits``: {parameter: bits} for parameters that get their own width (0:
    uncompressed), e.g. an LM's embeddings and output layer at low widths (a layer the
    defaults leave uncompressed stays so; under ``adaptive`` the widths are only the
    starting ones). Pickling drops ``param_bits`` (parameters are not saved): checkpoint
    such a state with state_dict() into a state constructed with the same ``param_bits``. ``comm`` is the group the buckets are reduced over: DDP's
    torch.distributed ProcessGroup (cgx over its own send/recv: torchrun, no MPI needed;
    CUDA buckets through a host copy), or an mpi4py intra-communicator holding the same
    processes in the same order (cgx over MPI; CUDA buckets by the device plans). Default:
    MPI.COMM_WORLD under mpirun (where this build has MPI), else torch.distributed's default
    group. The hook returns the average (sum / ranks).

    A bucket's plan is built the first time its layout is seen (DDP rebuilds its
    buckets after the first step); before, one small collective exchange checks that
    every rank has the same settings and layout: MismatchError on every rank otherwise.
    ``check="call"`` repeats that check on every call.

    ``overlap`` (default: when MPI was initialized with MPI_THREAD_MULTIPLE, as mpi4py
    does by default) runs the reductions on a background thread, one bucket after the
    other, while the backward pass goes on, as DDP's own allreduce does; the hook then
    returns a Future that the thread completes. ``overlap=False`` reduces inside the hook.

    Checkpoints: ``state_dict()`` / ``load_state_dict()`` (every rank its own: the
    error-feedback residuals are per rank), or pickle the state (``torch.save(state)``)
    as PowerSGDState is: the communicator is not saved, an unpickled state uses the
    default one. A restored state continues with the bits the uninterrupted run would
    have reduced with (settings, adaptive statistics, residuals and each plan's call
    counter, the key of its random bits), from the first step whose bucket layout is
    the saved one.
    """

    def __init__(self, comm=None, bits=4, *, bucket=None, rounding=None, min_compressed=None,
                 error_feedback=None, adaptive=None, check="build", seed=0x63677821, threads=1, overlap=None,
                 warmup_steps=0, param_bits=None, ef_decay=None, path=None, ef_sum=None):
        """See the class; raises ValueError/TypeError for bad settings or communicator."""
        self.param_bits = {}  # id(parameter) -> bits (0: uncompressed)
        for prm, b in (param_bits or {}).items():
            if not isinstance(prm, torch.Tensor):
                raise TypeError("cgx_torch: param_bits maps parameters (tensors) to bits")
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b <= 8:
                raise ValueError(f"cgx_torch: param_bits values must be ints in 0..8 (got {b!r})")
            self.param_bits[id(prm)] = b
        self._param_refs = list((param_bits or {}).keys())  # keeps the ids valid
        self._ctor = dict(bits=bits, bucket=bucket, rounding=rounding, min_compressed=min_compressed,
                          error_feedback=error_feedback, adaptive=adaptive, check=check, seed=seed, threads=threads,
                          overlap=overlap, warmup_steps=warmup_steps, ef_decay=ef_decay, path=path,
                          ef_sum=ef_sum)
        if path is None:
            env = os.environ.get("CGX_PATH", "").strip()
            if env:
                path = _core.check_path(env, "CGX_PATH")
            elif isinstance(min_compressed, str) and min_compressed.strip().lower() == "auto":
                path = "auto"
            else:  # bits 0: the uncompressed plan, as the warm-up's (nothing to measure against)
                path = "auto" if min_compressed is None and bits != 0 else "compressed"
        path = _core.check_path(path)
        if min_compressed is None or (isinstance(min_compressed, str) and min_compressed.strip().lower() == "auto"):
            min_compressed = 1024
        if bucket is None:
            bucket = default_bucket(bits)
        if rounding is None:
            rounding = default_rounding(bits)
        # error feedback by default (at 1 bit) only where it is implemented: CPU buckets
        self._ef_default = error_feedback is None and default_error_feedback(bits)
        if error_feedback is None:
            error_feedback = default_error_feedback(bits)
        if ef_decay is None:
            ef_decay = default_ef_decay(bits) if error_feedback else 1.0
        if ef_sum is None:
            ef_sum = _core.DEFAULT_EF_SUM
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"cgx_torch: warmup_steps must be an int >= 0 (got {warmup_steps!r})")
        self.warmup_steps = warmup_steps
        self.steps = 0  # steps begun: reductions of bucket 0 (DDP reduces bucket 0 first in every step)
        self.settings = _core.make_settings(bits, bucket, rounding, min_compressed, error_feedback, adaptive, check,
                                            seed, threads, ef_decay, ef_sum)
        # warm-up: the same buckets uncompressed (exact sums; the same bits on every rank)
        self._warm_settings = _core.make_settings(0, self.settings.bucket, self.settings.rounding, min_compressed,
                                                  False, None, check, seed, threads)
        # CUDA buckets where error feedback is on by default only (it is host-only): without it
        self._device_settings = _core.make_settings(bits, bucket, rounding, min_compressed, False, adaptive, check,
                                                    seed, threads) if self._ef_default else self.settings
        self._warm_plans = {}
        self.group = _core.group_of(comm)
        self.comm = self.group.comm if isinstance(self.group, _core.MPIGroup) else self.group.pg
        if path == "auto" and not isinstance(self.group, _core.TorchGroup):
            path = "compressed"  # the measured choice over torch.distributed groups only
        self.path = path
        # Over a torch.distributed group, everything the hook sends (its agreements, its
        # plans, its exact path and the measured choice's decisions) goes over a gloo
        # backend of this state's own, made at its first reduction on the thread that
        # reduces (_core.PrivateGroup), never over DDP's group: the buckets are reduced on
        # a background thread while DDP goes on using its group (find_unused_parameters'
        # allreduce of its map of used parameters, during the backward pass), and two
        # threads' collectives on one group interleave differently on different ranks.
        self._private_key = None
        if isinstance(self.group, _core.TorchGroup):
            name = _core._group_name(self.group.pg)
            n = _exact_serials.get(name, 0)  # every rank makes its states over a group in the same order
            _exact_serials[name] = n + 1
            self._private_key = f"cgx_torch/hook/{name}/{n}"
        self._paths = _core.MeasuredPath(self._agree)
        multiple = self.group.threads_ok()
        if overlap and not multiple:
            raise ValueError("cgx_torch: overlap=True needs MPI initialized with MPI_THREAD_MULTIPLE "
                             "(mpi4py's default; see mpi4py.rc.thread_level)")
        self.overlap = multiple if overlap is None else bool(overlap)
        self.plans = {}  # bucket index -> (layout key, plan)
        self._staging = {}  # bucket index -> its float32 buffer (float16/bfloat16 buckets)
        self.calls = 0
        self._worker = None
        self._pending = {}  # bucket index -> (layout key, plan snapshot) from load_state_dict
        _states.add(self)

    STATE_VERSION = 1

    def state_dict(self):
        """This rank's hook state for a checkpoint (local; take it between steps, when no
        reduction is in flight): the settings, the step count and, per bucket, its layout
        and its plan's snapshot (call counter, current bits per layer, adaptive
        statistics, error-feedback residuals). Plain Python data: torch.save or pickle."""
        plans = {i: (key, plan.snapshot()) for i, (key, plan) in self.plans.items()}
        plans.update({i: v for i, v in self._pending.items() if i not in plans})
        return {"version": self.STATE_VERSION, "settings": self.settings, "calls": self.calls, "steps": self.steps,
                "plans": plans}

    def load_state_dict(self, sd):
        """Takes over a state_dict() of this rank from a state with the same settings
        (ValueError otherwise). A bucket whose plan exists with the saved layout is
        restored at once; the others when their plan is built with that layout (the
        first step, or after DDP rebuilds its buckets). Local: every rank loads its own."""
        if not isinstance(sd, dict) or sd.get("version") != self.STATE_VERSION:
            raise ValueError(f"cgx_torch: not a CGXState state_dict of version {self.STATE_VERSION}")
        if sd["settings"] != self.settings:
            raise ValueError(f"cgx_torch: the state_dict's settings ({sd['settings']}) differ from this state's "
                             f"({self.settings})")
        self.calls = int(sd["calls"])
        self.steps = int(sd.get("steps", 0))  # (states saved before the warm-up existed have none)
        self._pending = dict(sd["plans"])
        for i, (key, plan) in list(self.plans.items()):
            self._restore(i, key, plan)

    def _restore(self, index, key, plan):
        """Restores bucket `index`'s pending snapshot into `plan` when the layouts agree."""
        pending = self._pending.get(index)
        if pending is not None and pending[0] == key:
            plan.restore(pending[1])
            del self._pending[index]

    def path_stats(self):
        """What the buckets took: a dict of path (this state's: "auto", "compressed",
        "exact"), compressed and exact (bucket reductions on each path) and picks (the
        measured choice's, one dict per size class seen: size_class, bytes, measured,
        compressed (the pick), native_s and compressed_s (the agreed, slowest rank's, times
        at the last decision), calls, decisions, flips). The same on every rank."""
        return {"path": self.path, **self._paths.stats()}

    def _report(self):
        """With CGX_TORCH_REPORT=PATH: appends one JSON line about this state (rank, size,
        calls, settings and path_stats()) to PATH.<pid>, once, at free() (or at exit),
        as the `cgx` backend does for its groups; nothing for a state that reduced nothing."""
        import json

        path = os.environ.get("CGX_TORCH_REPORT")
        if not path or not self.calls or getattr(self, "_reported", False):
            return
        self._reported = True
        line = {"hook": True, "rank": self.group.rank, "size": self.group.size, "calls": self.calls,
                "settings": repr(self.settings), "paths": self.path_stats()}
        with open(f"{path}.{os.getpid()}", "a") as f:
            f.write(json.dumps(line) + "\n")

    def _go_private(self):
        """At the first reduction (every rank at the same one, on the thread that reduces):
        moves this state onto its own gloo backend (see __init__; collective)."""
        if self._private_key is not None and not isinstance(self.group, _core.PrivateGroup):
            self.group = _core.PrivateGroup(self.group, self._private_key)

    def _agree(self, v):
        """The measured choice's agreement: the elementwise MAX of v over the ranks."""
        return _core.gloo_max_agree(self.group.pg)(v)

    def _exact_sum_(self, work):
        """Sums work in place exactly (over a torch.distributed group: this state's own gloo)."""
        return self.group.exact_allreduce_(work)

    def __getstate__(self):
        """Pickles the settings and state_dict(), not the communicator or the plans."""
        return {"ctor": self._ctor, "state": self.state_dict()}

    def __setstate__(self, d):
        """An unpickled state: over the default communicator (see the class), with the
        saved state pending until its buckets' plans are built."""
        self.__init__(None, **d["ctor"])
        self.load_state_dict(d["state"])

    def overrides(self, params):
        """Per layer of a bucket whose parameters are `params`: its param_bits (None: the
        state's bits); None when no parameter of the bucket has one."""
        if not self.param_bits or params is None:
            return None
        o = [self.param_bits.get(id(q)) for q in params]
        return o if any(b is not None for b in o) else None

    def plan_for(self, index, buf, layers, work=None, warm=False, overrides=None):
        """The plan of bucket `index` for this buffer and layout (collective when built);
        `work`: the tensor it reduces (buf, or buf's float32 copy: _core.staged); `warm`:
        the uncompressed plan of the warm-up steps."""
        settings = self._warm_settings if warm else self.settings
        if not warm and buf.device.type == "cuda":
            settings = self._device_settings
        plans = self._warm_plans if warm else self.plans
        if overrides is not None and not warm:
            # uncompressed layers through the one-dimensional flag (always uncompressed in the hook)
            layers = [(o, c, d or b == 0) for (o, c, d), b in zip(layers, overrides)]
        else:
            overrides = None
        key = (str(buf.dtype), _core.device_key(buf), buf.numel(), tuple(layers), settings,
               None if overrides is None else tuple(overrides))
        cached = plans.get(index)
        problem = _core.tensor_problem(buf, True if self.group.stages_cuda else None)
        if problem is None and settings.error_feedback and buf.device.type == "cuda":
            problem = ValueError("cgx_torch: error feedback is implemented for CPU tensors only")
        if cached is not None and cached[0] == key:
            if settings.check == "call":
                _core.agree(self.group, (index,) + key + (tuple(cached[1].settings()), self.path), problem)
            elif problem is not None:
                raise problem
            return cached[1]
        # A new layout: DDP rebuilt its buckets (after the first step). Bucket 0 is
        # reduced first in every step, so a new bucket 0 means the old plans are stale.
        if index == 0:
            plans.clear()
        plans.pop(index, None)
        # (the path is agreed with the layout: ranks on different paths would wait for each other)
        _core.agree(self.group, (index,) + key + ((None,) if settings.check == "call" else ()) + (self.path,),
                    problem)
        plan = _core.new_plan(self.group, buf if work is None else work, layers, settings)
        if overrides is not None and any(b for b in overrides if b is not None):
            # the layers' own widths (every rank the same): set through the plan's snapshot
            snap = plan.snapshot()
            snap["settings"] = [(b if b is not None and s0 != 0 else s0, k) for (s0, k), b in
                                zip(snap["settings"], overrides)]
            plan.restore(snap)
        plans[index] = (key, plan)
        if not warm:
            self._restore(index, key, plan)
        return plan

    def _active(self):
        """The plans the current step reduces with (the uncompressed ones in the warm-up)."""
        return self._warm_plans if self.steps <= self.warmup_steps and self._warm_plans else self.plans

    def average_bits(self):
        """Average bits per value over all buckets' current settings (metadata excluded;
        32 or 64 in the warm-up steps)."""
        plans = self._active().values()
        tot = sum(p.size for _, p in plans)
        return sum(p.average_bits * p.size for _, p in plans) / tot if tot else 0.0

    def bytes_sent(self):
        """Bytes this rank sends per step over all buckets, with the current settings
        (the warm-up's uncompressed bytes in the warm-up steps)."""
        return sum(p.bytes_sent for _, p in self._active().values())

    def layer_bits(self):
        """{bucket index: [bits of each layer]} (0: uncompressed)."""
        return {i: [b for b, _ in p.settings()] for i, (_, p) in sorted(self.plans.items())}

    def reduce(self, index, buf, layers, overrides=None):
        """Averages `buf` (bucket `index`, laid out as `layers`) over the ranks, in place:
        float32/float64 by its plan, float16/bfloat16 through a float32 copy, complex
        exactly (MPI)."""
        self._go_private()
        if isinstance(buf, torch.Tensor) and buf.dtype in _core.EXACT_DTYPES:
            _core.agree(self.group, (index, "exact", str(buf.dtype), _core.device_key(buf), buf.numel(),
                                      self.settings), _core.tensor_problem(buf, True if self.group.stages_cuda else None))
            self.group.exact_allreduce_(buf)
            self.calls += 1
            return buf.div_(self.group.size)
        if index == 0:
            self.steps += 1
        warm = self.steps <= self.warmup_steps
        if not warm and self._warm_plans:
            self._warm_plans.clear()
        work = self._staged(index, buf) if isinstance(buf, torch.Tensor) else buf
        plan = self.plan_for(index, buf, layers, work, warm, overrides)
        if warm:
            plan.run(work)
        elif self.path == "auto":
            self._paths.run((str(work.dtype), work.device.type), work.numel() * work.element_size(),
                            lambda: plan.run(work), lambda: self._exact_sum_(work))
        elif self.path == "compressed":
            plan.run(work)
            self._paths.compressed += 1
        else:
            self._exact_sum_(work)
            self._paths.exact += 1
        work.div_(self.group.size)
        self.calls += 1
        return _core.unstage(buf, work)

    def _staged(self, index, buf):
        """buf itself, or (float16/bfloat16) buf copied into bucket `index`'s float32
        buffer, allocated once per layout and reused every step; over a torch.distributed
        group a CUDA bucket is copied into a host buffer the same way."""
        host = self.group.stages_cuda and buf.device.type != "cpu"
        if buf.dtype not in _core.STAGED_DTYPES and not host:
            return buf
        dtype = torch.float32 if buf.dtype in _core.STAGED_DTYPES else buf.dtype
        device = torch.device("cpu") if host else buf.device
        work = self._staging.get(index)
        if work is None or work.numel() != buf.numel() or work.device != device or work.dtype != dtype:
            work = torch.empty(buf.numel(), dtype=dtype, device=device, pin_memory=host and torch.cuda.is_available())
            self._staging[index] = work
        return work.view(buf.shape).copy_(buf)

    def submit(self, fn, fut):
        """Runs fn() on this state's background thread, completing fut with its result."""
        if self._worker is None:
            self._worker = _core.Worker("cgx_torch-hook")
        self._worker.submit(fn, fut)

    def free(self):
        """Stops the background thread and releases the plans (MPI communicators,
        workspace, error-feedback residuals). Call it (or let the state go) before MPI
        is finalized; cgx_torch does it at exit."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._report()
        self.plans.clear()
        self._warm_plans.clear()
        self._staging.clear()


# The measured defaults per width live in _core (one width, one default: the hook, the
# backend and allreduce_ share them); re-exported here for cgx_torch 0.1's callers.
default_bucket = _core.default_bucket
default_rounding = _core.default_rounding
default_error_feedback = _core.default_error_feedback
default_ef_decay = _core.default_ef_decay
DEFAULT_EF_DECAY = _core.DEFAULT_EF_DECAY
DEFAULT_EF_SUM = _core.DEFAULT_EF_SUM


def cgx_hook(state: CGXState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: reduces the bucket's gradients with cgx (see CGXState) and
    returns a Future holding the average over the ranks. Register with
    ``ddp_model.register_comm_hook(CGXState(...), cgx_hook)``. The buckets are reduced in
    the order DDP launches them (the same on every rank): on the state's background
    thread (``overlap``), or inside the hook. Errors (bad tensors, settings that differ
    between ranks, failures in cgx) are raised by the backward pass.
    """
    buf = _bucket_buffer(bucket)
    layers = bucket_layers(buf, _bucket_gradients(bucket))
    index = _bucket_index(bucket)
    overrides = state.overrides(bucket.parameters()) if state.param_bits and hasattr(bucket, "parameters") else None
    fut = torch.futures.Future(devices=[buf.device]) if buf.device.type == "cuda" else torch.futures.Future()
    if state.overlap and buf.device.type == "cpu":
        state.submit(lambda: state.reduce(index, buf, layers, overrides), fut)
    else:
        fut.set_result(state.reduce(index, buf, layers, overrides))
    return fut


@atexit.register
def _free_all():
    """At exit: stops the hook threads and frees every state's plans before mpi4py finalizes MPI."""
    for s in list(_states):
        s.free()


def init_process_group_from_mpi(comm, backend="gloo"):
    """Initializes torch.distributed's default process group over the ranks of the mpi4py
    communicator ``comm`` (rank and size from it): rank 0 picks a free TCP port on
    127.0.0.1 and broadcasts it (env:// rendezvous; MASTER_ADDR and GLOO_SOCKET_IFNAME
    default to the loopback: set them for a job across hosts). Collective over ``comm``."""
    import os
    import socket
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, rank=comm.rank, world_size=comm.size)
