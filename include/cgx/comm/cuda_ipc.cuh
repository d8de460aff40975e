#pragma once
/// \file cuda_ipc.cuh
/// `cgx::comm::cuda_ipc`: a device transport between the processes of one node through
/// CUDA IPC: each rank exports its device workspace (`cudaIpcGetMemHandle`) and two
/// interprocess events (`cudaIpcGetEventHandle`, created with
/// `cudaEventInterprocess | cudaEventDisableTiming`); the peers map them once. The
/// process group is a `bootstrap` (comm/bootstrap.hpp), used only to set up (allgather
/// of the handles, agreement on failures) and for one barrier per exchange: no payload
/// byte goes through it or the host. The bootstrap is an MPI communicator
/// (`cuda_ipc{MPI_COMM_WORLD}`, through comm::mpi_bootstrap, when <mpi.h> is reachable)
/// or, with no MPI at all, a comm::socket_bootstrap of processes made by
/// comm::run_forked (comm/fork_group.hpp). Nothing else in this file needs MPI.
///
/// Protocol (pull): in an exchange, every rank
///   1. records its event `ready` on the stream (its send data is complete there),
///   2. enters the bootstrap's barrier: after it, every peer's `ready` record has been
///      enqueued,
///   3. for each receive, makes its stream wait for the sender's `ready`
///      (cudaStreamWaitEvent on the imported event) and hands the *sender's* workspace
///      address to the consumer, which reads the bytes in place (decompress_add straight
///      from the peer's memory: no copy),
///   4. records its event `done` (its reads of the peers' memory are complete there).
/// Before a rank overwrites its send region (`prepare_send`), its stream waits for every
/// peer's latest `done`. That record is recent enough because reducers write, between
/// two exchanges, only bytes that the exchange before the previous one read (SRA: phase 1
/// reads the send slots r != owner, phase 2 the owner's own slot), and the peers'
/// `done` of that older exchange was enqueued before the barrier of the one in between.
/// prepare_send and exchange also make the stream wait for the rank's *own* latest
/// `done`, its workspace fence (device_transport.cuh): a call on another stream than
/// the previous call's then writes nothing that the previous call's own work (the
/// decompress of send slot me, a ring's forwarded copy into an allgather slot) still
/// reads.
/// A peer that waits for a later `ready` record than the one of its exchange only waits
/// longer: the bytes it reads were not rewritten in between, by the same rule.
///
/// The host blocks only in the barriers; the data movement is stream-ordered and
/// overlaps nothing but itself. Processes may share one GPU (the memory and events are
/// then imported into a different context of the same device) or use different GPUs of
/// the node (the mapping enables peer access; it fails with a clear message where the
/// GPUs cannot reach each other). Every rank must be on the same node; the constructor
/// checks that.
///
/// Teardown (destructor, and reserve() replacing a workspace). The CUDA runtime makes it
/// undefined behaviour to free an exported allocation before every importer has called
/// cudaIpcCloseMemHandle, or to use an imported event after its exporter destroyed it.
/// So every rank first waits for its own reads of the peers' memory (`done`), then
/// closes what it imported (memory handles, events), and only after a barrier, when
/// every peer has done the same, frees its own workspace and destroys its own events.
/// (Freeing right after a barrier that preceded the peers' closes, as this file once did,
/// raced with them.)

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "../error.hpp"
#include "bootstrap.hpp"
#include "device_transport.cuh"
#if __has_include(<mpi.h>)
#include "mpi_bootstrap.hpp"  // an MPI_Comm is a bootstrap_source
#endif

namespace cgx::comm {

/// CUDA IPC device transport (see the file comment). Construction, reserve() and
/// destruction are collective over the bootstrap. Uses the CUDA device current at
/// construction (call cudaSetDevice first) and makes it current in each of its calls
/// (restoring the caller's after), so one thread may drive plans on several GPUs.
/// Move-constructible (the exported memory and events move with it), not copyable or
/// assignable; a plan owns one. R is the runtime policy (comm/runtime.cuh): `cuda_ipc`
/// is basic_cuda_ipc<cuda_runtime>; the tests also run it over a simulated runtime.
template <class R>
class basic_cuda_ipc {
 public:
  /// The runtime policy its calls go through.
  using runtime_type = R;

