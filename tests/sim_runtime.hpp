// A simulated CUDA runtime for the device transports and schedules of cgx (issue 19):
// sim::runtime models the runtime policy of cgx/comm/runtime.cuh, so that
// comm::basic_cuda_ipc<sim::runtime>, comm::device_sra / device_ring over it and
// device_allreduce_plan run unchanged on a machine without a GPU. Ranks are threads of
// this process (sim::thread_bootstrap); "device memory" is host memory.
//
// What it models:
//  - Streams are queues. One executor thread runs the ops of every stream, choosing at
//    random (from the world's seed) among the streams whose first op may run; a wait on
//    an event may run once the record it waits for has run. Kernels (sim::kernels<Q>)
//    run the CUDA kernels' bodies on the host (quant/kernel_bodies.hpp, lanes visited in
//    a shuffled order). Host calls block as CUDA's do (event/stream synchronize).
//  - Events count their records: cudaStreamWaitEvent and cudaEventQuery refer to the
//    latest record at the time of the call, as in CUDA.
//  - A happens-before checker. Every host thread and every stream is an actor with a
//    vector clock; enqueueing, event record/wait/synchronize, stream synchronize and the
//    bootstrap's barrier and allgather carry clocks as CUDA's and the group's ordering
//    guarantees do. Every access of an op to simulated memory (kernels, copies) is
//    checked at enqueue time against the earlier accesses to the same bytes: two
//    accesses, one a write, not ordered by happens-before, are a *violation*, whatever
//    order the executor happens to pick. So are: freeing memory whose accesses are not
//    ordered before the free (cudaFree synchronizes only the freeing process's own
//    streams), freeing an exported allocation or destroying an exported event while a
//    peer has not closed its import (or closed it without an ordering to the free: the
//    teardown rule of CUDA IPC), using an event whose exporter destroyed it, touching
//    freed memory, ranges past an allocation's end, and work enqueued on a stream of
//    another device than the current one (a world may have several devices).
//  - Stream capture (CUDA graphs). begin_capture/end_capture/instantiate/graph_launch:
//    while a stream captures, what is enqueued on it (kernels, copies, external event
//    records and waits, NCCL operations) becomes a node that each launch of the graph
//    enqueues on the launch stream, checked then; a plain event record is capture-
//    internal. What CUDA forbids during a capture is a violation and invalidates it
//    (end_capture then fails): malloc/free/host_alloc/free_host of the capturing rank,
//    synchronizing the capturing stream, querying or synchronizing an event recorded
//    inside a capture, a plain wait on an event recorded outside it
//    (cudaErrorStreamCaptureIsolation), and work on the legacy stream while a stream of
//    the rank captures (cudaErrorStreamCaptureImplicit).
// Violations are collected (world::violations()), never thrown: a test checks that
// none happened and prints them when some did.
#pragma once

#include <cgx/comm/runtime.cuh>
#include <cgx/quant/kernel_bodies.hpp>
#include <cgx/quant/maxmin.hpp>
#include <cgx/quant/none.hpp>

#include <cuda_runtime_api.h>
#if __has_include(<nccl.h>)
#include <nccl.h>
#define CGX_SIM_NCCL 1  // the simulated NCCL (sim::nccl) exists
#else
#define CGX_SIM_NCCL 0
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

namespace sim {

/// A vector clock: entry a is the number of steps of actor a known to have happened.
using vclock = std::vector<std::uint64_t>;

inline void join(vclock& a, const vclock& b) {
  if (a.size() < b.size()) a.resize(b.size(), 0);
  for (std::size_t i = 0; i < b.size(); ++i) a[i] = std::max(a[i], b[i]);
}
inline bool knows(const vclock& c, int actor, std::uint64_t t) {
  return static_cast<std::size_t>(actor) < c.size() && c[static_cast<std::size_t>(actor)] >= t;
}

/// One access to simulated memory, as the checker remembers it.
struct access {
  std::size_t lo = 0, hi = 0;  // byte range [lo, hi) in the allocation
  bool write = false;
  int actor = 0;
  std::uint64_t time = 0;
  std::string what;
};

struct mapping {
  int actor = 0;  // the importing host thread
  int opened = 0;
  bool closed = false;
  std::uint64_t close_time = 0;
};

struct allocation {
  int id = 0;
  int owner = 0;  // host actor that allocated it
  bool device = true;
  bool freed = false;
  std::size_t bytes = 0;
  std::unique_ptr<std::byte[]> mem;
  std::byte* base = nullptr;
  std::vector<access> log;
  std::vector<mapping> mappings;
};

struct capture_obj;

struct event_obj {
  int id = 0;
  bool interprocess = false;
  bool destroyed = false;
  capture_obj* captured_in = nullptr;  // its last record was a capture-internal one (no record at launch)
  std::uint64_t records = 0;
  std::vector<char> completed{1};  // completed[k]: record k has run (record 0: none, always "run")
  vclock at_last_record;
  std::vector<mapping> imports;
};

/// What a cudaEvent_t points to: an owner's handle or a peer's imported one.
struct event_ref {
  event_obj* target = nullptr;
  int actor = 0;  // the host thread holding this handle
  bool imported = false;
  bool destroyed = false;
};

struct op {
  // task: fn runs outside the lock; record / wait: events; until: fn runs under the
  // world's lock once ready() (also evaluated under it) holds (simulated NCCL).
  enum kind { task, record, wait, until } k = task;
  std::function<void()> fn;
  std::function<bool()> ready;
  event_obj* ev = nullptr;
  std::uint64_t rec = 0;
};

#if CGX_SIM_NCCL
/// A simulated NCCL communicator (one per rank) and the group of a unique id.
struct nccl_group;
struct nccl_comm_obj {
  nccl_group* g = nullptr;
  int rank = 0;
  bool aborted = false, destroyed = false;
  ncclResult_t async = ncclSuccess;
  std::uint64_t allreduces = 0;
  std::string last_error;
};
struct nccl_group {
  int nranks = 0;
  int joined = 0;
  int finalized = 0;
  std::vector<nccl_comm_obj*> comms;
  std::map<std::tuple<int, int, std::uint64_t>, std::vector<std::byte>> box;  // (src, dst, seq)
  std::map<std::pair<int, int>, std::uint64_t> sent, received;               // per (src, dst)
  std::map<std::uint64_t, std::vector<std::vector<std::byte>>> deposits;       // all-reduce seq -> per rank
};
#endif  // CGX_SIM_NCCL

struct stream_obj {
  int actor = 0;
  int rank = 0;    // the rank (host thread's) that created it
  int device = 0;  // the device current at its creation
  bool legacy = false;            // the rank's legacy default stream (cudaStream_t 0)
  capture_obj* cap = nullptr;     // the capture it is in, if any
  vclock clock;
  std::deque<op> q;
  std::uint64_t enqueued = 0, done = 0;
};

/// A node of a captured graph: enqueues its op on the stream the graph is launched on,
/// as the launching host actor, with the world's lock held (the checks run then, with
/// the launch's clocks, as CUDA orders a graph's nodes after the work before the launch).
/// The world's lock as a graph node holds it (a node that waits releases it meanwhile).
using host_lock = std::unique_lock<std::mutex>;
using graph_node = std::function<void(stream_obj&, int, host_lock&)>;

/// One stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture) and the graphs
/// made of it. Linear: the plans capture on one stream.
struct capture_obj {
  stream_obj* origin = nullptr;
  int rank = 0;
  bool invalidated = false;
  std::vector<graph_node> nodes;
};
struct graph_obj {
  std::vector<graph_node> nodes;
};

/// A range an op reads or writes.
struct range {
  const void* p;
  std::size_t bytes;
  bool write;
};

/// The simulated device and the checker. One per test; `scope` makes it current.
class world {
 public:
  explicit world(std::uint64_t seed, int devices = 1) : gen_(seed), devices_(devices) {
    exec_ = std::thread([this] { run(); });
  }
  world(const world&) = delete;
  world& operator=(const world&) = delete;
  ~world() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    exec_.join();
  }

  static world*& current() {
    static world* w = nullptr;
    return w;
  }

  /// Makes this thread the host thread of `rank` (each rank thread calls it first).
  void attach(int rank) {
    std::lock_guard<std::mutex> l(m_);
    host_of_this_thread(rank);
  }

  /// A new stream owned by the calling thread's rank.
  cudaStream_t create_stream() {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    auto s = std::make_unique<stream_obj>();
    s->actor = new_actor("stream of rank " + std::to_string(rank_of_[static_cast<std::size_t>(h)]));
    s->rank = rank_of_[static_cast<std::size_t>(h)];
    s->device = device_of_thread();
    s->clock = clock_[static_cast<std::size_t>(h)];
    stream_obj* raw = s.get();
    streams_.push_back(std::move(s));
    return reinterpret_cast<cudaStream_t>(raw);
  }

