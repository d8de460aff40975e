"""The ``cgx`` torch.distributed backend (torch >= 2.x).

Installed cgx_torch registers it through torch's entry points (cgx_torch_autoload.py), so
``dist.init_process_group("cgx")``, ``"cpu:cgx,cuda:cgx"``, ``new_group(backend="cgx")``
and DeviceMesh sub-groups work with no import of cgx in the script; ``import cgx_torch``
registers it too (torch < 2.5, or a build that was not installed). Each group holds two
gloo backends over its Store: one for cgx's own messages (the compressed calls, run on
the group's worker thread in the order they were issued) and one for the exact calls
(the caller's thread, as gloo runs them), so the two never reorder each other's messages.

- ``all_reduce`` of one float tensor (float32, float64; float16 and bfloat16 through a
  float32 copy) with SUM or AVG: cgx's compressed layer-wise plan, one layer; CUDA
  tensors through a host copy (waited for on the caller's thread);
- ``reduce_scatter_tensor`` (and its coalesced form) of such tensors, SUM or AVG: cgx's
  compressed reduce-scatter (``layerwise_plan::reduce_scatter``: one layer per rank's
  shard, the first phase of the allreduce alone, half its bytes): each rank's shard of
  the sum, its own values exact and the others' compressed;
- every other op, dtype and reduction (all-gathers included: parameters travel exact)
  goes to gloo unchanged and exact.

The compressed calls return at once with a Work that completes when the worker has
reduced the tensor (DDP overlaps them with the backward pass, as it does gloo's); an
error (a peer's failure, settings that differ between ranks) is raised by ``wait()`` on
every rank. Their settings are read at every call, with torch_cgx's names where it has
them (``configure()`` overrides them):

- ``CGX_COMPRESSION_QUANTIZATION_BITS``: 1..8; 32 or 0 uncompressed; default 4 (with
  ``import torch_cgx``: 32, as torch_cgx's);
- ``CGX_COMPRESSION_BUCKET_SIZE``: 64, 128, 512, 1024 or 2048; default the width's
  measured one (1-2 bits 128, 3-8 bits 1024), as the hook's;
- ``CGX_PATH``: ``auto`` (the default), ``compressed`` or ``exact``: how an eligible call
  (an ``all_reduce`` or ``reduce_scatter_tensor`` above) is sent. ``auto``, the measured
  choice: per size class of call (its bytes rounded down to a power of two) the worker
  times the compressed path and the exact one (gloo's allreduce on the worker's own gloo
  backend, in issue order) on the script's own calls, the ranks agree (the slowest rank's
  time of each path decides) and the faster path is kept, re-checked every 16 to 256
  calls (two calls on the other path); calls under 4096 bytes go exact. It is cgx's own
  algorithm (``cgx::detail::path_choice``, docs/threshold.md): every rank takes the same
  path on every call. On a fast link (loopback, shared memory) it keeps a job as fast as
  gloo; on a slow one it compresses. ``compressed``: always cgx's plan (tensors under
  ``CGX_COMPRESSION_MINIMAL_SIZE`` values uncompressed inside it); ``exact``: always
  gloo's exact allreduce, on the worker. What was picked: ``path_stats()`` and the
  ``CGX_TORCH_REPORT`` line;
- ``CGX_COMPRESSION_MINIMAL_SIZE``: tensors with fewer values go uncompressed inside the
  plan; default 1024 (``import torch_cgx``: 16, and never below 16, as torch_cgx's).
  Setting it (an integer; ``configure(min_compressed=n)``) keeps the fixed rule: the
  path is then ``compressed`` unless ``CGX_PATH`` says otherwise; ``auto`` (or unset) is
  the measured choice. ``import torch_cgx`` keeps the fixed rule too (torch_cgx's
  semantics) unless ``CGX_PATH`` is set;
- ``CGX_COMPRESSION_ROUNDING`` (stochastic or nearest; default the width's: 1-2 bits
  nearest, 3-8 stochastic) and ``CGX_COMPRESSION_SEED``: cgx's own.

torch_cgx's other variables are answered, never ignored: ``CGX_FUSION_BUFFER_SIZE_MB``,
``CGX_INNER_COMMUNICATOR_TYPE``/``CGX_CROSS_COMMUNICATOR_TYPE`` (MPI, SHM, NCCL),
``CGX_INNER_REDUCTION_TYPE``/``CGX_CROSS_REDUCTION_TYPE`` (SRA, Ring) and
``CGX_INTRA_BROADCAST``, ``CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS`` with a warning (once
per value) that says what cgx does instead (every value within the same bound); a value
that none of them takes is an error. Every rank must use the same settings (checked at
every compressed call, in one small allreduce: MismatchError raised by every rank's
``wait()``, and the group goes on).
"""
import atexit
import contextlib
import datetime
import json
import os
import time
import warnings
import weakref

