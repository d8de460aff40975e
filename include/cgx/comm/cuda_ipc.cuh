#pragma once
/// \file cuda_ipc.cuh
/// `cgx::comm::cuda_ipc`: a device transport between the processes of one node through
/// CUDA IPC: each rank exports its device workspace (`cudaIpcGetMemHandle`) and two
/// interprocess events (`cudaIpcGetEventHandle`, created with
/// `cudaEventInterprocess | cudaEventDisableTiming`); the peers map them once. MPI is
/// used only to set up (MPI_Allgather of the handles) and for one MPI_Barrier per
/// exchange: no payload byte goes through MPI or the host.
///
/// Protocol (pull): in an exchange, every rank
///   1. records its event `ready` on the stream (its send data is complete there),
///   2. enters MPI_Barrier: after it, every peer's `ready` record has been enqueued,
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
/// closes what it imported (memory handles, events), and only after an MPI_Barrier, when
/// every peer has done the same, frees its own workspace and destroys its own events.
/// (Freeing right after a barrier that preceded the peers' closes, as this file once did,
/// raced with them.)

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "../error.hpp"
#include "device_transport.cuh"
#include "mpi.hpp"

namespace cgx::comm {

/// CUDA IPC device transport (see the file comment). Construction, reserve() and
/// destruction are collective over the communicator. Uses the CUDA device current at
/// construction (call cudaSetDevice first) and makes it current in each of its calls
/// (restoring the caller's after), so one thread may drive plans on several GPUs.
/// Move-constructible (the exported memory and events move with it), not copyable or
/// assignable; a plan owns one.
class cuda_ipc {
 public:
  /// Collective over `comm` (duplicated). Throws cgx::error: errc::communicator when the
  /// ranks are not all on one node (MPI_Comm_split_type), errc::cuda when the events
  /// cannot be created, exported or imported.
  explicit cuda_ipc(MPI_Comm comm) : x_(comm) {
    device_ = detail::current_device("cgx::comm::cuda_ipc");
    const int p = x_.size();
    const int me = x_.rank();
    MPI_Comm node = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split_type(x_.comm(), MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node),
                      "cgx::comm::cuda_ipc: MPI_Comm_split_type");
    int node_size = 0;
    const int size_rc = MPI_Comm_size(node, &node_size);
    const int free_rc = MPI_Comm_free(&node);
    detail::check_mpi(size_rc, "cgx::comm::cuda_ipc: MPI_Comm_size (node communicator)");
    detail::check_mpi(free_rc, "cgx::comm::cuda_ipc: MPI_Comm_free (node communicator)");
    std::int64_t off_node[1] = {node_size == p ? 0 : 1};
    x_.max_all(off_node);
    if (off_node[0] != 0)
      throw cgx::error(errc::communicator,
                       "cgx::comm::cuda_ipc: every rank must be on one node (CUDA IPC does not cross nodes); this "
                       "communicator of " + std::to_string(p) + " ranks spans several");