  /// Every violation seen so far.
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> l(m_);
    return violations_;
  }
  /// Ops executed so far (a test can check that the executor ran at all).
  std::uint64_t executed() const {
    std::lock_guard<std::mutex> l(m_);
    return executed_;
  }

  /// Joins the clocks of `ranks` host threads at a rendezvous (a barrier or allgather
  /// of the group): each leaves knowing everything any of them had done.
  void rendezvous_enter(vclock& acc) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    tick(h);
    join(acc, clock_[static_cast<std::size_t>(h)]);
  }
  void rendezvous_leave(const vclock& acc) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    join(clock_[static_cast<std::size_t>(h)], acc);
    tick(h);
  }

  // ---- the runtime calls (sim::runtime forwards here) ----

  cudaError_t malloc(void** p, std::size_t bytes, bool device) {
    if (bytes > (std::size_t{1} << 32)) return cudaErrorMemoryAllocation;
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    if (illegal_in_capture(h, device ? "cudaMalloc" : "cudaHostAlloc")) return cudaErrorStreamCaptureUnsupported;
    tick(h);
    auto a = std::make_unique<allocation>();
    a->id = static_cast<int>(allocs_.size()) + 1;
    a->owner = h;
    a->device = device;
    a->bytes = bytes == 0 ? 1 : bytes;
    a->mem.reset(new std::byte[a->bytes + 256]);
    const auto addr = reinterpret_cast<std::uintptr_t>(a->mem.get());
    a->base = a->mem.get() + ((256 - addr % 256) % 256);
    std::memset(a->base, 0xA5, a->bytes);  // uninitialized memory is not zero
    *p = a->base;
    by_addr_[reinterpret_cast<std::uintptr_t>(a->base)] = a.get();
    allocs_.push_back(std::move(a));
    return cudaSuccess;
  }

  cudaError_t free(void* p, bool device) {
    if (p == nullptr) return cudaSuccess;
    std::unique_lock<std::mutex> l(m_);
    const int h = host_of_this_thread();
    if (illegal_in_capture(h, device ? "cudaFree" : "cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
    auto it = by_addr_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == by_addr_.end() || it->second->freed || it->second->device != device) {
      report(h, "frees a pointer that is not a live allocation of this kind");
      return cudaErrorInvalidValue;
    }
    allocation& a = *it->second;
    // cudaFree / cudaFreeHost synchronize the freeing process's device work.
    const int rank = rank_of_[static_cast<std::size_t>(h)];
    cv_.wait(l, [&] {
      for (auto& s : streams_)
        if (s->rank == rank && s->done != s->enqueued) return false;
      return true;
    });
    for (auto& s : streams_)
      if (s->rank == rank) join(clock_[static_cast<std::size_t>(h)], s->clock);
    tick(h);
    const vclock& now = clock_[static_cast<std::size_t>(h)];
    for (const mapping& m : a.mappings) {
      if (!m.closed)
        report(h, "frees allocation #" + std::to_string(a.id) + " while " + who(m.actor) +
                      " still has it mapped (cudaIpcCloseMemHandle not called before the free)");
      else if (!knows(now, m.actor, m.close_time))
        report(h, "frees allocation #" + std::to_string(a.id) + " with no ordering after " + who(m.actor) +
                      "'s cudaIpcCloseMemHandle of it");
    }
    for (const access& x : a.log)
      if (!knows(now, x.actor, x.time))
        report(h, "frees allocation #" + std::to_string(a.id) + " while " + x.what + " by " + who(x.actor) +
                      " may still run (not ordered before the free)");
    a.freed = true;
    a.log.clear();
    return cudaSuccess;
  }

  cudaError_t pointer_attributes(cudaPointerAttributes* out, const void* p) {
    std::lock_guard<std::mutex> l(m_);
    *out = cudaPointerAttributes{};
    allocation* a = find(p);
    if (a == nullptr || a->freed) {
      out->type = cudaMemoryTypeUnregistered;
    } else {
      out->type = a->device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
      out->devicePointer = const_cast<void*>(p);
    }
    return cudaSuccess;
  }

  cudaError_t event_create(cudaEvent_t* e, unsigned flags) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    tick(h);
    auto ev = std::make_unique<event_obj>();
    ev->id = static_cast<int>(events_.size()) + 1;
    ev->interprocess = (flags & cudaEventInterprocess) != 0;
    auto ref = std::make_unique<event_ref>();
    ref->target = ev.get();
    ref->actor = h;
    *e = reinterpret_cast<cudaEvent_t>(ref.get());
    events_.push_back(std::move(ev));
    refs_.push_back(std::move(ref));
    return cudaSuccess;
  }

  cudaError_t event_destroy(cudaEvent_t e) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    tick(h);
    event_ref* r = ref_of(e, h, "cudaEventDestroy");
    if (r == nullptr) return cudaErrorInvalidResourceHandle;
    r->destroyed = true;
    event_obj& ev = *r->target;
    if (r->imported) {  // closing an import
      for (mapping& m : ev.imports)
        if (m.actor == h && !m.closed) {
          m.closed = true;
          m.close_time = clock_[static_cast<std::size_t>(h)][static_cast<std::size_t>(h)];
        }
      return cudaSuccess;
    }
    const vclock& now = clock_[static_cast<std::size_t>(h)];
    for (const mapping& m : ev.imports) {
      if (!m.closed)
        report(h, "destroys exported event #" + std::to_string(ev.id) + " while " + who(m.actor) +
                      " still holds its import (not destroyed before)");
      else if (!knows(now, m.actor, m.close_time))
        report(h, "destroys exported event #" + std::to_string(ev.id) + " with no ordering after " + who(m.actor) +
                      " closed its import");
    }
    ev.destroyed = true;
    return cudaSuccess;
  }

  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) { return event_record_with_flags(e, s, 0); }

  /// cudaEventRecordWithFlags: while s captures, cudaEventRecordExternal makes a record
  /// node; a plain record is capture-internal (it records nothing when the graph runs).
  cudaError_t event_record_with_flags(cudaEvent_t e, cudaStream_t s, unsigned flags) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    event_ref* r = ref_of(e, h, "cudaEventRecord");
    if (r == nullptr) return cudaErrorInvalidResourceHandle;
    stream_obj& st = stream_of(s, h);
    event_obj* ev = r->target;
    switch (route_of(st, h, "cudaEventRecord")) {
      case route::refused: return refused_error(st);
      case route::capture:
        if ((flags & cudaEventRecordExternal) != 0)
          st.cap->nodes.push_back([this, ev](stream_obj& t, int hh, host_lock&) { record_on(t, hh, *ev); });
        else
          ev->captured_in = st.cap;
        return cudaSuccess;
      case route::now: break;
    }
    record_on(st, h, *ev);
    return cudaSuccess;
  }

  cudaError_t event_query(cudaEvent_t e) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    event_ref* r = ref_of(e, h, "cudaEventQuery");
    if (r == nullptr) return cudaErrorInvalidResourceHandle;
    event_obj& ev = *r->target;
    if (ev.captured_in != nullptr) return captured_event(ev, h, "cudaEventQuery");
    if (!ev.completed[ev.records]) return cudaErrorNotReady;
    join(clock_[static_cast<std::size_t>(h)], ev.at_last_record);
    tick(h);
    return cudaSuccess;
  }

  cudaError_t event_synchronize(cudaEvent_t e) {
    std::unique_lock<std::mutex> l(m_);
    const int h = host_of_this_thread();
    event_ref* r = ref_of(e, h, "cudaEventSynchronize");
    if (r == nullptr) return cudaErrorInvalidResourceHandle;
    event_obj& ev = *r->target;
    if (ev.captured_in != nullptr) return captured_event(ev, h, "cudaEventSynchronize");
    const std::uint64_t k = ev.records;
    const vclock c = ev.at_last_record;
    cv_.wait(l, [&] { return ev.completed[k] != 0; });
    join(clock_[static_cast<std::size_t>(h)], c);
    tick(h);
    return cudaSuccess;
  }

  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) { return stream_wait_event_with_flags(s, e, 0); }

  /// cudaStreamWaitEvent with flags: while s captures, cudaEventWaitExternal makes a wait
  /// node (on the record that is the latest when the graph runs); a plain wait may only
  /// name an event recorded inside this capture (or never recorded).
  cudaError_t stream_wait_event_with_flags(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    event_ref* r = ref_of(e, h, "cudaStreamWaitEvent");
    if (r == nullptr) return cudaErrorInvalidResourceHandle;
    stream_obj& st = stream_of(s, h);
    event_obj* ev = r->target;
    switch (route_of(st, h, "cudaStreamWaitEvent")) {
      case route::refused: return refused_error(st);
      case route::capture:
        if ((flags & cudaEventWaitExternal) != 0) {
          st.cap->nodes.push_back([this, ev](stream_obj& t, int hh, host_lock&) { wait_on(t, hh, *ev); });
          return cudaSuccess;
        }
        if (ev->captured_in == st.cap || ev->records == 0) return cudaSuccess;  // in-capture order, or nothing
        invalidate(*st.cap, h,
                   "cudaStreamWaitEvent (without cudaEventWaitExternal) on an event recorded outside the capture "
                   "(cudaErrorStreamCaptureIsolation)");
        return cudaErrorStreamCaptureIsolation;
      case route::now: break;
    }
    if (ev->captured_in != nullptr) {
      report(h, "cudaStreamWaitEvent outside a capture on an event recorded inside one");
      return cudaErrorStreamCaptureIsolation;
    }
    wait_on(st, h, *ev);
    return cudaSuccess;
  }

  cudaError_t stream_synchronize(cudaStream_t s) {
    std::unique_lock<std::mutex> l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    if (st.cap != nullptr || (st.legacy && active_.count(st.rank) != 0)) {
      invalidate(st.cap != nullptr ? *st.cap : *active_[st.rank], h, "cudaStreamSynchronize of a capturing stream");
      return cudaErrorStreamCaptureUnsupported;
    }
    const std::uint64_t target = st.enqueued;
    cv_.wait(l, [&] { return st.done >= target; });
    join(clock_[static_cast<std::size_t>(h)], st.clock);
    tick(h);
    return cudaSuccess;
  }

  /// Enqueues `fn` on stream s; `ranges` are the bytes it reads and writes, checked now
  /// (while s captures: at each launch of the graph).
  /// The result: what CUDA returns for the launch (an error when the stream refuses work
  /// during a capture).
  cudaError_t launch(cudaStream_t s, std::span<const range> ranges, const std::string& what, std::function<void()> fn) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    switch (route_of(st, h, what)) {
      case route::refused: return refused_error(st);
      case route::capture: {
        std::vector<range> rs(ranges.begin(), ranges.end());
        st.cap->nodes.push_back([this, rs, what, fn](stream_obj& t, int hh, host_lock&) { launch_on(t, hh, rs, what, fn); });
        return cudaSuccess;
      }
      case route::now: break;
    }
    launch_on(st, h, ranges, what, std::move(fn));
    return cudaSuccess;
  }

  // ---- comm::cuda_ipc's device synchronization (runtime policy: ipc_post, ipc_wait) ----
  //
  // A synchronization block's words (epoch, ready, done) are simulated device memory
  // written by the post op and read by the wait op when they run (under the world's
  // lock; not access-checked: flags are meant to race). The order the wait gives is
  // modelled at enqueue time, as every other edge of the checker is: a wait for epoch e
  // blocks the enqueuing host thread until each peer has enqueued its post of e, and
  // joins that post's clock (the first post that lets the device wait pass). On a GPU
  // nothing blocks the host; the edges are the same.

  cudaError_t ipc_post(std::uint32_t* sync, unsigned slot, cudaStream_t s) {
    host_lock l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    switch (route_of(st, h, "ipc_post")) {
      case route::refused: return refused_error(st);
      case route::capture:
        st.cap->nodes.push_back([this, sync, slot](stream_obj& t, int hh, host_lock&) { ipc_post_on(t, hh, sync, slot); });
        return cudaSuccess;
      case route::now: break;
    }
    ipc_post_on(st, h, sync, slot);
    return cudaSuccess;
  }

  cudaError_t ipc_wait(const std::uint32_t* const* peers, int p, std::uint32_t* mine, unsigned slot,
                       std::uint64_t limit_ns, void* fault, cudaStream_t s) {
    host_lock l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    switch (route_of(st, h, "ipc_wait")) {
      case route::refused: return refused_error(st);
      case route::capture:
        st.cap->nodes.push_back([=, this](stream_obj& t, int hh, host_lock& lk) {
          ipc_wait_on(t, hh, lk, peers, p, mine, slot, limit_ns, fault);
        });
        return cudaSuccess;
      case route::now: break;
    }
    ipc_wait_on(st, h, l, peers, p, mine, slot, limit_ns, fault);
    return cudaSuccess;
  }

  /// Posts of synchronization blocks enqueued so far (a test can see that none is left).
  std::uint64_t ipc_posts() const {
    std::lock_guard<std::mutex> l(m_);
    return ipc_posts_;
  }

  // ---- stream capture (CUDA graphs) ----

  cudaError_t stream_is_capturing(cudaStream_t s, cudaStreamCaptureStatus* out) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    *out = cudaStreamCaptureStatusNone;
    if (st.cap != nullptr)
      *out = st.cap->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    else if (st.legacy && active_.count(st.rank) != 0)
      return cudaErrorStreamCaptureImplicit;
    return cudaSuccess;
  }
  /// cudaStreamBeginCapture (one capture per rank at a time; not the legacy stream).
  cudaError_t begin_capture(cudaStream_t s) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    if (st.legacy) return cudaErrorStreamCaptureUnsupported;
    if (st.cap != nullptr || active_.count(st.rank) != 0) return cudaErrorIllegalState;
    auto c = std::make_unique<capture_obj>();
    c->origin = &st;
    c->rank = st.rank;
    st.cap = c.get();
    active_[st.rank] = c.get();
    captures_.push_back(std::move(c));
    return cudaSuccess;
  }
  /// cudaStreamEndCapture: the graph, or cudaErrorStreamCaptureInvalidated (no graph)
  /// when something illegal happened during the capture.
  cudaError_t end_capture(cudaStream_t s, cudaGraph_t* g) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    *g = nullptr;
    if (st.cap == nullptr || st.cap->origin != &st) return cudaErrorIllegalState;
    capture_obj* c = st.cap;
    st.cap = nullptr;
    active_.erase(c->rank);
    if (c->invalidated) return cudaErrorStreamCaptureInvalidated;
    auto graph = std::make_unique<graph_obj>();
    graph->nodes = c->nodes;
    *g = reinterpret_cast<cudaGraph_t>(graph.get());
    graphs_.push_back(std::move(graph));
    return cudaSuccess;
  }
  /// cudaGraphInstantiate: an executable copy of the graph.
  cudaError_t instantiate(cudaGraphExec_t* x, cudaGraph_t g) {
    std::lock_guard<std::mutex> l(m_);
    if (g == nullptr) return cudaErrorInvalidValue;
    auto e = std::make_unique<graph_obj>(*reinterpret_cast<graph_obj*>(g));
    *x = reinterpret_cast<cudaGraphExec_t>(e.get());
    graphs_.push_back(std::move(e));
    return cudaSuccess;
  }
  /// cudaGraphLaunch: every node enqueued on s, in capture order, now.
  cudaError_t graph_launch(cudaGraphExec_t x, cudaStream_t s) {
    std::unique_lock<std::mutex> l(m_);
    const int h = host_of_this_thread();
    stream_obj& st = stream_of(s, h);
    if (x == nullptr) return cudaErrorInvalidValue;
    switch (route_of(st, h, "cudaGraphLaunch")) {
      case route::refused: return refused_error(st);
      case route::capture: return cudaErrorNotSupported;  // (nested graphs: not modelled)
      case route::now: break;
    }
    for (const graph_node& n : reinterpret_cast<graph_obj*>(x)->nodes) n(st, h, l);
    return cudaSuccess;
  }
  /// Nodes of a graph or an executable graph (a test can see what a capture holds).
  std::size_t graph_nodes(const void* g) const {
    std::lock_guard<std::mutex> l(m_);
    return static_cast<const graph_obj*>(g)->nodes.size();
  }

  /// An access of the calling host thread to simulated memory (a host transport reading
  /// or writing device or pinned memory), checked like a stream op's.
  void host_access(const void* p, std::size_t bytes, bool write, const std::string& what) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    tick(h);
    check(h, clock_[static_cast<std::size_t>(h)], range{p, bytes, write}, what);
  }

  cudaError_t ipc_get_mem_handle(cudaIpcMemHandle_t* hd, void* p) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    auto it = by_addr_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == by_addr_.end() || it->second->freed || !it->second->device) {
      report(h, "cudaIpcGetMemHandle of a pointer that is not a live device allocation");
      return cudaErrorInvalidValue;
    }
    *hd = cudaIpcMemHandle_t{};
    std::memcpy(hd->reserved, &it->second->id, sizeof(int));
    return cudaSuccess;
  }

  cudaError_t ipc_open_mem_handle(void** p, cudaIpcMemHandle_t hd) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    tick(h);
    int id = 0;
    std::memcpy(&id, hd.reserved, sizeof(int));
    if (id < 1 || static_cast<std::size_t>(id) > allocs_.size()) return cudaErrorInvalidValue;
    allocation& a = *allocs_[static_cast<std::size_t>(id) - 1];
    if (a.freed) {
      report(h, "opens the IPC handle of allocation #" + std::to_string(id) + ", freed by its owner");
      return cudaErrorInvalidValue;
    }
    if (rank_of_[static_cast<std::size_t>(a.owner)] == rank_of_[static_cast<std::size_t>(h)])
      return cudaErrorInvalidValue;  // CUDA refuses to import into the exporting process
    for (mapping& m : a.mappings)
      if (m.actor == h && !m.closed) {
        ++m.opened;
        *p = a.base;
        return cudaSuccess;
      }
    a.mappings.push_back(mapping{h, 1, false, 0});
    *p = a.base;
    return cudaSuccess;
  }

  cudaError_t ipc_close_mem_handle(void* p) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    tick(h);
    allocation* a = find(p);
    if (a == nullptr) {
      report(h, "cudaIpcCloseMemHandle of an unknown pointer");
      return cudaErrorInvalidValue;
    }
    // The importer's own device work must be done with the memory before it unmaps it.
    const vclock& now = clock_[static_cast<std::size_t>(h)];
    const int rank = rank_of_[static_cast<std::size_t>(h)];
    for (const access& x : a->log)
      if (rank_of_[static_cast<std::size_t>(x.actor)] == rank && !knows(now, x.actor, x.time))
        report(h, "closes its mapping of allocation #" + std::to_string(a->id) + " while its own " + x.what +
                      " may still run");
    for (mapping& m : a->mappings)
      if (m.actor == h && !m.closed) {
        if (--m.opened == 0) {
          m.closed = true;
          m.close_time = now[static_cast<std::size_t>(h)];
        }
        return cudaSuccess;
      }
    report(h, "cudaIpcCloseMemHandle of a mapping it does not hold");
    return cudaErrorInvalidValue;
  }

  cudaError_t ipc_get_event_handle(cudaIpcEventHandle_t* hd, cudaEvent_t e) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    event_ref* r = ref_of(e, h, "cudaIpcGetEventHandle");
    if (r == nullptr || !r->target->interprocess) return cudaErrorInvalidResourceHandle;
    *hd = cudaIpcEventHandle_t{};
    std::memcpy(hd->reserved, &r->target->id, sizeof(int));
    return cudaSuccess;
  }

  cudaError_t ipc_open_event_handle(cudaEvent_t* e, cudaIpcEventHandle_t hd) {
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    tick(h);
    int id = 0;
    std::memcpy(&id, hd.reserved, sizeof(int));
    if (id < 1 || static_cast<std::size_t>(id) > events_.size()) return cudaErrorInvalidResourceHandle;
    event_obj& ev = *events_[static_cast<std::size_t>(id) - 1];
    if (ev.destroyed) {
      report(h, "opens the IPC handle of event #" + std::to_string(id) + ", destroyed by its owner");
      return cudaErrorInvalidResourceHandle;
    }
    auto ref = std::make_unique<event_ref>();
    ref->target = &ev;
    ref->actor = h;
    ref->imported = true;
    ev.imports.push_back(mapping{h, 1, false, 0});
    *e = reinterpret_cast<cudaEvent_t>(ref.get());
    refs_.push_back(std::move(ref));
    return cudaSuccess;
  }

