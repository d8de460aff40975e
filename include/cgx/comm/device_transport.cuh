#pragma once
/// \file device_transport.cuh
/// What a transport must do to carry a *device-buffer* reduction
/// (`cgx::device_allreduce_plan`), and the small CUDA helpers the device transports
/// share (owning device and pinned buffers, error checks).
///
/// The host `transport` concept (concepts.hpp) moves bytes with isend/irecv on host
/// pointers. Device transports differ in what they can do without the host (NCCL
/// enqueues everything on a stream; CUDA IPC lets a rank read a peer's memory; MPI
/// without CUDA support needs host staging), so the device reducers talk to them one
/// *exchange* at a time: a set of messages, every rank calling at once. A device
/// transport X provides:
///
///  - `rank()`, `size()`
///  - `std::byte* reserve(std::size_t bytes)`: collective; a device workspace of at
///    least `bytes` bytes that the transport owns (CUDA IPC must export it to peers;
///    MPI mirrors it in pinned host memory). Valid until the next reserve() or the
///    transport's destruction. Offsets in `device_message` are relative to it.
///  - `prepare_send(stream)`: called before the reducer writes into the send part of
///    the workspace; orders those writes after the peers' reads of the previous
///    exchange (a no-op for transports whose exchange completes its reads itself).
///  - `exchange(sends, recvs, stream, arrived)`: collective, every rank calls it the same
///    number of times in the same order, with messages that match pairwise (a send of b
///    bytes to r at offset o is the receive of b bytes from this rank at remote_offset o
///    on r). The send data must be ready in `stream` order when exchange is called. For
///    receive i (in the order of `recvs`) it calls `arrived(i, d_data)` once the bytes
///    are readable at device address d_data *in stream order*: arrived enqueues its
///    consumer (e.g. decompress_add) on `stream`. d_data is either this rank's workspace
///    at recvs[i].offset or, for CUDA IPC, the sender's workspace itself; it stays
///    readable until the next exchange on this transport.
///  - `max_all(span<int64_t>)`: collective maximum on the host (argument checks).
///  - `fence(stream)` (the transports of cgx have it; device_reduce_scatter_plan needs
///    it): records the workspace fence (below) behind the work enqueued on `stream` so
///    far, for a reducer that reads or writes the workspace after its last exchange of a
///    call (a reduce-scatter's owner decoding its re-quantized sum); the next call's
///    prepare_send and exchange are then ordered after that work too. No host wait.
///  - optionally `native_allreduce(T* d_buf, n, stream)`: the transport's own
///    uncompressed sum (MPI_Allreduce, ncclAllReduce), for small messages.
///  - optionally `static constexpr bool graph_capture = true`: the plans may call it
///    while the stream captures a CUDA graph (graph_capture_v): everything it enqueues is
///    capturable, and no call waits on the host for device work or for a peer. The
///    workspace fence below then becomes external event nodes of the graph.
///
/// Calls on different streams. A plan's calls may come on different streams (s1, then
/// s2), and the stream order alone does not keep call 2 from writing workspace bytes
/// that call 1's work on s1 still reads (a decompress_add reading a receive slot, a
/// send reading a send slot). Every transport therefore owns a `workspace_fence`: an
/// event recorded on the stream at the end of each exchange, behind the consumers that
/// `arrived` enqueued (for cuda_ipc its `done` event plays that part); prepare_send and
/// exchange first make their stream wait for it (cudaStreamWaitEvent). The first
/// prepare_send of call 2 thus orders s2 after all of call 1's work on s1, before any
/// workspace byte is touched; on one stream the wait is already satisfied. This is what
/// NCCL does between its internal stream and the user's, and PyTorch between streams
/// sharing a buffer. Before a workspace is freed (reserve, destruction) the host waits
/// for the fence.
///
/// The CUDA device. A transport uses the device current at its construction and makes
/// it current again (device_guard) in every call that touches CUDA, restoring the
/// caller's after: a process may drive several GPUs, one plan per GPU, from one thread.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../error.hpp"
#include "chunking.hpp"
#include "runtime.cuh"