    ready_ = cuda_event(cudaEventInterprocess | cudaEventDisableTiming);
    done_ = cuda_event(cudaEventInterprocess | cudaEventDisableTiming);
    struct info {
      cudaIpcEventHandle_t ready;
      cudaIpcEventHandle_t done;
      int device;
      int pid_rank;
    };
    info mine{};
    detail::cuda_check(cudaIpcGetEventHandle(&mine.ready, ready_.get()), "cgx::comm::cuda_ipc: cudaIpcGetEventHandle");
    detail::cuda_check(cudaIpcGetEventHandle(&mine.done, done_.get()), "cgx::comm::cuda_ipc: cudaIpcGetEventHandle");
    mine.device = device_;
    mine.pid_rank = me;
    std::vector<info> all(static_cast<std::size_t>(p));
    detail::check_mpi(MPI_Allgather(&mine, sizeof(info), MPI_BYTE, all.data(), sizeof(info), MPI_BYTE, x_.comm()),
                      "cgx::comm::cuda_ipc: MPI_Allgather of event handles");
    peer_ready_.assign(static_cast<std::size_t>(p), nullptr);
    peer_done_.assign(static_cast<std::size_t>(p), nullptr);
    peer_mem_.assign(static_cast<std::size_t>(p), nullptr);
    // Import everything before deciding, so that every rank throws (or not) together.
    std::string failure;
    for (int r = 0; r < p && failure.empty(); ++r) {
      if (r == me) continue;
      const auto& h = all[static_cast<std::size_t>(r)];
      cudaError_t e = cudaIpcOpenEventHandle(&peer_ready_[static_cast<std::size_t>(r)], h.ready);
      if (e == cudaSuccess) e = cudaIpcOpenEventHandle(&peer_done_[static_cast<std::size_t>(r)], h.done);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        failure = "cudaIpcOpenEventHandle of rank " + std::to_string(r) + "'s events (device " +
                  std::to_string(h.device) + ", this rank on device " + std::to_string(device_) +
                  ") failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
      }
    }
    try {
      agree_or_throw(failure);
    } catch (...) {
      // Every rank throws here (agree_or_throw is collective): close the imports, wait
      // for the peers to have closed theirs, then let the members destroy the exports.
      destroy_peer_events();
      (void)MPI_Barrier(x_.comm());
      throw;
    }
  }

  /// Movable (the plan takes the transport by value); not copyable.
  cuda_ipc(cuda_ipc&&) noexcept = default;
  cuda_ipc(const cuda_ipc&) = delete;
  cuda_ipc& operator=(const cuda_ipc&) = delete;
  cuda_ipc& operator=(cuda_ipc&&) = delete;

  /// Collective (see "Teardown" in the file comment). Waits until this rank's reads of
  /// the peers' memory are done, closes the peers' memory and events, waits in
  /// MPI_Barrier until every rank has, and only then (the members' destructors) frees its
  /// own workspace and destroys its own events. After MPI_Finalize no barrier is
  /// possible: the order then rests on the peers having closed before finalizing.
  ~cuda_ipc() {
    if (x_.comm() == MPI_COMM_NULL) return;  // moved from: owns nothing
    detail::device_guard on(device_, std::nothrow);
    if (done_.get() != nullptr && cudaEventSynchronize(done_.get()) != cudaSuccess) (void)cudaGetLastError();
    close_peer_memory();
    destroy_peer_events();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) (void)MPI_Barrier(x_.comm());
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return x_.rank(); }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return x_.size(); }
  /// The CUDA device this rank uses.
  [[nodiscard]] int device() const noexcept { return device_; }

  /// Collective. Allocates a device workspace of `bytes` bytes, exports it and maps every
  /// peer's (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess). A previous
  /// workspace is released first, in the order of "Teardown" (file comment): own reads
  /// done, peers' memory closed, barrier, own memory freed.
  std::byte* reserve(std::size_t bytes) {
    detail::device_guard on(device_);
    if (mem_.get() != nullptr) {
      detail::cuda_check(cudaEventSynchronize(done_.get()), "cgx::comm::cuda_ipc: cudaEventSynchronize");
      close_peer_memory();
      detail::check_mpi(MPI_Barrier(x_.comm()), "cgx::comm::cuda_ipc: MPI_Barrier");
      mem_.reset();
    }
    const int p = x_.size();
    const int me = x_.rank();
    mem_ = device_memory(bytes < 256 ? 256 : bytes);
    cudaIpcMemHandle_t mine{};
    detail::cuda_check(cudaIpcGetMemHandle(&mine, mem_.get()), "cgx::comm::cuda_ipc: cudaIpcGetMemHandle");
    std::vector<cudaIpcMemHandle_t> all(static_cast<std::size_t>(p));
    detail::check_mpi(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, x_.comm()),
                      "cgx::comm::cuda_ipc: MPI_Allgather of memory handles");
    std::string failure;
    for (int r = 0; r < p && failure.empty(); ++r) {
      if (r == me) continue;
      void* ptr = nullptr;
      const cudaError_t e =
          cudaIpcOpenMemHandle(&ptr, all[static_cast<std::size_t>(r)], cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        failure = "cudaIpcOpenMemHandle of rank " + std::to_string(r) + "'s workspace (this rank on device " +
                  std::to_string(device_) + ") failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
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
    detail::device_guard on(device_);
    order_after_own(stream);
    for (int r = 0; r < x_.size(); ++r) {
      if (r == x_.rank()) continue;
      detail::cuda_check(cudaStreamWaitEvent(stream, peer_done_[static_cast<std::size_t>(r)], 0),
                         "cgx::comm::cuda_ipc: cudaStreamWaitEvent (peer done)");
    }
  }

  /// Collective: one exchange (see the file comment). `sends` need no action (the peers
  /// pull); for receive i, `arrived(i, d)` gets the sender's workspace address
  /// d = peer base + recvs[i].remote_offset, readable in `stream` order.
  template <class F>
  void exchange(std::span<const device_message> /*sends*/, std::span<const device_message> recvs,
                cudaStream_t stream, F&& arrived) {
    detail::device_guard on(device_);
    order_after_own(stream);
    detail::cuda_check(cudaEventRecord(ready_.get(), stream), "cgx::comm::cuda_ipc: cudaEventRecord (ready)");
    detail::check_mpi(MPI_Barrier(x_.comm()), "cgx::comm::cuda_ipc: MPI_Barrier");
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const auto& m = recvs[i];
      const auto r = static_cast<std::size_t>(m.peer);
      detail::cuda_check(cudaStreamWaitEvent(stream, peer_ready_[r], 0),
                         "cgx::comm::cuda_ipc: cudaStreamWaitEvent (peer ready)");
      arrived(i, static_cast<const std::byte*>(peer_mem_[r] + m.remote_offset));
    }
    detail::cuda_check(cudaEventRecord(done_.get(), stream), "cgx::comm::cuda_ipc: cudaEventRecord (done)");
  }

  /// Collective: element-wise maximum over all ranks (host values, over MPI).
  void max_all(std::span<std::int64_t> v) { x_.max_all(v); }

 private:
  /// Throws on every rank when any rank's `failure` is not empty (collective).
  void agree_or_throw(const std::string& failure) {
    std::int64_t bad[1] = {failure.empty() ? 0 : 1};
    x_.max_all(bad);
    if (bad[0] == 0) return;
    throw cgx::error(errc::cuda, "cgx::comm::cuda_ipc (rank " + std::to_string(x_.rank()) + "): " +
                                     (failure.empty() ? std::string("another rank could not map CUDA IPC handles")
                                                      : failure));
  }

  /// `stream` waits for this rank's latest `done` (its workspace fence). Before the first
  /// record, a no-op.
  void order_after_own(cudaStream_t stream) {
    detail::cuda_check(cudaStreamWaitEvent(stream, done_.get(), 0),
                       "cgx::comm::cuda_ipc: cudaStreamWaitEvent (own done)");
  }

  void destroy_peer_events() noexcept {
    for (auto* v : {&peer_ready_, &peer_done_})
      for (auto& e : *v) {
        if (e != nullptr) (void)cudaEventDestroy(e);
        e = nullptr;
      }
  }

  void close_peer_memory() noexcept {
    for (auto& ptr : peer_mem_) {
      if (ptr != nullptr) (void)cudaIpcCloseMemHandle(ptr);
      ptr = nullptr;
    }
  }

  mpi x_;
  int device_ = 0;
  cuda_event ready_;
  cuda_event done_;
  device_memory mem_;
  std::vector<cudaEvent_t> peer_ready_;
  std::vector<cudaEvent_t> peer_done_;
  std::vector<std::byte*> peer_mem_;
};

}  // namespace cgx::comm