#if CGX_SIM_NCCL
  // ---- simulated NCCL (sim::nccl forwards here) ----

  ncclResult_t nccl_get_unique_id(ncclUniqueId* id) {
    std::lock_guard<std::mutex> l(m_);
    *id = ncclUniqueId{};
    const std::uint64_t k = ++nccl_ids_;
    std::memcpy(id->internal, &k, sizeof k);
    return ncclSuccess;
  }

  /// Collective over the ranks of `id`: returns once all `n` joined.
  ncclResult_t nccl_comm_init_rank(ncclComm_t* c, int n, ncclUniqueId id, int rank) {
    std::unique_lock<std::mutex> l(m_);
    std::uint64_t k = 0;
    std::memcpy(&k, id.internal, sizeof k);
    auto& g = nccl_groups_[k];
    if (!g) {
      g = std::make_unique<nccl_group>();
      g->nranks = n;
      g->comms.assign(static_cast<std::size_t>(n), nullptr);
    }
    if (rank < 0 || rank >= n || g->nranks != n || g->comms[static_cast<std::size_t>(rank)] != nullptr)
      return ncclInvalidArgument;
    auto obj = std::make_unique<nccl_comm_obj>();
    obj->g = g.get();
    obj->rank = rank;
    g->comms[static_cast<std::size_t>(rank)] = obj.get();
    *c = reinterpret_cast<ncclComm_t>(obj.get());
    nccl_comms_.push_back(std::move(obj));
    ++g->joined;
    cv_.notify_all();
    nccl_group* gp = g.get();
    cv_.wait(l, [&] { return gp->joined == gp->nranks; });
    return ncclSuccess;
  }

  ncclResult_t nccl_group_start() {
    ++pending().depth;
    return ncclSuccess;
  }

  ncclResult_t nccl_group_end() {
    auto& pg = pending();
    if (pg.depth == 0) return ncclInvalidUsage;
    if (--pg.depth > 0) return ncclSuccess;
    std::vector<p2p> ops = std::move(pg.ops);
    pg.ops.clear();
    if (pg.failed) {  // NCCL drops a group in which a call failed
      pg.failed = false;
      return ncclInvalidUsage;
    }
    std::lock_guard<std::mutex> l(m_);
    return issue(ops) ? ncclSuccess : ncclInvalidUsage;
  }

  ncclResult_t nccl_p2p(bool send, void* p, std::size_t bytes, int peer, ncclComm_t c, cudaStream_t s) {
    auto* obj = reinterpret_cast<nccl_comm_obj*>(c);
    auto& pg = pending();
    {
      std::lock_guard<std::mutex> l(m_);
      const int h = host_of_this_thread();
      if (obj == nullptr || obj->destroyed || obj->aborted) {
        report(h, "calls NCCL on a destroyed or aborted communicator");
        return ncclInvalidArgument;
      }
      if (fail_next_[obj->rank]) {
        fail_next_[obj->rank] = false;
        obj->last_error = "simulated failure of an NCCL call";
        if (pg.depth > 0) pg.failed = true;
        return ncclInternalError;
      }
    }
    const p2p op{send, p, bytes, peer, obj, s};
    if (pg.depth == 0) {  // a call outside a group is a group of its own
      std::lock_guard<std::mutex> l(m_);
      return issue(std::vector<p2p>{op}) ? ncclSuccess : ncclInvalidUsage;
    }
    pg.ops.push_back(op);
    return ncclSuccess;
  }

  /// float or double sums only (what the tests use); in rank order, like a reduction
  /// that every rank computes the same.
  ncclResult_t nccl_all_reduce(const void* in, void* out, std::size_t n, ncclDataType_t t, ncclComm_t c,
                               cudaStream_t s) {
    if (t != ncclFloat32 && t != ncclFloat64) return ncclInvalidArgument;
    std::lock_guard<std::mutex> l(m_);
    const int h = host_of_this_thread();
    auto* obj = reinterpret_cast<nccl_comm_obj*>(c);
    stream_obj& st = stream_of(s, h);
    switch (route_of(st, h, "ncclAllReduce")) {
      case route::refused: return ncclInvalidUsage;
      case route::capture:
        st.cap->nodes.push_back([=, this](stream_obj& to, int hh, host_lock&) { all_reduce_on(to, hh, in, out, n, t, obj); });
        return ncclSuccess;
      case route::now: break;
    }
    all_reduce_on(st, h, in, out, n, t, obj);
    return ncclSuccess;
  }

  // The op of an all-reduce (lock held); its sequence number is taken when it is enqueued.
  void all_reduce_on(stream_obj& st, int h, const void* in, void* out, std::size_t n, ncclDataType_t t,
                     nccl_comm_obj* obj) {
    const std::size_t bytes = n * (t == ncclFloat32 ? 4 : 8);
    enqueue_clock(st, h);
    check(st.actor, st.clock, range{in, bytes, false}, "ncclAllReduce");
    check(st.actor, st.clock, range{out, bytes, true}, "ncclAllReduce");
    const std::uint64_t seq = obj->allreduces++;
    nccl_group* g = obj->g;
    op o;
    o.k = op::until;
    o.ready = [] { return true; };
    o.fn = [=] {
      auto& d = g->deposits[seq];
      d.resize(static_cast<std::size_t>(g->nranks));
      d[static_cast<std::size_t>(obj->rank)].assign(static_cast<const std::byte*>(in),
                                                    static_cast<const std::byte*>(in) + bytes);
    };
    push(st, std::move(o));
    op sum;
    sum.k = op::until;
    sum.ready = [=] {
      if (obj->aborted) return true;
      auto it = g->deposits.find(seq);
      if (it == g->deposits.end()) return false;
      for (const auto& x : it->second)
        if (x.size() != bytes) return false;
      return true;
    };
    sum.fn = [=] {
      if (obj->aborted) return;
      const auto& d = g->deposits[seq];
      for (std::size_t i = 0; i < n; ++i) {
        if (t == ncclFloat32) {
          float acc = 0;
          for (const auto& x : d) {
            float v;
            std::memcpy(&v, x.data() + i * 4, 4);
            acc += v;
          }
          std::memcpy(static_cast<std::byte*>(out) + i * 4, &acc, 4);
        } else {
          double acc = 0;
          for (const auto& x : d) {
            double v;
            std::memcpy(&v, x.data() + i * 8, 8);
            acc += v;
          }
          std::memcpy(static_cast<std::byte*>(out) + i * 8, &acc, 8);
        }
      }
    };
    push(st, std::move(sum));
  }

  ncclResult_t nccl_get_async_error(ncclComm_t c, ncclResult_t* r) {
    std::lock_guard<std::mutex> l(m_);
    *r = reinterpret_cast<nccl_comm_obj*>(c)->async;
    return ncclSuccess;
  }

  /// Local: stops the communicator's pending operations on every stream.
  ncclResult_t nccl_abort(ncclComm_t c) {
    std::lock_guard<std::mutex> l(m_);
    auto* obj = reinterpret_cast<nccl_comm_obj*>(c);
    obj->aborted = true;
    obj->destroyed = true;
    ++nccl_aborts_;
    // The peers lose their connections to this rank: an asynchronous remote error.
    for (auto* peer : obj->g->comms)
      if (peer != nullptr && !peer->aborted && peer->async == ncclSuccess) peer->async = ncclRemoteError;
    cv_.notify_all();
    return ncclSuccess;
  }

  /// Collective: waits for every rank's finalize. A rank that waits longer than the
  /// world's finalize limit is a violation (a real NCCL would wait forever).
  ncclResult_t nccl_finalize(ncclComm_t c) {
    std::unique_lock<std::mutex> l(m_);
    const int h = host_of_this_thread();
    auto* obj = reinterpret_cast<nccl_comm_obj*>(c);
    nccl_group* g = obj->g;
    ++g->finalized;
    cv_.notify_all();
    if (!cv_.wait_for(l, finalize_limit_, [&] { return g->finalized == g->nranks; })) {
      report(h, "ncclCommFinalize waits for peers that never finalize (NCCL would hang here)");
      return ncclSystemError;
    }
    return ncclSuccess;
  }

  ncclResult_t nccl_destroy(ncclComm_t c) {
    std::lock_guard<std::mutex> l(m_);
    reinterpret_cast<nccl_comm_obj*>(c)->destroyed = true;
    return ncclSuccess;
  }

  const char* nccl_last_error(ncclComm_t c) {
    std::lock_guard<std::mutex> l(m_);
    auto* obj = reinterpret_cast<nccl_comm_obj*>(c);
    return obj == nullptr ? "" : obj->last_error.c_str();
  }

  /// Test hooks: the next NCCL send/recv call of `rank` fails; `rank`'s communicator
  /// reports `r` as an asynchronous error from now on.
  void nccl_fail_next_call(int rank) {
    std::lock_guard<std::mutex> l(m_);
    fail_next_[rank] = true;
  }
  void nccl_set_async_error(int rank, ncclResult_t r) {
    std::lock_guard<std::mutex> l(m_);
    for (auto& c : nccl_comms_)
      if (c->rank == rank) c->async = r;
  }
  /// ncclCommAbort calls so far; the group depth of the calling thread.
  int nccl_aborts() const {
    std::lock_guard<std::mutex> l(m_);
    return nccl_aborts_;
  }
  static int nccl_group_depth() { return pending().depth; }
  /// How long a finalize may wait for its peers before it is reported.
  void set_finalize_limit(std::chrono::milliseconds d) { finalize_limit_ = d; }