import torch
import torch.distributed as dist

from . import _C, _core

try:  # torch >= 2.x: Python subclasses of c10d's Backend
    from torch._C._distributed_c10d import Backend as _C10dBackend
except ImportError:  # torch 1.13: no `cgx` backend (the hook and allreduce_ work)
    _C10dBackend = None

_overrides = {}

_ENV = {
    "bits": "CGX_COMPRESSION_QUANTIZATION_BITS",
    "bucket": "CGX_COMPRESSION_BUCKET_SIZE",
    "min_compressed": "CGX_COMPRESSION_MINIMAL_SIZE",
    "rounding": "CGX_COMPRESSION_ROUNDING",
    "seed": "CGX_COMPRESSION_SEED",
    "path": "CGX_PATH",
}

# torch_cgx's variables that choose how bytes travel, not what is computed: the values it
# takes, and what cgx does instead (the answer a script gets, once per value).
_TRAVEL = {
    "CGX_FUSION_BUFFER_SIZE_MB": (None, "cgx reduces each tensor torch hands it (DDP's buckets are set by "
                                        "bucket_cap_mb); it fuses nothing itself"),
    "CGX_INNER_COMMUNICATOR_TYPE": (("MPI", "SHM", "NCCL"), "the `cgx` backend sends over the group's own "
                                    "gloo connections (torchrun or mpirun alike); cgx's MPI, shared-memory and "
                                    "NCCL transports are used by the C++ plans and by cgx_torch over mpi4py"),
    "CGX_CROSS_COMMUNICATOR_TYPE": (("MPI", "NCCL"), "the `cgx` backend sends over the group's own gloo "
                                    "connections"),
    "CGX_INNER_REDUCTION_TYPE": (("SRA", "RING"), "the `cgx` backend reduces with scatter-reduce-allgather"),
    "CGX_CROSS_REDUCTION_TYPE": (("SRA", "RING"), "the `cgx` backend reduces with scatter-reduce-allgather"),
    "CGX_INTRA_BROADCAST": (("0", "1"), "every rank takes part in every phase (no per-node leader)"),
    "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS": (("0", "1"), "the last, shorter bucket of a tensor is "
                                                "compressed as the others, within the same bound"),
}
# The values that are what cgx does anyway: no warning.
_TRAVEL_SAME = {"CGX_INNER_REDUCTION_TYPE": "SRA", "CGX_CROSS_REDUCTION_TYPE": "SRA", "CGX_INTRA_BROADCAST": "0",
                "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS": "0"}
_warned = set()

#: The defaults of each profile: "cgx" (cgx_torch's), "torch_cgx" (set by import torch_cgx).
PROFILES = {
    "cgx": {"bits": 4, "min_compressed": 1024, "min_floor": 0},
    "torch_cgx": {"bits": 0, "min_compressed": 16, "min_floor": 16},
}
_profile = "cgx"


def use_defaults(profile):
    """Selects the defaults of settings the environment and configure() leave unset:
    "cgx" (4 bits, tensors of 1024 values and more compressed) or "torch_cgx" (torch_cgx's:
    uncompressed unless CGX_COMPRESSION_QUANTIZATION_BITS is below 32, tensors of 16
    values and more). ``import torch_cgx`` selects "torch_cgx". Applies to every later call
    of every `cgx` group of this process (every rank must select the same)."""
    global _profile
    if profile not in PROFILES:
        raise ValueError(f"cgx_torch: unknown defaults {profile!r} (known: {sorted(PROFILES)})")
    _profile = profile
    _settings_cache.clear()