  /// Collective over `source`: a bootstrap (comm::socket_bootstrap, comm::mpi_bootstrap,
  /// comm::any_bootstrap), taken over, or a bootstrap_source such as an MPI_Comm
  /// (duplicated, through comm::mpi_bootstrap). Throws cgx::error: errc::communicator
  /// when the ranks are not all on one node (the bootstrap's same_node()),
  /// errc::transport when the bootstrap fails, errc::cuda when the events cannot be
  /// created, exported or imported.
  template <class S>
    requires(bootstrap<S> || bootstrap_source<S>)
  explicit basic_cuda_ipc(S source) : basic_cuda_ipc(to_bootstrap(std::move(source)), 0) {}

  /// Movable (the plan takes the transport by value); not copyable.
  basic_cuda_ipc(basic_cuda_ipc&&) noexcept = default;
  basic_cuda_ipc(const basic_cuda_ipc&) = delete;
  basic_cuda_ipc& operator=(const basic_cuda_ipc&) = delete;
  basic_cuda_ipc& operator=(basic_cuda_ipc&&) = delete;

  /// Collective (see "Teardown" in the file comment). Waits until this rank's reads of
  /// the peers' memory are done, closes the peers' memory and events, waits in
  /// bootstrap's barrier until every rank has, and only then (the members' destructors)
  /// frees its own workspace and destroys its own events. When the barrier fails (after
  /// MPI_Finalize; a dead peer or a timeout of a socket_bootstrap) the order rests on the
  /// peers having closed before.
  ~basic_cuda_ipc() {
    if (!boot_) return;  // moved from: owns nothing
    guard on(device_, std::nothrow);
    if (done_.get() != nullptr && R::event_synchronize(done_.get()) != cudaSuccess) (void)R::get_last_error();
    close_peer_memory();
    destroy_peer_events();
    try {
      boot_.barrier();
    } catch (const cgx::error&) {  // nothing to tell in a destructor
    }
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The CUDA device this rank uses.
  [[nodiscard]] int device() const noexcept { return device_; }

  /// Collective. Allocates a device workspace of `bytes` bytes, exports it and maps every
  /// peer's (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess). A previous
  /// workspace is released first, in the order of "Teardown" (file comment): own reads
  /// done, peers' memory closed, barrier, own memory freed.
  std::byte* reserve(std::size_t bytes) {
    guard on(device_);
    if (mem_.get() != nullptr) {
      detail::cuda_check<R>(R::event_synchronize(done_.get()), "cgx::comm::cuda_ipc: cudaEventSynchronize");
      close_peer_memory();
      boot_.barrier();
      mem_.reset();
    }
    const int p = size_;
    const int me = rank_;
    mem_ = basic_device_memory<R>(bytes < 256 ? 256 : bytes);
    cudaIpcMemHandle_t mine{};
    detail::cuda_check<R>(R::ipc_get_mem_handle(&mine, mem_.get()), "cgx::comm::cuda_ipc: cudaIpcGetMemHandle");
    std::vector<cudaIpcMemHandle_t> all(static_cast<std::size_t>(p));
    boot_.allgather(std::as_bytes(std::span<const cudaIpcMemHandle_t>(&mine, 1)),
                    std::as_writable_bytes(std::span<cudaIpcMemHandle_t>(all)));
    std::string failure;
    for (int r = 0; r < p && failure.empty(); ++r) {
      if (r == me) continue;
      void* ptr = nullptr;
      const cudaError_t e =
          R::ipc_open_mem_handle(&ptr, all[static_cast<std::size_t>(r)], cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        (void)R::get_last_error();
        failure = "cudaIpcOpenMemHandle of rank " + std::to_string(r) + "'s workspace (this rank on device " +
                  std::to_string(device_) + ") failed: " + R::error_name(e) + " (" + R::error_string(e) +
                  "); CUDA IPC needs all ranks on one node, and GPUs that can reach each other (peer access)";
      } else {
        peer_mem_[static_cast<std::size_t>(r)] = static_cast<std::byte*>(ptr);
      }
    }
    agree_or_throw(failure);
    return mem_.get();
  }

  /// Orders the caller's coming writes to its send region after every peer's reads of
  /// it (cudaStreamWaitEvent on each peer's `done`) and after this rank's own work of
  /// the previous exchange, whatever its stream (its own `done`). No host wait.
  void prepare_send(cudaStream_t stream) {
    guard on(device_);
    order_after_own(stream);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      detail::cuda_check<R>(R::stream_wait_event(stream, peer_done_[static_cast<std::size_t>(r)]),
                         "cgx::comm::cuda_ipc: cudaStreamWaitEvent (peer done)");
    }
  }