#endif  // CGX_SIM_NCCL

  cudaError_t get_device(int* d) {
    *d = device_of_thread();
    return cudaSuccess;
  }
  cudaError_t set_device(int d) {
    if (d < 0 || d >= devices_) return cudaErrorInvalidDevice;
    device_of_thread() = d;
    return cudaSuccess;
  }

 private:
#if CGX_SIM_NCCL
  struct p2p {
    bool send;
    void* p;
    std::size_t bytes;
    int peer;
    nccl_comm_obj* c;
    cudaStream_t s;
  };
  struct pending_group {
    int depth = 0;
    bool failed = false;
    std::vector<p2p> ops;
  };
  static pending_group& pending() {
    thread_local pending_group g;
    return g;
  }
  // Issues one group's sends and receives (lock held): per stream, one op that deposits
  // the sends, then one that waits for every receive's message and copies it in, so that
  // a group's receives never block its own sends (as in one NCCL kernel).
  // While a stream captures, its part becomes a node (sequence numbers are taken at each
  // launch). False when a stream refuses work (an illegal use during a capture).
  bool issue(const std::vector<p2p>& ops) {
    const int h = host_of_this_thread();
    std::map<cudaStream_t, std::vector<p2p>> by_stream;
    for (const auto& o : ops) by_stream[o.s].push_back(o);
    bool ok = true;
    for (auto& [s, list] : by_stream) {
      stream_obj& st = stream_of(s, h);
      switch (route_of(st, h, "an NCCL group")) {
        case route::refused: ok = false; continue;
        case route::capture:
          st.cap->nodes.push_back([this, l = list](stream_obj& t, int hh, host_lock&) { issue_on(t, hh, l); });
          continue;
        case route::now: break;
      }
      issue_on(st, h, list);
    }
    return ok;
  }
  // One stream's part of a group (lock held).
  void issue_on(stream_obj& st, int h, const std::vector<p2p>& list) {
    {
      enqueue_clock(st, h);
      struct msg {
        p2p o;
        std::uint64_t seq;
      };
      std::vector<msg> sends, recvs;
      for (const auto& o : list) {
        check(st.actor, st.clock, range{o.p, o.bytes, !o.send}, o.send ? "ncclSend" : "ncclRecv");
        const int me = o.c->rank;
        if (o.send)
          sends.push_back({o, o.c->g->sent[{me, o.peer}]++});
        else
          recvs.push_back({o, o.c->g->received[{o.peer, me}]++});
      }
      op dep;
      dep.k = op::until;
      dep.ready = [] { return true; };
      dep.fn = [sends] {
        for (const auto& m : sends) {
          if (m.o.c->aborted) continue;
          const auto* b = static_cast<const std::byte*>(m.o.p);
          m.o.c->g->box[{m.o.c->rank, m.o.peer, m.seq}].assign(b, b + m.o.bytes);
        }
      };
      push(st, std::move(dep));
      op take;
      take.k = op::until;
      take.ready = [recvs] {
        for (const auto& m : recvs)
          if (!m.o.c->aborted && m.o.c->g->box.count({m.o.peer, m.o.c->rank, m.seq}) == 0) return false;
        return true;
      };
      take.fn = [this, recvs] {
        for (const auto& m : recvs) {
          if (m.o.c->aborted) continue;
          auto it = m.o.c->g->box.find({m.o.peer, m.o.c->rank, m.seq});
          if (it->second.size() != m.o.bytes) {
            violations_.push_back("ncclRecv of " + std::to_string(m.o.bytes) + " bytes matched a send of " +
                                  std::to_string(it->second.size()));
          } else {
            std::memcpy(m.o.p, it->second.data(), m.o.bytes);
          }
          m.o.c->g->box.erase(it);
        }
      };
      push(st, std::move(take));
    }
  }