def configure(**settings):
    """Overrides the environment's settings for every later call of the `cgx` backend:
    bits, bucket, min_compressed (an int: the fixed rule; "auto": the measured choice),
    rounding, seed (see cgx_torch.make_settings), path ("auto", "compressed", "exact":
    see CGX_PATH in the module comment)."""
    unknown = set(settings) - set(_ENV)
    if unknown:
        raise TypeError(f"cgx_torch.backend.configure: unknown settings {sorted(unknown)} (known: {sorted(_ENV)})")
    given = {**_env_settings(), **settings}
    _resolve(given)  # checks them now
    _path_of(given)
    _overrides.update(settings)
    _settings_cache.clear()


def reset():
    """Forgets configure()'s overrides (the environment and the defaults apply again)."""
    _overrides.clear()
    _settings_cache.clear()


def _env_settings():
    """The settings the environment gives (ValueError for a value that is not a number)."""
    out = {}
    for key, var in _ENV.items():
        v = os.environ.get(var)
        if v is None or v.strip() == "":
            continue
        if key in ("rounding", "path") or (key == "min_compressed" and v.strip().lower() == "auto"):
            out[key] = v.strip().lower()
            continue
        try:
            n = int(v, 0)
        except ValueError:
            raise ValueError(f"cgx_torch: {var}={v!r} is not an integer") from None
        if key == "bits" and n == 32:
            n = 0  # torch_cgx's "no compression" (other values outside 0..8: ValueError from the settings)
        out[key] = n
    return out


def _answer_travel_variables():
    """Warns once per (variable, value) about torch_cgx's transport variables; ValueError
    for a value torch_cgx would not take either."""
    for var, (values, instead) in _TRAVEL.items():
        v = os.environ.get(var)
        if v is None or v.strip() == "":
            continue
        u = v.strip().upper()
        if values is None:
            try:
                ok = int(u) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"cgx_torch: {var}={v!r}: expected a positive integer (megabytes)")
        elif u not in values:
            raise ValueError(f"cgx_torch: {var}={v!r}: expected one of {', '.join(values)}")
        if _TRAVEL_SAME.get(var) == u or (var, u) in _warned:
            continue
        _warned.add((var, u))
        warnings.warn(f"cgx_torch: {var}={v} has no effect here: {instead}", RuntimeWarning, stacklevel=4)


def _resolve(given):
    """Settings from the given values and the profile's defaults (the width's measured
    bucket and rounding where none is given)."""
    d = PROFILES[_profile]
    bits = given.get("bits", d["bits"])
    bucket = given.get("bucket", _core.default_bucket(bits))
    rounding = given.get("rounding", _core.default_rounding(bits))
    mc = given.get("min_compressed", "auto")
    min_compressed = max(d["min_compressed"] if mc == "auto" else mc, d["min_floor"])
    extra = {"seed": given["seed"]} if "seed" in given else {}
    return _core.make_settings(bits=bits, bucket=bucket, rounding=rounding, min_compressed=min_compressed, **extra)


def _path_of(given):
    """The path of eligible calls (see CGX_PATH): given "path", else "auto" unless a
    min_compressed is given as a number or the profile is torch_cgx's (the fixed rule:
    "compressed")."""
    p = given.get("path")
    if p is not None:
        return _core.check_path(p, "CGX_PATH")
    mc = given.get("min_compressed")
    if isinstance(mc, str):
        if mc.strip().lower() != "auto":
            raise ValueError(f"cgx_torch: min_compressed must be an int >= 0 or 'auto' (got {mc!r})")
        return "auto"
    return "compressed" if mc is not None or _profile == "torch_cgx" else "auto"


_settings_cache = {}


def _settings_and_path():
    """(settings, path) of a `cgx` call issued now (read from the environment each time;
    ValueError for a value the plans do not take)."""
    key = (_profile, tuple(os.environ.get(v) for v in _ENV.values()), tuple(sorted(_overrides.items())))
    sp = _settings_cache.get(key)
    if sp is None:
        _answer_travel_variables()
        given = {**_env_settings(), **_overrides}
        sp = (_resolve(given), _path_of(given))
        if len(_settings_cache) > 64:
            _settings_cache.clear()
        _settings_cache[key] = sp
    return sp


def settings():
    """The settings a `cgx` call issued now uses (read from the environment each time;
    ValueError for a value the plans do not take)."""
    return _settings_and_path()[0]