  /// Records `done` (the workspace fence, and what peers wait for before they overwrite
  /// their send regions) behind the work enqueued on `stream` so far: work on this
  /// rank's workspace after the last exchange of a call. No host wait.
  void fence(cudaStream_t stream) {
    guard on(device_);
    detail::cuda_check<R>(R::event_record(done_.get(), stream), "cgx::comm::cuda_ipc: cudaEventRecord (done)");
  }

  /// Collective: one exchange (see the file comment). `sends` need no action (the peers
  /// pull); for receive i, `arrived(i, d)` gets the sender's workspace address
  /// d = peer base + recvs[i].remote_offset, readable in `stream` order.
  template <class F>
  void exchange(std::span<const device_message> /*sends*/, std::span<const device_message> recvs,
                cudaStream_t stream, F&& arrived) {
    guard on(device_);
    order_after_own(stream);
    detail::cuda_check<R>(R::event_record(ready_.get(), stream), "cgx::comm::cuda_ipc: cudaEventRecord (ready)");
    boot_.barrier();
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const auto& m = recvs[i];
      const auto r = static_cast<std::size_t>(m.peer);
      detail::cuda_check<R>(R::stream_wait_event(stream, peer_ready_[r]),
                         "cgx::comm::cuda_ipc: cudaStreamWaitEvent (peer ready)");
      arrived(i, static_cast<const std::byte*>(peer_mem_[r] + m.remote_offset));
    }
    detail::cuda_check<R>(R::event_record(done_.get(), stream), "cgx::comm::cuda_ipc: cudaEventRecord (done)");
  }

  /// Collective: element-wise maximum over all ranks (host values, over the bootstrap).
  void max_all(std::span<std::int64_t> v) { comm::max_all(boot_, v, gathered_); }

 private:

  using guard = detail::basic_device_guard<R>;