namespace cgx::comm {

/// One message of an exchange, seen from this rank.
struct device_message {
  int peer = 0;                   ///< the other rank
  std::size_t offset = 0;         ///< where the bytes are (send) or go (receive) in this rank's workspace
  std::size_t remote_offset = 0;  ///< where they are on the peer: the sender's offset for a receive
  std::size_t bytes = 0;          ///< length (never 0: reducers leave out empty messages)
};

/// The device_message {peer, offset, remote_offset, bytes} (a function, not a braced list
/// at the call: nvcc 13 then warned that variables used only in the list were unused).
inline device_message device_msg(int peer, std::size_t offset, std::size_t remote_offset, std::size_t bytes) {
  device_message m;
  m.peer = peer;
  m.offset = offset;
  m.remote_offset = remote_offset;
  m.bytes = bytes;
  return m;
}

namespace detail {
/// A callback type used to check the `device_transport` concept.
struct arrived_archetype {
  void operator()(std::size_t, const std::byte*) const {}
};

/// Throws cgx::error(errc::cuda) with `what` and the runtime's name and text for `e`.
template <class R = cuda_runtime>
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)R::get_last_error();  // clear a non-sticky error, so that later calls start clean
    throw cgx::error(errc::cuda, std::string(what) + " failed: " + R::error_name(e) + " (" + R::error_string(e) +
                                     ")");
  }
}

/// The CUDA device current on this thread (throws when there is none).
template <class R = cuda_runtime>
int current_device(const char* who) {
  int dev = -1;
  const cudaError_t e = R::get_device(&dev);
  if (e != cudaSuccess)
    cuda_check<R>(e, (std::string(who) + ": cudaGetDevice (is there a CUDA device?)").c_str());
  return dev;
}

/// Makes `device` the current CUDA device of this thread for the guard's lifetime and
/// then restores the caller's (cudaSetDevice is cheap when the device is current).
template <class R>
class basic_device_guard {
 public:
  /// Throws cgx::error(errc::cuda) when the device cannot be made current.
  explicit basic_device_guard(int device) {
    cuda_check<R>(R::get_device(&previous_), "cgx: cudaGetDevice");
    if (previous_ != device) {
      cuda_check<R>(R::set_device(device), ("cgx: cudaSetDevice(" + std::to_string(device) + ")").c_str());
      switched_ = true;
    }
  }
  /// For destructors: errors are ignored (the calls that follow then fail quietly too).
  basic_device_guard(int device, std::nothrow_t) noexcept {
    cudaError_t e = R::get_device(&previous_);
    if (e == cudaSuccess && previous_ != device) {
      e = R::set_device(device);
      switched_ = e == cudaSuccess;
    }
    if (e != cudaSuccess) (void)R::get_last_error();
  }
  basic_device_guard(const basic_device_guard&) = delete;
  basic_device_guard& operator=(const basic_device_guard&) = delete;
  ~basic_device_guard() {
    if (switched_) (void)R::set_device(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};
/// The guard over the CUDA runtime.
using device_guard = basic_device_guard<cuda_runtime>;

/// Calls `done()` until it returns true: back to back at first (a short wait costs no
/// sleep), then yielding the core, then sleeping 1, 2, 4 ... 64 microseconds between
/// polls, so that a long wait neither keeps a core busy (ranks that oversubscribe the
/// cores) nor adds more than 64 us to the moment the host sees the completion.
template <class F>
void poll_until(F&& done) {
  for (unsigned i = 0;; ++i) {
    if (done()) return;
    if (i < 64) continue;
    if (i < 128) {
      std::this_thread::yield();
      continue;
    }
    const unsigned shift = std::min((i - 128) / 8, 6u);
    std::this_thread::sleep_for(std::chrono::microseconds(1u << shift));
  }
}
}  // namespace detail

/// Bytes of a workspace slot that holds the compressed form (D::compressed_bytes<T>) of
/// any chunk of any count up to n cut for p ranks: ceil(units / p) whole granules. The
/// device schedules place slots by it, so offsets depend only on (n, p), never on a
/// call's count: the slots stay put from call to call (cuda_ipc's ordering rule needs
/// that) and agree between ranks (a plan sizes every rank's workspace for the largest
/// max_count of all ranks).
template <class D, class T>
std::size_t device_slot_bytes(std::size_t n, int p, std::size_t granule) {
  const std::size_t units = (n + granule - 1) / granule;
  const std::size_t per = (units + static_cast<std::size_t>(p) - 1) / static_cast<std::size_t>(p);
  return round_to_line(D::template compressed_bytes<T>(per * granule));
}

/// X can carry a device reduction: see the file comment for the meaning of each call.
template <class X>
concept device_transport =
    requires(X& x, const X& cx, std::size_t bytes, cudaStream_t s, std::span<const device_message> msgs,
             std::span<std::int64_t> vals, detail::arrived_archetype f) {
      { cx.rank() } -> std::convertible_to<int>;
      { cx.size() } -> std::convertible_to<int>;
      { x.reserve(bytes) } -> std::same_as<std::byte*>;
      x.prepare_send(s);
      x.exchange(msgs, msgs, s, f);
      x.max_all(vals);
    };

/// True when a device plan over device transport X may be called while its stream
/// captures a CUDA graph (X::graph_capture): every call X makes on the stream is
/// capturable and none waits on the host for device work or for a peer. comm::nccl and
/// comm::cuda_ipc can; comm::mpi_device and basic_host_device cannot (the host moves the
/// bytes).
template <class X>
inline constexpr bool graph_capture_v = requires {
  requires X::graph_capture;
};

/// True when `stream` of runtime R is capturing a CUDA graph (or a capture on it was
/// invalidated). \throws cgx::error(errc::cuda) when the runtime cannot say.
template <class R>
bool stream_capturing(cudaStream_t stream, const char* who) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  detail::cuda_check<R>(R::stream_is_capturing(stream, &st), (std::string(who) + ": cudaStreamIsCapturing").c_str());
  return st != cudaStreamCaptureStatusNone;
}