def path():
    """The path an eligible `cgx` call issued now takes: "auto" (measured), "compressed"
    or "exact" (see CGX_PATH in the module comment)."""
    return _settings_and_path()[1]


def _backend_of(group):
    """The CGXBackend of group (None: the default group), or None when it has none."""
    if _C10dBackend is None:  # torch 1.13: no `cgx` backend
        return None
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        b = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return None
    return b if isinstance(b, CGXBackend) else None


def path_stats(group=None):
    """What the `cgx` group `group` (default: the default group) sent each way: a dict of
    compressed (calls that took cgx's compressed path), exact (calls that took gloo's
    exact allreduce on the worker: the measured choice's or CGX_PATH=exact's) and picks
    (one dict per kind of call and size class the measured choice has seen: kind,
    size_class, bytes, measured, compressed (the pick), native_s and compressed_s (the
    agreed times at the last decision), calls, decisions, flips). Local (this rank's
    view; the picks are the same on every rank). Calls still queued on the worker are not
    counted yet: wait() for them first. ValueError if the group is not a `cgx` group."""
    b = _backend_of(group)
    if b is None:
        raise ValueError("cgx_torch: path_stats: not a `cgx` process group")
    return b.path_stats()


_backends = weakref.WeakSet()


def _report(b):
    """With CGX_TORCH_REPORT=PATH: appends one JSON line about backend b (its rank, size,
    calls handed to cgx, plans built, settings, path, and path_stats(): the calls that
    took each path and the measured choice's picks) to PATH.<pid>, once (at
    destroy_process_group or at exit): how a launcher or a test sees that a script really
    went through cgx, and which way its calls went."""
    out = os.environ.get("CGX_TORCH_REPORT")
    if not out or getattr(b, "_reported", True):
        return
    b._reported = True
    line = {"rank": b._rank, "size": b._size, "compressed_calls": b.calls, "plans": b.plans_built,
            "settings": repr(settings()), "path": path(), "paths": b.path_stats()}
    with open(f"{out}.{os.getpid()}", "a") as f:
        f.write(json.dumps(line) + "\n")


@atexit.register
def _shutdown_all():
    """At exit: shuts down the groups the script did not destroy (their worker threads and
    channels stop while Python still runs; each reports, with CGX_TORCH_REPORT)."""
    for b in list(_backends):
        b.shutdown()


try:  # torch >= 2.x: Work is subclassable from Python (torch 1.13 has no `cgx` backend)
    _WorkBase = dist.Work if _C10dBackend is not None else object
except AttributeError:
    _WorkBase = object


class _Work(_WorkBase):
    """The Work of a call the worker runs: wait() blocks until the worker has run it and
    raises what it raised (torch's Work made from a future returns True even when the
    future holds an error); get_future() is its future (DDP chains on it)."""

    def __init__(self, fut):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None):
        """Waits for the call (at most `timeout`, a timedelta, where one > 0 is given:
        RuntimeError after it; the call itself is bounded by the group's timeout) and
        raises its exception."""
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0
        if secs > 0 and not self._fut.done():
            deadline = time.monotonic() + secs
            while not self._fut.done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cgx_torch: a `cgx` call did not complete within {timeout}")
                time.sleep(0.0005)
        self._fut.wait()  # raises the call's exception
        return True

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self):
        try:
            self._fut.value()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def result(self):
        return self._fut.value()

    def get_future(self):
        return self._fut