#endif  // CGX_SIM_NCCL

  static int& device_of_thread() {
    thread_local int d = 0;
    return d;
  }
  struct thread_identity {
    std::uint64_t world = 0;  // world::serial_ of the world the actor belongs to
    int actor = -1;
  };
  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> n{0};
    return ++n;
  }
  static thread_identity& identity() {
    thread_local thread_identity t;
    return t;
  }

  int new_actor(std::string name) {
    const int a = static_cast<int>(names_.size());
    names_.push_back(std::move(name));
    clock_.emplace_back(static_cast<std::size_t>(a) + 1, 0);
    rank_of_.push_back(-1);
    return a;
  }
  // The calling thread's host actor (registered on first use, as rank `rank` or -1).
  int host_of_this_thread(int rank = -1) {
    thread_identity& t = identity();
    if (t.world != serial_ || t.actor < 0) {
      t.world = serial_;
      t.actor = new_actor("rank " + std::to_string(rank) + " (host)");
      rank_of_[static_cast<std::size_t>(t.actor)] = rank;
    } else if (rank >= 0) {
      rank_of_[static_cast<std::size_t>(t.actor)] = rank;
      names_[static_cast<std::size_t>(t.actor)] = "rank " + std::to_string(rank) + " (host)";
    }
    return t.actor;
  }
  void tick(int actor) {
    vclock& c = clock_[static_cast<std::size_t>(actor)];
    if (c.size() <= static_cast<std::size_t>(actor)) c.resize(static_cast<std::size_t>(actor) + 1, 0);
    ++c[static_cast<std::size_t>(actor)];
  }
  std::string who(int actor) const { return names_[static_cast<std::size_t>(actor)]; }
  void report(int actor, const std::string& what) { violations_.push_back(who(actor) + " " + what); }

  stream_obj& stream_of(cudaStream_t s, int h) {
    if (s != nullptr) return *reinterpret_cast<stream_obj*>(s);
    // The legacy default stream: one per rank.
    const int rank = rank_of_[static_cast<std::size_t>(h)];
    auto it = null_stream_.find(rank);
    if (it != null_stream_.end()) return *it->second;
    auto st = std::make_unique<stream_obj>();
    st->actor = new_actor("default stream of rank " + std::to_string(rank));
    st->rank = rank;
    st->device = device_of_thread();
    st->legacy = true;
    stream_obj* raw = st.get();
    streams_.push_back(std::move(st));
    null_stream_[rank] = raw;
    return *raw;
  }

  // ---- how an op meets a capture (lock held) ----
  enum class route { now, capture, refused };
  // Where an op that host actor h enqueues on st goes: now, into st's capture, or
  // nowhere (st's capture was invalidated, or st is the legacy stream while a stream of
  // its rank captures: invalidated now, reported).
  route route_of(stream_obj& st, int h, const std::string& what) {
    if (st.cap != nullptr) return st.cap->invalidated ? route::refused : route::capture;
    if (st.legacy) {
      auto it = active_.find(st.rank);
      if (it != active_.end()) {
        invalidate(*it->second, h, what + " on the legacy default stream (cudaErrorStreamCaptureImplicit)");
        return route::refused;
      }
    }
    return route::now;
  }
  static cudaError_t refused_error(const stream_obj& st) {
    return st.cap != nullptr ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureImplicit;
  }
  void invalidate(capture_obj& c, int h, const std::string& what) {
    if (!c.invalidated) report(h, what + " while a stream captures a CUDA graph: CUDA refuses it and invalidates the capture");
    c.invalidated = true;
  }
  // A call CUDA refuses while a capture of the caller's rank is active: invalidates it.
  bool illegal_in_capture(int h, const char* what) {
    auto it = active_.find(rank_of_[static_cast<std::size_t>(h)]);
    if (it == active_.end()) return false;
    invalidate(*it->second, h, what);
    return true;
  }
  // A host query or wait on an event whose last record was capture-internal.
  cudaError_t captured_event(event_obj& ev, int h, const char* what) {
    const std::string msg = std::string(what) + " of an event recorded inside a stream capture";
    auto it = active_.find(rank_of_[static_cast<std::size_t>(h)]);
    if (it != active_.end() && it->second == ev.captured_in)
      invalidate(*it->second, h, msg);
    else
      report(h, msg);
    return cudaErrorStreamCaptureUnsupported;
  }

  // cuda_ipc's post and wait (lock held), now or at a graph's launch.
  struct ipc_block {
    std::uint32_t epoch = 0;                 // posts of ready enqueued so far
    std::map<std::uint32_t, vclock> ready;   // epoch -> clock of its post
    std::map<std::uint32_t, vclock> done;    // epoch -> clock of its first post
  };
  void ipc_post_on(stream_obj& st, int h, std::uint32_t* sync, unsigned slot) {
    enqueue_clock(st, h);
    ipc_block& b = ipc_blocks_[sync];
    if (slot == 1) b.ready[++b.epoch] = st.clock;
    else b.done.emplace(b.epoch, st.clock);
    ++ipc_posts_;
    op o;
    o.k = op::until;
    o.ready = [] { return true; };
    o.fn = [sync, slot] {
      if (slot == 1) sync[0] += 1;
      sync[slot] = sync[0];
    };
    push(st, std::move(o));
  }
  void ipc_wait_on(stream_obj& st, int h, host_lock& l, const std::uint32_t* const* peers, int p,
                   std::uint32_t* mine, unsigned slot, std::uint64_t limit_ns, void* fault) {
    const std::uint32_t e = ipc_blocks_[mine].epoch;
    const auto limit = limit_ns != 0 ? std::chrono::nanoseconds(limit_ns) : std::chrono::nanoseconds(ipc_enqueue_limit_);
    const auto until = std::chrono::steady_clock::now() + limit;
    std::vector<const std::uint32_t*> blocks(peers, peers + p);  // the device array, read as the kernel will
    vclock joined;
    for (int q = 0; q < p && e > 0; ++q) {
      if (blocks[static_cast<std::size_t>(q)] == mine) continue;
      ipc_block& b = ipc_blocks_[blocks[static_cast<std::size_t>(q)]];
      auto& posts = slot == 1 ? b.ready : b.done;
      if (!cv_.wait_until(l, until, [&] { return posts.count(e) != 0; })) {
        if (limit_ns == 0)
          report(h, "ipc_wait: rank " + std::to_string(q) + " enqueued no post of epoch " + std::to_string(e) +
                        " within " + std::to_string(ipc_enqueue_limit_.count()) + " ms (a deadlock of the protocol)");
        continue;  // the device wait times out too (below)
      }
      join(joined, posts.at(e));
    }
    enqueue_clock(st, h);
    join(st.clock, joined);
    auto start = std::make_shared<std::optional<std::chrono::steady_clock::time_point>>();
    auto passed = [blocks, mine, slot] {
      for (const std::uint32_t* b : blocks)
        if (static_cast<std::int32_t>(b[slot] - mine[0]) < 0) return false;
      return true;
    };
    op o;
    o.k = op::until;
    o.ready = [passed, start, limit_ns] {
      if (passed()) return true;
      if (!*start) *start = std::chrono::steady_clock::now();
      return limit_ns != 0 && std::chrono::steady_clock::now() - **start > std::chrono::nanoseconds(limit_ns);
    };
    o.fn = [passed, blocks, mine, slot, fault] {
      if (passed() || mine[3] != 0) return;
      // The first timed-out wait claims word 3 and reports (its __trap is not modelled:
      // the stream goes on).
      mine[3] = 1;
      auto* f = static_cast<std::uint32_t*>(fault);  // cgx::comm::detail::ipc_fault's words
      for (std::size_t q = 0; q < blocks.size(); ++q)
        if (static_cast<std::int32_t>(blocks[q][slot] - mine[0]) < 0) {
          f[1] = static_cast<std::uint32_t>(q);
          break;
        }
      f[2] = mine[0];
      f[3] = slot;
      f[0] = 1;
    };
    push(st, std::move(o));
  }

  // The ops themselves (lock held), now or at a graph's launch.
  void launch_on(stream_obj& st, int h, std::span<const range> ranges, const std::string& what,
                 std::function<void()> fn) {
    enqueue_clock(st, h);
    for (const range& rg : ranges) check(st.actor, st.clock, rg, what);
    op o;
    o.k = op::task;
    o.fn = std::move(fn);
    push(st, std::move(o));
  }
  void record_on(stream_obj& st, int h, event_obj& ev) {
    enqueue_clock(st, h);
    ev.captured_in = nullptr;
    ev.records += 1;
    ev.completed.push_back(0);
    ev.at_last_record = st.clock;
    op o;
    o.k = op::record;
    o.ev = &ev;
    o.rec = ev.records;
    push(st, std::move(o));
  }
  void wait_on(stream_obj& st, int h, event_obj& ev) {
    enqueue_clock(st, h);
    join(st.clock, ev.at_last_record);
    op o;
    o.k = op::wait;
    o.ev = &ev;
    o.rec = ev.records;
    push(st, std::move(o));
  }
  event_ref* ref_of(cudaEvent_t e, int h, const char* call) {
    auto* r = reinterpret_cast<event_ref*>(e);
    if (r == nullptr) {
      report(h, std::string(call) + " on a null event");
      return nullptr;
    }
    if (r->destroyed) {
      report(h, std::string(call) + " on an event handle it destroyed");
      return nullptr;
    }
    if (r->imported && r->target->destroyed) {
      report(h, std::string(call) + " on an imported event whose exporter destroyed it");
      return nullptr;
    }
    return r;
  }
  // Work enqueued by host thread h on st is ordered after everything h has done.
  void enqueue_clock(stream_obj& st, int h) {
    // CUDA rejects work (kernels, copies, event records and waits) for a stream of
    // another device than the current one.
    if (st.device != device_of_thread())
      report(h, "enqueues work on a stream of device " + std::to_string(st.device) + " while device " +
                    std::to_string(device_of_thread()) + " is current");
    tick(h);
    join(st.clock, clock_[static_cast<std::size_t>(h)]);
    if (st.clock.size() <= static_cast<std::size_t>(st.actor)) st.clock.resize(static_cast<std::size_t>(st.actor) + 1, 0);
    ++st.clock[static_cast<std::size_t>(st.actor)];
  }
  void push(stream_obj& st, op o) {
    st.q.push_back(std::move(o));
    ++st.enqueued;
    cv_.notify_all();
  }
  allocation* find(const void* p) {
    const auto x = reinterpret_cast<std::uintptr_t>(p);
    auto it = by_addr_.upper_bound(x);
    if (it == by_addr_.begin()) return nullptr;
    --it;
    allocation* a = it->second;
    if (x >= reinterpret_cast<std::uintptr_t>(a->base) + a->bytes) return nullptr;
    return a;
  }
  // Checks one access by `actor` whose clock is c (an op's: its stream's at enqueue) and logs it.
  void check(int actor, const vclock& c, const range& rg, const std::string& what) {
    if (rg.bytes == 0) return;
    allocation* a = find(rg.p);
    if (a == nullptr) return;  // pageable host memory: not tracked
    const std::string desc = what + (rg.write ? " (write)" : " (read)");
    if (a->freed) {
      report(actor, desc + " touches allocation #" + std::to_string(a->id) + " after it was freed");
      return;
    }
    const std::size_t lo = static_cast<std::size_t>(static_cast<const std::byte*>(rg.p) - a->base);
    const std::size_t hi = lo + rg.bytes;
    if (hi > a->bytes) {
      report(actor, desc + " runs past the end of allocation #" + std::to_string(a->id) + " (" +
                           std::to_string(hi) + " > " + std::to_string(a->bytes) + " bytes)");
      return;
    }
    for (const access& x : a->log) {
      if (x.hi <= lo || hi <= x.lo || !(x.write || rg.write)) continue;
      if (!knows(c, x.actor, x.time))
        report(actor, desc + " of bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of allocation #" +
                             std::to_string(a->id) + " is not ordered after " + x.what + " by " + who(x.actor) +
                             " of bytes [" + std::to_string(x.lo) + ", " + std::to_string(x.hi) + ")");
    }
    access now{lo, hi, rg.write, actor, c[static_cast<std::size_t>(actor)], desc};
    // An earlier access ordered before this one and inside its range adds nothing that
    // this one does not check (a read cannot stand in for a write).
    std::erase_if(a->log, [&](const access& x) {
      return x.lo >= lo && x.hi <= hi && (now.write || !x.write) && knows(c, x.actor, x.time);
    });
    a->log.push_back(std::move(now));
  }

  bool runnable(const stream_obj& s) const {
    if (s.q.empty()) return false;
    const op& o = s.q.front();
    if (o.k == op::until) return o.ready();
    return o.k != op::wait || o.ev->completed[o.rec] != 0;
  }

  void run() {
    std::unique_lock<std::mutex> l(m_);
    std::vector<stream_obj*> ready;
    for (;;) {
      ready.clear();
      for (auto& s : streams_)
        if (runnable(*s)) ready.push_back(s.get());
      if (ready.empty()) {
        if (stop_) return;
        cv_.wait_for(l, std::chrono::milliseconds(5));  // (time-bounded until ops: cuda_ipc's waits)
        continue;
      }
      // Now and then let the host threads enqueue more before anything runs, so that
      // ops of later calls meet those of earlier ones in the queues.
      if (gen_() % 4 == 0) {
        l.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(gen_() % 200));
        l.lock();
        continue;
      }
      stream_obj* s = ready[gen_() % ready.size()];
      op o = std::move(s->q.front());
      s->q.pop_front();
      if (o.k == op::task) {
        l.unlock();
        o.fn();
        l.lock();
      } else if (o.k == op::until) {
        o.fn();
      } else if (o.k == op::record) {
        o.ev->completed[o.rec] = 1;
      }
      ++s->done;
      ++executed_;
      cv_.notify_all();
    }
  }

  std::map<const void*, ipc_block> ipc_blocks_;  // cuda_ipc's synchronization blocks, by address
  std::uint64_t ipc_posts_ = 0;
  std::chrono::milliseconds ipc_enqueue_limit_{10000};
  const std::uint64_t serial_ = next_serial();  // worlds may reuse an address: tell them apart
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::mt19937_64 gen_;
  int devices_;
  bool stop_ = false;
  std::uint64_t executed_ = 0;
  std::vector<std::string> names_;
  std::vector<vclock> clock_;
  std::vector<int> rank_of_;
  std::vector<std::unique_ptr<stream_obj>> streams_;
  std::map<int, stream_obj*> null_stream_;
  std::vector<std::unique_ptr<allocation>> allocs_;
  std::map<std::uintptr_t, allocation*> by_addr_;
  std::vector<std::unique_ptr<event_obj>> events_;
  std::vector<std::unique_ptr<event_ref>> refs_;
  std::vector<std::string> violations_;
  std::map<int, capture_obj*> active_;  // rank -> its capture in progress
  std::vector<std::unique_ptr<capture_obj>> captures_;
  std::vector<std::unique_ptr<graph_obj>> graphs_;  // graphs and executable graphs