  /// The constructor proper (the int only tells it from the public template).
  basic_cuda_ipc(any_bootstrap boot, int) : boot_(std::move(boot)), rank_(boot_.rank()), size_(boot_.size()) {
    device_ = detail::current_device<R>("cgx::comm::cuda_ipc");
    const int p = size_;
    const int me = rank_;
    if (!boot_.same_node())
      throw cgx::error(errc::communicator,
                       "cgx::comm::cuda_ipc: every rank must be on one node (CUDA IPC does not cross nodes); this "
                       "group of " + std::to_string(p) + " ranks spans several");
    ready_ = basic_cuda_event<R>(cudaEventInterprocess | cudaEventDisableTiming);
    done_ = basic_cuda_event<R>(cudaEventInterprocess | cudaEventDisableTiming);
    struct info {
      cudaIpcEventHandle_t ready;
      cudaIpcEventHandle_t done;
      int device;
      int pid_rank;
    };
    info mine{};
    detail::cuda_check<R>(R::ipc_get_event_handle(&mine.ready, ready_.get()),
                          "cgx::comm::cuda_ipc: cudaIpcGetEventHandle");
    detail::cuda_check<R>(R::ipc_get_event_handle(&mine.done, done_.get()), "cgx::comm::cuda_ipc: cudaIpcGetEventHandle");
    mine.device = device_;
    mine.pid_rank = me;
    std::vector<info> all(static_cast<std::size_t>(p));
    boot_.allgather(std::as_bytes(std::span<const info>(&mine, 1)), std::as_writable_bytes(std::span<info>(all)));
    peer_ready_.assign(static_cast<std::size_t>(p), nullptr);
    peer_done_.assign(static_cast<std::size_t>(p), nullptr);
    peer_mem_.assign(static_cast<std::size_t>(p), nullptr);
    // Import everything before deciding, so that every rank throws (or not) together.
    std::string failure;
    for (int r = 0; r < p && failure.empty(); ++r) {
      if (r == me) continue;
      const auto& h = all[static_cast<std::size_t>(r)];
      cudaError_t e = R::ipc_open_event_handle(&peer_ready_[static_cast<std::size_t>(r)], h.ready);
      if (e == cudaSuccess) e = R::ipc_open_event_handle(&peer_done_[static_cast<std::size_t>(r)], h.done);
      if (e != cudaSuccess) {
        (void)R::get_last_error();
        failure = "cudaIpcOpenEventHandle of rank " + std::to_string(r) + "'s events (device " +
                  std::to_string(h.device) + ", this rank on device " + std::to_string(device_) +
                  ") failed: " + R::error_name(e) + " (" + R::error_string(e) + ")";
      }
    }
    try {
      agree_or_throw(failure);
    } catch (...) {
      // Every rank throws here (agree_or_throw is collective): close the imports, wait
      // for the peers to have closed theirs, then let the members destroy the exports.
      destroy_peer_events();
      try {
        boot_.barrier();
      } catch (const cgx::error&) {  // the bootstrap failed too: throw the first error
      }
      throw;
    }
  }

  /// Throws on every rank when any rank's `failure` is not empty (collective).
  void agree_or_throw(const std::string& failure) {
    std::int64_t bad[1] = {failure.empty() ? 0 : 1};
    max_all(bad);
    if (bad[0] == 0) return;
    throw cgx::error(errc::cuda, "cgx::comm::cuda_ipc (rank " + std::to_string(rank_) + "): " +
                                     (failure.empty() ? std::string("another rank could not map CUDA IPC handles")
                                                      : failure));
  }

  /// `stream` waits for this rank's latest `done` (its workspace fence). Before the first
  /// record, a no-op.
  void order_after_own(cudaStream_t stream) {
    detail::cuda_check<R>(R::stream_wait_event(stream, done_.get()),
                       "cgx::comm::cuda_ipc: cudaStreamWaitEvent (own done)");
  }

  void destroy_peer_events() noexcept {
    for (auto* v : {&peer_ready_, &peer_done_})
      for (auto& e : *v) {
        if (e != nullptr) (void)R::event_destroy(e);
        e = nullptr;
      }
  }

  void close_peer_memory() noexcept {
    for (auto& ptr : peer_mem_) {
      if (ptr != nullptr) (void)R::ipc_close_mem_handle(ptr);
      ptr = nullptr;
    }
  }

  any_bootstrap boot_;
  std::vector<std::byte> gathered_;  // max_all's gather buffer (argument checks, every call)
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  basic_cuda_event<R> ready_;
  basic_cuda_event<R> done_;
  basic_device_memory<R> mem_;
  std::vector<cudaEvent_t> peer_ready_;
  std::vector<cudaEvent_t> peer_done_;
  std::vector<std::byte*> peer_mem_;
};

/// CUDA IPC over the CUDA runtime (see basic_cuda_ipc).
using cuda_ipc = basic_cuda_ipc<cuda_runtime>;

}  // namespace cgx::comm