if _C10dBackend is not None:

    class _BackendGroup(_core.TorchGroup):
        """TorchGroup over the gloo backend of a CGXBackend's compressed calls."""

        def __init__(self, gloo, store, timeout):
            self.pg = gloo
            self.timeout_ms = max(1, int(timeout.total_seconds() * 1000))
            self.channel = _C.Channel(gloo, store, self.timeout_ms, "cgx_torch/backend-failure")
            self.size, self.rank = self.channel.size, self.channel.rank
            self.key = ("backend", id(self))
            self._init_device(store, "backend")

        def exact_allreduce_(self, t):
            """Sums t in place with the compressed calls' gloo backend (exact)."""
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            self.pg.allreduce([t], opts).wait()
            return t

    def _avg_of(op):
        return op == dist.ReduceOp.AVG

    def _on_stream(stream):
        """A context that makes `stream` (a torch.cuda.Stream, or None: nothing) current."""
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    class CGXBackend(_C10dBackend):
        """torch.distributed backend ``cgx`` (see the module comment)."""

        def __init__(self, store, rank, size, timeout):
            """Called (through create_backend) by init_process_group / new_group with the
            group's Store, rank, size and timeout."""
            super().__init__(rank, size)
            if not isinstance(timeout, datetime.timedelta):
                timeout = datetime.timedelta(milliseconds=int(timeout))
            self._size = size
            self._rank = rank
            self._timeout = timeout
            # exact calls: gloo as it is; compressed calls: their own gloo (own Store prefix)
            self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
            self._store = store
            self._exact_worker_gloo = None  # the worker's exact sums (made at the first: _exact_gloo)
            self._cgx_store = dist.PrefixStore("cgx", store)
            self._cgx_gloo = dist.ProcessGroupGloo(self._cgx_store, rank, size, timeout)
            self._group = _BackendGroup(self._cgx_gloo, self._cgx_store, timeout)
            # the agreements of the compressed calls: issued at each call on the caller's
            # thread (so in issue order), settled on the worker before the call runs, so
            # the round trip overlaps the calls queued before it
            self._agree_gloo = dist.ProcessGroupGloo(dist.PrefixStore("cgx-agree", store), rank, size, timeout)
            self._hashes = {}
            self._plans = {}
            # the measured choice (CGX_PATH=auto): run, timed and agreed on the worker,
            # over the worker's gloo (its exact path and its decisions in issue order)
            self._paths = _core.MeasuredPath(_core.gloo_max_agree(self._cgx_gloo))
            self._worker = _core.Worker(f"cgx_torch-backend-r{rank}")
            self.calls = 0  # calls handed to cgx (bits > 0): compressed, measured or CGX_PATH=exact
            self.plans_built = 0
            self._reported = False
            _backends.add(self)

        def getBackendName(self):
            return "cgx"

        def shutdown(self):
            """destroy_process_group: finishes the queued calls, frees the plans and the channel."""
            w, self._worker = getattr(self, "_worker", None), None
            if w is not None:
                w.stop()
            _report(self)
            self._plans.clear()
            self._group = None

        def abort(self):
            self.shutdown()

        def path_stats(self):
            """See cgx_torch.backend.path_stats (this group's)."""
            return self._paths.stats()

        # The compressed ops.
        @staticmethod
        def _compressible(t, op):
            """Whether cgx compresses this reduction of t."""
            return (isinstance(t, torch.Tensor) and t.dtype in _core.COMPRESSED_DTYPES and t.layout == torch.strided
                    and t.device.type in ("cpu", "cuda") and t.is_contiguous()
                    and (op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG))  # (SUM == op is False)

        @staticmethod
        def _key(t, scatter, s):
            """What every rank must agree on for a compressed call on t with settings s."""
            return (tuple(t.shape), str(t.dtype), t.device.type, "reduce_scatter" if scatter else "allreduce", s)

        def _propose(self, keys, problem=None):
            """Issues the agreement of one compressed call (caller's thread, issue order):
            a MAX allreduce of (hash, -hash, this rank has a problem) of its keys on the
            agreement gloo. Every call agrees, since the settings are read at each call and
            a rank whose environment differs must not reach a cached plan while its peers
            build theirs. Returns the ticket the worker settles."""
            h = self._hashes.get(keys)
            if h is None:
                if len(self._hashes) > 1024:
                    self._hashes.clear()
                h = self._hashes[keys] = _core.stable_hash(keys)
            v = torch.tensor([h, -h, int(problem is not None)], dtype=torch.int64)
            o = dist.AllreduceOptions()
            o.reduceOp = dist.ReduceOp.MAX
            return keys, v, self._agree_gloo.allreduce([v], o), problem

        @staticmethod
        def _settle(ticket):
            """Waits for a call's agreement (worker) and raises, on every rank: this rank's
            own problem (settings the environment gives that the plans do not take), or
            ValueError when another rank had one, or MismatchError when the keys differ."""
            keys, v, work, problem = ticket
            work.wait()
            _core.judge(keys, int(v[0]) == -int(v[1]), bool(v[2]), problem, peer="'s `cgx` settings are invalid")

        def _call_settings(self, key_of):
            """(settings, path, agreement ticket) of a compressed call whose keys
            key_of(settings) gives (the path agreed with them): the settings read now;
            where the environment's are invalid, this rank still takes part in the
            agreement (its peers must not wait for it until the group's timeout) and its
            Work raises the error."""
            try:
                s, pth = _settings_and_path()
            except (TypeError, ValueError) as e:
                return None, None, self._propose(("invalid settings",), e)
            return s, pth, self._propose((key_of(s), pth))

        def _chosen(self, pth, kind, nbytes, compressed, exact):
            """Runs compressed() or exact() as path pth says (worker): "auto" through the
            measured choice, else the one named (counted in path_stats)."""
            if pth == "auto":
                return self._paths.run(kind, nbytes, compressed, exact)
            comp = pth == "compressed"
            if comp:
                compressed()
                self._paths.compressed += 1
            else:
                exact()
                self._paths.exact += 1
            return comp

        def _exact_gloo(self):
            """The gloo backend of the worker's exact sums (CGX_PATH=exact, the measured
            choice's exact path, bits 0), made at the first (on the worker, where every rank
            reaches it at the same call: collective). Not the compressed calls' gloo: big
            exact allreduces on the plans' connections slowed the plans' later messages
            (3-4% of a DDP step at 1 Gbit/s: their sockets' buffers)."""
            if self._exact_worker_gloo is None:
                self._exact_worker_gloo = dist.ProcessGroupGloo(dist.PrefixStore("cgx-exact", self._store), self._rank,
                                                                self._size, self._timeout)
            return self._exact_worker_gloo

        def _worker_exact_allreduce(self, t, avg):
            """gloo's exact sum (average) of t on the worker, in the worker's order."""
            o = dist.AllreduceOptions()
            o.reduceOp = dist.ReduceOp.SUM
            self._exact_gloo().allreduce([t], o).wait()
            if avg:
                t.div_(self._size)
            return t

        def _entry(self, t, scatter, s):
            """(plan, staging buffer or None) for t with settings s, built once per shape,
            dtype, device, operation and settings (agreed: _propose, _settle): one layer
            (allreduce) or one layer per rank's shard (reduce-scatter). A float16 or
            bfloat16 tensor goes through a float32 buffer kept with the plan; a CUDA
            tensor's allreduce runs on the device where the group has a device transport
            (CGX_TORCH_DEVICE_TRANSPORT), else through a host buffer, as does every
            reduce-scatter's input. Runs on the worker."""
            key = self._key(t, scatter, s)
            entry = self._plans.get(key)
            if entry is None:
                # (a reduce-scatter leaves all but its shard unspecified: always on a copy)
                on_device = t.device.type == "cuda" and not scatter and not self._group.stages_cuda
                staged = scatter or t.dtype in _core.STAGED_DTYPES or (t.device.type != "cpu" and not on_device)
                buf = torch.empty(t.numel(), dtype=torch.float32 if t.dtype in _core.STAGED_DTYPES else t.dtype,
                                  device=t.device if on_device else "cpu") if staged else None
                n, p = t.numel(), self._size
                layers = [(r * (n // p), n // p, False) for r in range(p)] if scatter else [(0, n, False)]
                plan = _core.new_plan(self._group, buf if staged else t, layers, s)
                if len(self._plans) >= 256:  # shapes that come and go: keep the cache bounded
                    self._plans.pop(next(iter(self._plans)))
                entry = self._plans[key] = (plan, buf)
                self.plans_built += 1
            return entry

        def _reduce(self, t, average, s):
            """Sums (or averages) t over the group in place with cgx (worker)."""
            plan, buf = self._entry(t, False, s)
            work = t if buf is None else buf.view(t.shape).copy_(t)
            plan.run(work)
            if average:
                work.div_(self._size)
            if work is not t:
                t.copy_(work)
            return t

        def _submit(self, fn, device):
            """Runs fn on the worker: a Work that completes later (CPU), or completed
            before returning (CUDA: its host copies are made on the caller's stream)."""
            if self._worker is None:
                raise _core.CGXError("cgx_torch: the `cgx` group was shut down")
            w = _Work(torch.futures.Future())
            self._worker.submit(fn, w.get_future())
            if device == "cuda":
                w.wait()
            return w

        def allreduce(self, tensors, opts):
            op = opts.reduceOp
            if len(tensors) == 1 and self._compressible(tensors[0], op):
                # Agreed and run on the worker even when the settings say uncompressed
                # (bits 0): a rank whose environment says otherwise must meet an agreement,
                # not an exact allreduce it would wait on until the group's timeout.
                t, avg = tensors[0], _avg_of(op)
                s, pth, ticket = self._call_settings(lambda s: self._key(t, False, s))  # read now, at the call
                self.calls += s is not None and s.bits != 0

                stream = torch.cuda.current_stream(t.device) if t.device.type == "cuda" else None

                def run():
                    self._settle(ticket)
                    if s.bits == 0:
                        return [self._worker_exact_allreduce(t, avg)]  # gloo's exact sum, in the worker's order
                    with _on_stream(stream):  # the caller's stream: copies and device plans ordered after its work
                        self._chosen(pth, ("allreduce", str(t.dtype), t.device.type, s),
                                     t.numel() * t.element_size(), lambda: self._reduce(t, avg, s),
                                     lambda: self._worker_exact_allreduce(t, avg))
                    return [t]

                return self._submit(run, t.device.type)
            return self._exact_allreduce(tensors, op, opts)

        def _exact_allreduce(self, tensors, op, opts):
            """gloo's allreduce; AVG (which gloo lacks) as its SUM divided by the size."""
            if not _avg_of(op):
                return self._gloo.allreduce(tensors, opts)
            sum_opts = dist.AllreduceOptions()
            sum_opts.reduceOp = dist.ReduceOp.SUM
            size = self._size

            def divide(fut):
                fut.wait()
                for t in tensors:
                    t.div_(size)
                return tensors

            return _Work(self._gloo.allreduce(tensors, sum_opts).get_future().then(divide))

        def reduce_scatter_single(self, output, input, opts):  # noqa: A002 (torch's name)
            return self._reduce_scatter([output], [input], opts)

        def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
            return self._reduce_scatter(list(outputs), list(inputs), opts)

        # the same ops under the names of earlier torch 2.x
        _reduce_scatter_base = reduce_scatter_single
        reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

        def _reduce_scatter(self, outputs, inputs, opts):
            """Reduce-scatter of each inputs[i] into outputs[i] (one Work for all)."""
            op, p = opts.reduceOp, self._size
            for o, i in zip(outputs, inputs):
                if i.numel() != p * o.numel():
                    raise ValueError(f"cgx: reduce_scatter_tensor: input of {i.numel()} values for an output of "
                                     f"{o.numel()} values on {p} ranks")
                if o.dtype != i.dtype or o.device != i.device:
                    raise ValueError(f"cgx: reduce_scatter_tensor: output ({o.dtype}, {o.device}) and input "
                                     f"({i.dtype}, {i.device}) differ")
            if inputs and len(outputs) == len(inputs) and all(self._compressible(i, op) for i in inputs):
                # agreed and run on the worker at bits 0 too (see allreduce)
                s, pth, ticket = self._call_settings(lambda s: tuple(self._key(i, True, s) for i in inputs))
                avg, rank = _avg_of(op), self._rank
                self.calls += s is not None and s.bits != 0

                def exact():
                    self._exact_reduce_scatter(outputs, inputs, op, self._exact_gloo()).wait()

                def compressed():
                    for o, i in zip(outputs, inputs):
                        plan, buf = self._entry(i, True, s)
                        work = buf.view(i.shape).copy_(i).view(-1)
                        plan.reduce_scatter(work)
                        m = o.numel()
                        shard = work[rank * m:(rank + 1) * m]
                        if avg:
                            shard.div_(p)
                        o.view(-1).copy_(shard)

                def run():
                    self._settle(ticket)
                    if s.bits == 0:
                        exact()
                    else:
                        self._chosen(pth, ("reduce_scatter", str(inputs[0].dtype), inputs[0].device.type, s),
                                     sum(i.numel() * i.element_size() for i in inputs), compressed, exact)
                    return outputs

                return self._submit(run, inputs[0].device.type)
            return self._exact_reduce_scatter(outputs, inputs, op, self._gloo)

        def _exact_reduce_scatter(self, outputs, inputs, op, gloo):
            """gloo: the allreduce of a copy of each input, this rank's shard kept (AVG: divided).
            Not gloo's own reduce-scatter: its Work has no future (getFuture is not
            implemented), and DDP, FSDP2 and the AVG division chain on one."""
            p, rank = self._size, self._rank
            sum_op = dist.ReduceOp.SUM if _avg_of(op) else op
            copies = [i.detach().clone() for i in inputs]
            o = dist.AllreduceOptions()
            o.reduceOp = sum_op
            works = [gloo.allreduce([c], o) for c in copies]

            def finish(done):
                # (not works[i].wait(): this runs in the thread that completes gloo's work,
                # which would then wait for itself; the collected futures carry the errors)
                for f in done.value():
                    f.value()
                for out, c in zip(outputs, copies):
                    m = out.numel()
                    out.view(-1).copy_(c.view(-1)[rank * m:(rank + 1) * m])
                    if _avg_of(op):
                        out.div_(p)
                return outputs

            return _Work(torch.futures.collect_all([w.get_future() for w in works]).then(finish))

        # Everything else: gloo, unchanged (torch 2.15's names, and earlier 2.x's).
        def broadcast(self, tensors, opts):
            return self._gloo.broadcast(tensors, opts)

        def allreduce_coalesced(self, tensors, opts):
            return self._gloo.allreduce_coalesced(tensors, opts)

        def allreduce_sparse(self, tensors, opts):
            return self._gloo.allreduce_sparse(tensors, opts)

        def reduce(self, tensors, opts):
            return self._gloo.reduce(tensors, opts)

        def allgather(self, outputs, inputs, opts):
            return self._gloo.allgather(outputs, inputs, opts)

        def all_gather_single(self, output, input, opts):  # noqa: A002
            return self._gloo._allgather_base(output, input, opts)

        _allgather_base = all_gather_single

        def all_gather_single_coalesced(self, outputs, inputs, opts):
            return self._gloo.all_gather_single_coalesced(outputs, inputs, opts)

        allgather_into_tensor_coalesced = all_gather_single_coalesced

        def allgather_coalesced(self, outputs, inputs, opts):
            return self._gloo.allgather_coalesced(outputs, inputs, opts)

        def gather(self, outputs, inputs, opts):
            return self._gloo.gather(outputs, inputs, opts)

        def scatter(self, outputs, inputs, opts):
            return self._gloo.scatter(outputs, inputs, opts)

        def reduce_scatter(self, outputs, inputs, opts):
            return self._gloo.reduce_scatter(outputs, inputs, opts)

        def alltoall(self, outputs, inputs, opts):
            return self._gloo.alltoall(outputs, inputs, opts)

        def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):  # noqa: A002
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

        alltoall_base = all_to_all_single

        def send(self, tensors, dst, tag):
            return self._gloo.send(tensors, dst, tag)

        def recv(self, tensors, src, tag):
            return self._gloo.recv(tensors, src, tag)

        def recv_anysource(self, tensors, tag):
            return self._gloo.recv_anysource(tensors, tag)

        def barrier(self, opts):
            return self._gloo.barrier(opts)

        def monitored_barrier(self, opts, wait_all_ranks=False):
            """gloo's monitored barrier (it names the ranks that did not come)."""
            self._gloo.monitored_barrier(opts.timeout, wait_all_ranks)

    def create_backend(dist_backend_opts, backend_options=None):
        """torch.distributed's constructor of a `cgx` group (extended API: the group's
        prefixed Store, its rank and size, its timeout)."""
        o = dist_backend_opts
        return CGXBackend(o.store, o.group_rank, o.group_size, o.timeout)

    def register():
        """Registers ``cgx`` with torch.distributed (once; installed cgx_torch does it at
        ``import torch``, ``import cgx_torch`` does it otherwise)."""
        if "CGX" in getattr(dist.Backend, "_plugins", {}) or "cgx" in getattr(dist.Backend, "backend_list", []):
            return
        dist.Backend.register_backend("cgx", create_backend, extended_api=True, devices=["cpu", "cuda"])

else:

    def create_backend(dist_backend_opts, backend_options=None):
        raise _core.CGXError(f"cgx_torch: the `cgx` backend needs torch >= 2.0 (this is {torch.__version__}); "
                             "use cgx_torch.cgx_hook with gloo")

    def register():
        """torch 1.13: no `cgx` backend (the hook and allreduce_ work over gloo or MPI)."""