#if CGX_SIM_NCCL
  std::uint64_t nccl_ids_ = 0;
  std::map<std::uint64_t, std::unique_ptr<nccl_group>> nccl_groups_;
  std::vector<std::unique_ptr<nccl_comm_obj>> nccl_comms_;
  std::map<int, bool> fail_next_;
  int nccl_aborts_ = 0;
  std::chrono::milliseconds finalize_limit_{3000};
#endif  // CGX_SIM_NCCL

  std::thread exec_;
};

/// Makes `w` the world of sim::runtime for its lifetime.
class scope {
 public:
  explicit scope(world& w) { world::current() = &w; }
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;
  ~scope() { world::current() = nullptr; }
};

inline world& w() { return *world::current(); }

/// Kernels of quantizer Q on the simulated device: the CUDA kernels' bodies on the host.
template <class Q>
struct kernels;

template <int Bits, std::size_t B, class Rounding>
struct kernels<cgx::quant::maxmin<Bits, B, Rounding>> {
  using quantizer = cgx::quant::maxmin<Bits, B, Rounding>;
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return cgx::quant::wire_layout<Bits, B, cgx::quant::meta_t<T>>::bytes(n);
  }
  template <class T>
  static void compress(const T* in, std::size_t n, std::byte* out, const cgx::quant::rng_state& rng = {},
                       cudaStream_t s = nullptr) {
    if (n == 0) return;
    // The CUDA kernel adds a device plan's call counter when it runs (rng_state::device_calls).
    const std::uint32_t* calls = std::is_same_v<Rounding, cgx::quant::stochastic> ? rng.device_calls : nullptr;
    const range r[] = {{in, n * sizeof(T), false},
                       {out, compressed_bytes<T>(n), true},
                       {calls, calls != nullptr ? sizeof(std::uint32_t) : 0, false}};
    w().launch(s, r, "compress", [=] {
      cgx::quant::rng_state k = rng;
      if (calls != nullptr) k.counter += *calls;
      const std::uint64_t lanes_seed = k.counter * 0x9e3779b97f4a7c15ull + k.position;
      cgx::quant::detail::host_compress<Bits, B, Rounding, T>(in, n, out, k, cgx::quant::detail::lane_order::shuffled,
                                                              lanes_seed);
    });
  }
  template <class T>
  static void decompress(const std::byte* in, std::size_t n, T* out, cudaStream_t s = nullptr) {
    if (n == 0) return;
    const range r[] = {{in, compressed_bytes<T>(n), false}, {out, n * sizeof(T), true}};
    w().launch(s, r, "decompress",
               [=] { cgx::quant::detail::host_decode<Bits, B, false, T>(in, n, out, cgx::quant::detail::lane_order::descending); });
  }
  template <class T>
  static void decompress_add(const std::byte* in, std::size_t n, T* out, cudaStream_t s = nullptr) {
    if (n == 0) return;
    const range r[] = {{in, compressed_bytes<T>(n), false}, {out, n * sizeof(T), true}};
    w().launch(s, r, "decompress_add",
               [=] { cgx::quant::detail::host_decode<Bits, B, true, T>(in, n, out, cgx::quant::detail::lane_order::ascending); });
  }
};