namespace detail {
/// Allocation policies of `owned_memory`, over runtime R.
template <class R>
struct device_allocation {
  using runtime = R;
  static cudaError_t allocate(void** p, std::size_t bytes) { return R::malloc(p, bytes); }
  static void release(void* p) noexcept { (void)R::free(p); }
  static constexpr const char* what = "cudaMalloc of device workspace";
};
template <class R>
struct pinned_allocation {
  using runtime = R;
  static cudaError_t allocate(void** p, std::size_t bytes) { return R::host_alloc(p, bytes); }
  static void release(void* p) noexcept { (void)R::free_host(p); }
  static constexpr const char* what = "cudaHostAlloc of pinned staging memory";
};

/// An owning allocation made by policy A. Move-only; freed on destruction.
template <class A>
class owned_memory {
 public:
  owned_memory() = default;
  /// Allocates `bytes` bytes (at least 1). \throws cgx::error(errc::cuda) on failure.
  explicit owned_memory(std::size_t bytes) {
    cuda_check<typename A::runtime>(A::allocate(&p_, bytes == 0 ? 1 : bytes),
               ("cgx: " + std::string(A::what) + " (" + std::to_string(bytes) + " bytes)").c_str());
    size_ = bytes;
  }
  owned_memory(owned_memory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  owned_memory& operator=(owned_memory&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  owned_memory(const owned_memory&) = delete;
  owned_memory& operator=(const owned_memory&) = delete;
  ~owned_memory() { reset(); }
  /// The allocation (nullptr when empty).
  [[nodiscard]] std::byte* get() const noexcept { return static_cast<std::byte*>(p_); }
  /// Its size in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Frees it (errors are ignored: this runs in destructors).
  void reset() noexcept {
    if (p_ != nullptr) A::release(p_);
    p_ = nullptr;
    size_ = 0;
  }

 private:
  void* p_ = nullptr;
  std::size_t size_ = 0;
};
}  // namespace detail

/// Owning device allocation (cudaMalloc on the current device) of runtime R.
template <class R>
using basic_device_memory = detail::owned_memory<detail::device_allocation<R>>;
/// Owning pinned (page-locked) host allocation (cudaHostAlloc) of runtime R.
template <class R>
using basic_pinned_memory = detail::owned_memory<detail::pinned_allocation<R>>;
/// Owning device allocation (cudaMalloc on the current device).
using device_memory = basic_device_memory<cuda_runtime>;
/// Owning pinned (page-locked) host allocation (cudaHostAlloc), for staging copies that
/// overlap with transfers.
using pinned_memory = basic_pinned_memory<cuda_runtime>;

/// An owning event of runtime R. Move-only; destroyed with the object.
template <class R>
class basic_cuda_event {
 public:
  basic_cuda_event() = default;
  /// Creates an event with `flags` (e.g. cudaEventDisableTiming).
  explicit basic_cuda_event(unsigned flags) {
    detail::cuda_check<R>(R::event_create(&e_, flags), "cgx: cudaEventCreateWithFlags");
  }
  /// Takes over o's event; o holds none after.
  basic_cuda_event(basic_cuda_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  /// Destroys this event and takes over o's.
  basic_cuda_event& operator=(basic_cuda_event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  basic_cuda_event(const basic_cuda_event&) = delete;
  basic_cuda_event& operator=(const basic_cuda_event&) = delete;
  ~basic_cuda_event() { reset(); }
  /// The event handle.
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  /// Destroys the event (errors are ignored: this runs in destructors).
  void reset() noexcept {
    if (e_ != nullptr) (void)R::event_destroy(e_);
    e_ = nullptr;
  }

 private:
  cudaEvent_t e_ = nullptr;
};
/// An owning CUDA event.
using cuda_event = basic_cuda_event<cuda_runtime>;

/// The ordering rule of the file comment ("Calls on different streams"): an event that
/// a transport records at the end of each exchange and that every later prepare_send
/// and exchange waits for on its stream. Move-only; empty when moved from.
template <class R>
class basic_workspace_fence {
 public:
  basic_workspace_fence() = default;
  /// A fence for transport `who` (a string literal, used in error messages).
  explicit basic_workspace_fence(const char* who) : ev_(cudaEventDisableTiming), who_(who) {}
  /// Orders what is enqueued on `stream` next after the last record (any stream). Before
  /// the first record it is a no-op, as cudaStreamWaitEvent on an unrecorded event is.
  /// While `stream` captures a CUDA graph the wait is an external event-wait node
  /// (cudaEventWaitExternal): each launch of the graph then waits for the record that is
  /// the latest when it runs (an eager call's, another graph's or its own previous
  /// launch's), not for the one that was the latest at capture.
  void order(cudaStream_t stream) const {
    const cudaError_t e = capturing(stream)
                              ? R::stream_wait_event_with_flags(stream, ev_.get(), cudaEventWaitExternal)
                              : R::stream_wait_event(stream, ev_.get());
    if (e != cudaSuccess)
      detail::cuda_check<R>(e, (std::string(who_) + ": cudaStreamWaitEvent (workspace fence)").c_str());
  }
  /// Records the fence behind the work enqueued on `stream` so far. While `stream`
  /// captures, an external event-record node (cudaEventRecordExternal): the graph's
  /// launches record it, so eager calls and other graphs after them are ordered too.
  void record(cudaStream_t stream) {
    const cudaError_t e = capturing(stream) ? R::event_record_with_flags(ev_.get(), stream, cudaEventRecordExternal)
                                            : R::event_record(ev_.get(), stream);
    if (e != cudaSuccess) detail::cuda_check<R>(e, (std::string(who_) + ": cudaEventRecord (workspace fence)").c_str());
  }
  /// True once the work before the last record has completed (or nothing was recorded);
  /// throws cgx::error(errc::cuda) on a CUDA error (e.g. a kernel fault).
  [[nodiscard]] bool ready() const {
    if (ev_.get() == nullptr) return true;
    const cudaError_t e = R::event_query(ev_.get());
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) detail::cuda_check<R>(e, (std::string(who_) + ": cudaEventQuery (workspace fence)").c_str());
    return true;
  }
  /// Blocks the host until ready(), polling (detail::poll_until).
  void wait() const {
    detail::poll_until([&] { return ready(); });
  }
  /// For destructors: blocks until the work before the last record is done; errors ignored.
  void synchronize() const noexcept {
    if (ev_.get() != nullptr && R::event_synchronize(ev_.get()) != cudaSuccess) (void)R::get_last_error();
  }
  /// The event.
  [[nodiscard]] cudaEvent_t event() const noexcept { return ev_.get(); }

 private:
  bool capturing(cudaStream_t stream) const { return stream_capturing<R>(stream, who_); }

  basic_cuda_event<R> ev_;
  const char* who_ = "cgx";
};
/// The workspace fence over the CUDA runtime.
using workspace_fence = basic_workspace_fence<cuda_runtime>;

}  // namespace cgx::comm