/// `none` on the simulated device: copies, and y += x for decompress_add.
template <>
struct kernels<cgx::quant::none> {
  using quantizer = cgx::quant::none;
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return n * sizeof(T);
  }
  template <class T>
  static void compress(const T* in, std::size_t n, std::byte* out, const cgx::quant::rng_state& = {},
                       cudaStream_t s = nullptr) {
    if (n == 0) return;
    const range r[] = {{in, n * sizeof(T), false}, {out, n * sizeof(T), true}};
    w().launch(s, r, "compress (none)", [=] { std::memcpy(out, in, n * sizeof(T)); });
  }
  template <class T>
  static void decompress(const std::byte* in, std::size_t n, T* out, cudaStream_t s = nullptr) {
    if (n == 0) return;
    const range r[] = {{in, n * sizeof(T), false}, {out, n * sizeof(T), true}};
    w().launch(s, r, "decompress (none)", [=] { std::memcpy(out, in, n * sizeof(T)); });
  }
  template <class T>
  static void decompress_add(const std::byte* in, std::size_t n, T* out, cudaStream_t s = nullptr) {
    if (n == 0) return;
    const range r[] = {{in, n * sizeof(T), false}, {out, n * sizeof(T), true}};
    w().launch(s, r, "decompress_add (none)", [=] {
      for (std::size_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, in + i * sizeof(T), sizeof(T));
        out[i] += v;
      }
    });
  }
};

/// The simulated runtime policy (cgx/comm/runtime.cuh) over world::current().
struct runtime {
  template <class Q>
  using kernels = sim::kernels<Q>;

  static cudaError_t malloc(void** p, std::size_t bytes) { return w().malloc(p, bytes, true); }
  static cudaError_t free(void* p) { return w().free(p, true); }
  static cudaError_t host_alloc(void** p, std::size_t bytes) { return w().malloc(p, bytes, false); }
  static cudaError_t free_host(void* p) { return w().free(p, false); }
  static cudaError_t pointer_attributes(cudaPointerAttributes* a, const void* p) {
    return w().pointer_attributes(a, p);
  }
  static cudaError_t event_create(cudaEvent_t* e, unsigned flags) { return w().event_create(e, flags); }
  static cudaError_t event_destroy(cudaEvent_t e) { return w().event_destroy(e); }
  static cudaError_t event_record(cudaEvent_t e, cudaStream_t s) { return w().event_record(e, s); }
  static cudaError_t event_record_with_flags(cudaEvent_t e, cudaStream_t s, unsigned flags) {
    return w().event_record_with_flags(e, s, flags);
  }
  static cudaError_t event_query(cudaEvent_t e) { return w().event_query(e); }
  static cudaError_t event_synchronize(cudaEvent_t e) { return w().event_synchronize(e); }
  static cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) { return w().stream_wait_event(s, e); }
  static cudaError_t stream_wait_event_with_flags(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    return w().stream_wait_event_with_flags(s, e, flags);
  }
  static cudaError_t stream_synchronize(cudaStream_t s) { return w().stream_synchronize(s); }
  static cudaError_t stream_is_capturing(cudaStream_t s, cudaStreamCaptureStatus* st) {
    return w().stream_is_capturing(s, st);
  }
  static cudaError_t increment_u32(std::uint32_t* p, cudaStream_t s) {
    const range r[] = {{p, sizeof(std::uint32_t), true}};
    return w().launch(s, r, "increment_u32", [p] { *p += 1u; });
  }
  static cudaError_t ipc_post(std::uint32_t* sync, unsigned slot, cudaStream_t s) {
    return w().ipc_post(sync, slot, s);
  }
  static cudaError_t ipc_wait(const std::uint32_t* const* peers, int p, std::uint32_t* mine, unsigned slot,
                              std::uint64_t limit_ns, void* fault, cudaStream_t s) {
    return w().ipc_wait(peers, p, mine, slot, limit_ns, fault, s);
  }
  static cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind, cudaStream_t s) {
    if (bytes == 0) return cudaSuccess;
    const range r[] = {{src, bytes, false}, {dst, bytes, true}};
    return w().launch(s, r, "cudaMemcpyAsync", [=] { std::memcpy(dst, src, bytes); });
  }
  static cudaError_t get_device(int* d) { return w().get_device(d); }
  static cudaError_t set_device(int d) { return w().set_device(d); }
  static cudaError_t get_last_error() { return cudaSuccess; }
  static const char* error_name(cudaError_t) { return "simulated CUDA error"; }
  static const char* error_string(cudaError_t) { return "an error of the simulated runtime"; }
  static cudaError_t ipc_get_mem_handle(cudaIpcMemHandle_t* h, void* p) { return w().ipc_get_mem_handle(h, p); }
  static cudaError_t ipc_open_mem_handle(void** p, cudaIpcMemHandle_t h, unsigned) {
    return w().ipc_open_mem_handle(p, h);
  }
  static cudaError_t ipc_close_mem_handle(void* p) { return w().ipc_close_mem_handle(p); }
  static cudaError_t ipc_get_event_handle(cudaIpcEventHandle_t* h, cudaEvent_t e) {
    return w().ipc_get_event_handle(h, e);
  }
  static cudaError_t ipc_open_event_handle(cudaEvent_t* e, cudaIpcEventHandle_t h) {
    return w().ipc_open_event_handle(e, h);
  }
};

#if CGX_SIM_NCCL
/// The simulated NCCL API policy (cgx/comm/nccl.cuh's nccl_api) over world::current().
struct nccl {
  static ncclResult_t get_unique_id(ncclUniqueId* id) { return w().nccl_get_unique_id(id); }
  static ncclResult_t comm_init_rank(ncclComm_t* c, int n, ncclUniqueId id, int r) {
    return w().nccl_comm_init_rank(c, n, id, r);
  }
  static ncclResult_t group_start() { return w().nccl_group_start(); }
  static ncclResult_t group_end() { return w().nccl_group_end(); }
  static ncclResult_t send(const void* p, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    if (t != ncclUint8) return ncclInvalidArgument;
    return w().nccl_p2p(true, const_cast<void*>(p), n, peer, c, s);
  }
  static ncclResult_t recv(void* p, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    if (t != ncclUint8) return ncclInvalidArgument;
    return w().nccl_p2p(false, p, n, peer, c, s);
  }
  static ncclResult_t all_reduce(const void* in, void* out, std::size_t n, ncclDataType_t t, ncclRedOp_t op,
                                 ncclComm_t c, cudaStream_t s) {
    if (op != ncclSum) return ncclInvalidArgument;
    return w().nccl_all_reduce(in, out, n, t, c, s);
  }
  static ncclResult_t comm_get_async_error(ncclComm_t c, ncclResult_t* r) { return w().nccl_get_async_error(c, r); }
  static ncclResult_t comm_abort(ncclComm_t c) { return w().nccl_abort(c); }
  static ncclResult_t comm_finalize(ncclComm_t c) { return w().nccl_finalize(c); }
  static ncclResult_t comm_destroy(ncclComm_t c) { return w().nccl_destroy(c); }
  static const char* get_error_string(ncclResult_t) { return "simulated NCCL error"; }
  static const char* get_last_error(ncclComm_t c) { return w().nccl_last_error(c); }
};

#endif  // CGX_SIM_NCCL

/// The shared state of a group of thread-ranks (sim::thread_bootstrap).
struct group {
  explicit group(int ranks) : p(ranks) {}
  int p;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  vclock acc, result;
  std::vector<std::byte> blobs, out;
};

/// comm::bootstrap over threads of one process: allgather and barrier are rendezvous
/// that also join the ranks' clocks in the world (what a real barrier guarantees).
class thread_bootstrap {
 public:
  thread_bootstrap(std::shared_ptr<group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const { return rank_; }
  int size() const { return g_->p; }
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) {
    const std::size_t m = mine.size();
    std::unique_lock<std::mutex> l(g_->m);
    const std::uint64_t gen = g_->generation;
    if (g_->arrived == 0) {
      g_->acc.clear();
      g_->blobs.assign(m * static_cast<std::size_t>(g_->p), std::byte{0});
    }
    w().rendezvous_enter(g_->acc);
    if (m != 0) std::memcpy(g_->blobs.data() + m * static_cast<std::size_t>(rank_), mine.data(), m);
    if (++g_->arrived == g_->p) {
      g_->result = g_->acc;
      g_->out = g_->blobs;
      g_->arrived = 0;
      ++g_->generation;
      g_->cv.notify_all();
    } else {
      g_->cv.wait(l, [&] { return g_->generation != gen; });
    }
    w().rendezvous_leave(g_->result);
    if (!all.empty()) std::memcpy(all.data(), g_->out.data(), all.size());
  }
  void barrier() { allgather({}, {}); }
  bool same_node() { return true; }

 private:
  std::shared_ptr<group> g_;
  int rank_;
};

}  // namespace sim
