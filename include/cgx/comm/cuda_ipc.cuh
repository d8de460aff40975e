#pragma once
/// \file cuda_ipc.cuh
/// `cgx::comm::cuda_ipc`: a device transport between the processes of one node through
/// CUDA IPC. Each rank exports its device workspace and a small synchronization block
/// (`cudaIpcGetMemHandle`); the peers map both once. The process group is a `bootstrap`
/// (comm/bootstrap.hpp), used only to set up (allgather of the handles, agreement on
/// failures) and to tear down: no payload byte and no per-exchange synchronization goes
/// through it or the host. The bootstrap is an MPI communicator (`cuda_ipc{MPI_COMM_WORLD}`,
/// through comm::mpi_bootstrap, when <mpi.h> is reachable) or, with no MPI at all, a
/// comm::socket_bootstrap of processes made by comm::run_forked (comm/fork_group.hpp).
/// Nothing else in this file needs MPI.
///
/// Synchronization on the device. A rank's synchronization block holds three 32-bit
/// words written only by its own stream work: `epoch` (the exchanges it has begun),
/// `ready` (the epoch whose send data is complete) and `done` (the epoch whose reads of
/// the peers' memory are complete). Two one-block kernels (runtime policy: ipc_post,
/// ipc_wait) move them: a post writes a word behind the stream's earlier work (a
/// system-scope fence, then the store), a wait spins on the peers' words until each is
/// at least this rank's own epoch (read on the device when the kernel runs). Because
/// the epochs live on the device and advance in stream order, a call captured in a CUDA
/// graph waits for the right exchange on every launch (comm::graph_capture_v holds).
///
/// Protocol (pull): in an exchange, every rank
///   1. orders the exchange after its own previous work (the workspace fence, below),
///   2. posts `ready`: epoch += 1, ready = epoch (its send data is complete there),
///   3. waits until every peer's `ready` reaches its epoch: every peer's send data of
///      this exchange is complete,
///   4. hands the *sender's* workspace address of each receive to the consumer, which
///      reads the bytes in place (decompress_add straight from the peer's memory: no copy),
///   5. posts `done` = epoch (its reads of the peers' memory are complete there).
/// Before a rank overwrites its send region (`prepare_send`) its stream waits until every
/// peer's `done` reaches its epoch: the peers have finished reading what it sent in the
/// last exchange (reducers write, between two exchanges, only bytes that the exchange
/// before the previous one read, so this is more than the schedules need, and it cannot
/// deadlock: a peer's `done` of that exchange needs only `ready` posts that are already
/// behind this rank). Every rank calls exchange the same number of times (collective), so
/// equal epochs name the same exchange on every rank.
/// prepare_send and exchange also make the stream wait for the rank's own latest work of
/// the previous exchange or call, its workspace fence (device_transport.cuh): a call on
/// another stream than the previous call's then writes nothing that the previous call's
/// own work (the decompress of send slot me, a ring's forwarded copy into an allgather
/// slot) still reads.
///
/// The host blocks nowhere in a call: every step is stream-ordered. Processes may share
/// one GPU (the memory is then imported into a different context of the same device; the
/// waiting kernel holds one block while it spins, and the GPU time-slices between the
/// processes' contexts) or use different GPUs of the node (the mapping enables peer
/// access; it fails with a clear message where the GPUs cannot reach each other). Every
/// rank must be on the same node; the constructor checks that.
///
/// A peer that never posts (it stopped calling, died, or called a different number of
/// exchanges). The device wait is bounded by the wait limit (`set_wait_limit`,
/// plan_options::timeout_ms, 10 minutes unless set): past it the kernel writes the peer
/// and the epoch into a pinned host word and traps (`__trap`), which makes the failure
/// loud: the CUDA context is lost (every later CUDA call of the process fails), as when
/// NCCL's watchdog aborts a hung collective. The plans' next call throws
/// cgx::error(errc::timeout) naming the peer (`raise_device_failure`) before any CUDA
/// call. With a limit of 0 the wait is unbounded.
///
/// Teardown (destructor, and reserve() replacing a workspace). The CUDA runtime makes it
/// undefined behaviour to free an exported allocation before every importer has called
/// cudaIpcCloseMemHandle. So every rank first waits for its own work (the workspace
/// fence: its reads of the peers' memory and its waits on their synchronization blocks),
/// then closes what it imported, and only after a barrier, when every peer has done the
/// same, frees its own workspace and block. (Freeing right after a barrier that preceded
/// the peers' closes, as this file once did, raced with them.)

#include <chrono>
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
#include "runtime.cuh"
#if __has_include(<mpi.h>)
#include "mpi_bootstrap.hpp"  // an MPI_Comm is a bootstrap_source
#endif

namespace cgx::comm {

namespace detail {
/// The words of a cuda_ipc synchronization block (see the file comment); ipc_claim is
/// taken by the first of this rank's waits that times out (it alone reports).
enum ipc_word : unsigned { ipc_epoch = 0, ipc_ready = 1, ipc_done = 2, ipc_claim = 3 };

/// Where a device wait of cuda_ipc reports that it ran out of time (pinned host memory,
/// written by the kernel before it traps, read by the host without a CUDA call).
struct ipc_fault {
  std::uint32_t failed;  ///< nonzero once a wait timed out (written last)
  std::uint32_t peer;    ///< the rank it waited for
  std::uint32_t epoch;   ///< the epoch it waited for
  std::uint32_t word;    ///< ipc_ready or ipc_done
};

#if defined(__CUDACC__)
/// ipc_post: slot ipc_ready begins an exchange (epoch += 1, ready = epoch); ipc_done
/// publishes done = epoch. One thread; the fence puts the stream's earlier writes (the
/// send data, the reads of the peers' memory) before the store for every observer.
__global__ void ipc_post_kernel(std::uint32_t* sync, unsigned slot) {
  volatile std::uint32_t* s = sync;
  std::uint32_t e = s[ipc_epoch];
  if (slot == ipc_ready) s[ipc_epoch] = ++e;
  __threadfence_system();
  s[slot] = e;
  __threadfence_system();
}

/// ipc_wait: thread q waits until peers[q][slot] reaches this rank's epoch (modulo 2^32),
/// at most limit_ns (0: no limit); past it, it reports in *fault and traps.
__global__ void ipc_wait_kernel(const std::uint32_t* const* peers, int p, std::uint32_t* mine, unsigned slot,
                                unsigned long long limit_ns, ipc_fault* fault) {
  const std::uint32_t e = *static_cast<volatile std::uint32_t*>(mine + ipc_epoch);
  for (int q = static_cast<int>(threadIdx.x); q < p; q += static_cast<int>(blockDim.x)) {
    const volatile std::uint32_t* f = peers[q] + slot;
    unsigned long long start = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (static_cast<std::int32_t>(*f - e) < 0) {
      if (limit_ns != 0) {
        unsigned long long now = 0;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > limit_ns) {
          // The claim is a device-memory atomic (this rank's waits are all on its own
          // device); the report goes to host memory with plain stores.
          if (atomicCAS(mine + ipc_claim, 0u, 1u) == 0u) {
            volatile ipc_fault* out = fault;
            out->peer = static_cast<std::uint32_t>(q);
            out->epoch = e;
            out->word = slot;
            __threadfence_system();
            out->failed = 1;
            __threadfence_system();
          }
          __trap();
        }
      }
      __nanosleep(256);
    }
  }
  __threadfence_system();  // the peers' writes before their post are seen after this kernel
}
#endif
}  // namespace detail

#if defined(__CUDACC__)
inline cudaError_t cuda_runtime::ipc_post(std::uint32_t* sync, unsigned slot, cudaStream_t stream) {
  detail::ipc_post_kernel<<<1, 1, 0, stream>>>(sync, slot);
  return cudaGetLastError();
}
inline cudaError_t cuda_runtime::ipc_wait(const std::uint32_t* const* peers, int p, std::uint32_t* mine,
                                          unsigned slot, std::uint64_t limit_ns, void* fault, cudaStream_t stream) {
  detail::ipc_wait_kernel<<<1, 32, 0, stream>>>(peers, p, mine, slot, limit_ns,
                                                 static_cast<detail::ipc_fault*>(fault));
  return cudaGetLastError();
}
#endif

/// CUDA IPC device transport (see the file comment). Construction, reserve() and
/// destruction are collective over the bootstrap. Uses the CUDA device current at
/// construction (call cudaSetDevice first) and makes it current in each of its calls
/// (restoring the caller's after), so one thread may drive plans on several GPUs.
/// Move-constructible (the exported memory moves with it), not copyable or assignable; a
/// plan owns one. R is the runtime policy (comm/runtime.cuh): `cuda_ipc` is
/// basic_cuda_ipc<cuda_runtime>; the tests also run it over a simulated runtime.
template <class R>
class basic_cuda_ipc {
 public:
  /// The runtime policy its calls go through.
  using runtime_type = R;
  /// A plan may call it while its stream captures a CUDA graph (graph_capture_v): an
  /// exchange is kernels and event records on the stream, and its epochs advance on the
  /// device, so every launch of the graph waits for its own exchange.
  static constexpr bool graph_capture = true;

  /// Collective over `source`: a bootstrap (comm::socket_bootstrap, comm::mpi_bootstrap,
  /// comm::any_bootstrap), taken over, or a bootstrap_source such as an MPI_Comm
  /// (duplicated, through comm::mpi_bootstrap). Throws cgx::error: errc::communicator
  /// when the ranks are not all on one node (the bootstrap's same_node()),
  /// errc::transport when the bootstrap fails, errc::cuda when the synchronization block
  /// cannot be allocated, exported or imported.
  template <class S>
    requires(bootstrap<S> || bootstrap_source<S>)
  explicit basic_cuda_ipc(S source) : basic_cuda_ipc(to_bootstrap(std::move(source)), 0) {}

  /// Movable (the plan takes the transport by value); not copyable.
  basic_cuda_ipc(basic_cuda_ipc&&) noexcept = default;
  basic_cuda_ipc(const basic_cuda_ipc&) = delete;
  basic_cuda_ipc& operator=(const basic_cuda_ipc&) = delete;
  basic_cuda_ipc& operator=(basic_cuda_ipc&&) = delete;

  /// Collective (see "Teardown" in the file comment). Waits until this rank's work is
  /// done, closes the peers' memory, waits in the bootstrap's barrier until every rank
  /// has, and only then (the members' destructors) frees its own. When the barrier fails
  /// (after MPI_Finalize; a dead peer or a timeout of a socket_bootstrap) the order rests
  /// on the peers having closed before.
  ~basic_cuda_ipc() {
    if (!boot_) return;  // moved from: owns nothing
    guard on(device_, std::nothrow);
    if (fence_.event() != nullptr && R::event_synchronize(fence_.event()) != cudaSuccess) (void)R::get_last_error();
    close_peer_memory();
    close_peer_sync();
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

  /// The device waits' limit (plan_options::timeout_ms through the plans; 0: none).
  void set_wait_limit(std::chrono::milliseconds limit) noexcept {
    limit_ms_ = limit.count() < 0 ? 0 : static_cast<std::uint64_t>(limit.count());
  }

  /// Throws cgx::error(errc::timeout) when a device wait of this transport ran out of
  /// time (see the file comment); makes no CUDA call (the context is lost then). The
  /// plans call it first in every call.
  void raise_device_failure() const {
    const volatile detail::ipc_fault* f = fault_get();
    if (f == nullptr || f->failed == 0) return;
    throw cgx::error(errc::timeout,
                     "cgx::comm::cuda_ipc (rank " + std::to_string(rank_) + "): the device waited more than " +
                         std::to_string(limit_ms_) + " ms (plan_options::timeout_ms) for rank " +
                         std::to_string(f->peer) + " to post '" + (f->word == detail::ipc_ready ? "ready" : "done") +
                         "' of exchange " + std::to_string(f->epoch) +
                         " (a peer that stopped calling, died, or made other calls); the waiting kernel trapped, so "
                         "this process's CUDA context is lost");
  }

  /// Collective. Allocates a device workspace of `bytes` bytes, exports it and maps every
  /// peer's (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess). A previous
  /// workspace is released first, in the order of "Teardown" (file comment): own work
  /// done, peers' memory closed, barrier, own memory freed.
  std::byte* reserve(std::size_t bytes) {
    raise_device_failure();
    guard on(device_);
    if (mem_.get() != nullptr) {
      detail::cuda_check<R>(R::event_synchronize(fence_.event()), "cgx::comm::cuda_ipc: cudaEventSynchronize");
      close_peer_memory();
      boot_.barrier();
      mem_.reset();
    }
    mem_ = basic_device_memory<R>(bytes < 256 ? 256 : bytes);
    peer_mem_ = open_peers(mem_.get(), "workspace");
    return mem_.get();
  }

  /// Orders the caller's coming writes to its send region after every peer's reads of
  /// it (a device wait for every peer's `done` of the last exchange) and after this
  /// rank's own work of the previous exchange, whatever its stream (the fence). No host
  /// wait.
  void prepare_send(cudaStream_t stream) {
    raise_device_failure();
    guard on(device_);
    fence_.order(stream);
    wait_all(detail::ipc_done, stream);
  }

  /// Records the workspace fence behind the work enqueued on `stream` so far: work on
  /// this rank's workspace after the last exchange of a call. No host wait.
  void fence(cudaStream_t stream) {
    raise_device_failure();
    guard on(device_);
    fence_.record(stream);
  }

  /// Collective: one exchange (see the file comment). `sends` need no action (the peers
  /// pull); for receive i, `arrived(i, d)` gets the sender's workspace address
  /// d = peer base + recvs[i].remote_offset, readable in `stream` order.
  template <class F>
  void exchange(std::span<const device_message> /*sends*/, std::span<const device_message> recvs,
                cudaStream_t stream, F&& arrived) {
    raise_device_failure();
    guard on(device_);
    fence_.order(stream);
    post(detail::ipc_ready, stream);
    wait_all(detail::ipc_ready, stream);
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const auto& m = recvs[i];
      arrived(i, static_cast<const std::byte*>(peer_mem_[static_cast<std::size_t>(m.peer)] + m.remote_offset));
    }
    post(detail::ipc_done, stream);
    fence_.record(stream);
  }

  /// Collective: element-wise maximum over all ranks (host values, over the bootstrap).
  void max_all(std::span<std::int64_t> v) { comm::max_all(boot_, v, gathered_); }

 private:
  using guard = detail::basic_device_guard<R>;

  /// The constructor proper (the int only tells it from the public template).
  basic_cuda_ipc(any_bootstrap boot, int)
      : boot_(std::move(boot)), rank_(boot_.rank()), size_(boot_.size()), fence_("cgx::comm::cuda_ipc") {
    device_ = detail::current_device<R>("cgx::comm::cuda_ipc");
    if (!boot_.same_node())
      throw cgx::error(errc::communicator,
                       "cgx::comm::cuda_ipc: every rank must be on one node (CUDA IPC does not cross nodes); this "
                       "group of " + std::to_string(size_) + " ranks spans several");
    // The synchronization block, zeroed before any peer can read it (the allgather of
    // its handle below comes after the host waited for the copy).
    sync_ = basic_device_memory<R>(256);
    static constexpr std::uint32_t zeros[4] = {0, 0, 0, 0};  // epoch, ready, done, claim
    detail::cuda_check<R>(R::memcpy_async(sync_.get(), zeros, sizeof zeros, cudaMemcpyHostToDevice, nullptr),
                          "cgx::comm::cuda_ipc: cudaMemcpyAsync (synchronization block)");
    fault_ = basic_pinned_memory<R>(sizeof(detail::ipc_fault));
    *fault_get() = detail::ipc_fault{};
    detail::cuda_check<R>(R::stream_synchronize(nullptr), "cgx::comm::cuda_ipc: cudaStreamSynchronize");
    peer_sync_mem_ = open_peers(sync_.get(), "synchronization block");
    // The peers' blocks as one device array, read by the wait kernel (this rank's own in
    // its place: it is past its own posts in stream order).
    std::vector<const std::uint32_t*> blocks(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r)
      blocks[static_cast<std::size_t>(r)] =
          reinterpret_cast<const std::uint32_t*>(r == rank_ ? sync_.get() : peer_sync_mem_[static_cast<std::size_t>(r)]);
    peer_sync_ = basic_device_memory<R>(blocks.size() * sizeof(blocks[0]));
    detail::cuda_check<R>(R::memcpy_async(peer_sync_.get(), blocks.data(), blocks.size() * sizeof(blocks[0]),
                                          cudaMemcpyHostToDevice, nullptr),
                          "cgx::comm::cuda_ipc: cudaMemcpyAsync (peer blocks)");
    detail::cuda_check<R>(R::stream_synchronize(nullptr), "cgx::comm::cuda_ipc: cudaStreamSynchronize");
  }

  detail::ipc_fault* fault_get() const noexcept { return reinterpret_cast<detail::ipc_fault*>(fault_.get()); }

  /// Collective: exports `mine` (a device allocation of this rank), maps every peer's
  /// allocation of the same role and returns the mapped addresses (nullptr at this
  /// rank). Every rank throws together when any rank fails to map one.
  std::vector<std::byte*> open_peers(std::byte* mine, const char* what) {
    const int p = size_;
    cudaIpcMemHandle_t h{};
    detail::cuda_check<R>(R::ipc_get_mem_handle(&h, mine), "cgx::comm::cuda_ipc: cudaIpcGetMemHandle");
    struct info {
      cudaIpcMemHandle_t handle;
      int device;
    };
    info me{h, device_};
    std::vector<info> all(static_cast<std::size_t>(p));
    boot_.allgather(std::as_bytes(std::span<const info>(&me, 1)), std::as_writable_bytes(std::span<info>(all)));
    std::vector<std::byte*> mapped(static_cast<std::size_t>(p), nullptr);
    std::string failure;
    for (int r = 0; r < p && failure.empty(); ++r) {
      if (r == rank_) continue;
      void* ptr = nullptr;
      const auto& a = all[static_cast<std::size_t>(r)];
      const cudaError_t e = R::ipc_open_mem_handle(&ptr, a.handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        (void)R::get_last_error();
        failure = std::string("cudaIpcOpenMemHandle of rank ") + std::to_string(r) + "'s " + what + " (device " +
                  std::to_string(a.device) + ", this rank on device " + std::to_string(device_) +
                  ") failed: " + R::error_name(e) + " (" + R::error_string(e) +
                  "); CUDA IPC needs all ranks on one node, and GPUs that can reach each other (peer access)";
      } else {
        mapped[static_cast<std::size_t>(r)] = static_cast<std::byte*>(ptr);
      }
    }
    try {
      agree_or_throw(failure);
    } catch (...) {
      // Every rank throws here (agree_or_throw is collective): close what was mapped,
      // wait for the peers to have closed theirs, then let the members free the exports.
      close(mapped);
      try {
        boot_.barrier();
      } catch (const cgx::error&) {  // the bootstrap failed too: throw the first error
      }
      throw;
    }
    return mapped;
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

  /// Posts word `slot` of this rank's block behind the work on `stream`.
  void post(unsigned slot, cudaStream_t stream) {
    detail::cuda_check<R>(R::ipc_post(reinterpret_cast<std::uint32_t*>(sync_.get()), slot, stream),
                          "cgx::comm::cuda_ipc: the post kernel (launch)");
  }
  /// Makes `stream` wait until word `slot` of every peer's block reaches this rank's epoch.
  void wait_all(unsigned slot, cudaStream_t stream) {
    detail::cuda_check<R>(R::ipc_wait(reinterpret_cast<const std::uint32_t* const*>(peer_sync_.get()), size_,
                                      reinterpret_cast<std::uint32_t*>(sync_.get()), slot,
                                      limit_ms_ * 1000000u, fault_.get(), stream),
                          "cgx::comm::cuda_ipc: the wait kernel (launch)");
  }

  static void close(std::vector<std::byte*>& mapped) noexcept {
    for (auto& ptr : mapped) {
      if (ptr != nullptr) (void)R::ipc_close_mem_handle(ptr);
      ptr = nullptr;
    }
  }
  void close_peer_memory() noexcept { close(peer_mem_); }
  void close_peer_sync() noexcept { close(peer_sync_mem_); }

  any_bootstrap boot_;
  std::vector<std::byte> gathered_;  // max_all's gather buffer (argument checks, every call)
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::uint64_t limit_ms_ = 600000;  // the device waits' limit (set_wait_limit)
  basic_workspace_fence<R> fence_;
  basic_device_memory<R> sync_;        // this rank's synchronization block (exported)
  basic_device_memory<R> peer_sync_;   // the p blocks' addresses, for the wait kernel
  basic_pinned_memory<R> fault_;       // a detail::ipc_fault
  basic_device_memory<R> mem_;         // the workspace (exported)
  std::vector<std::byte*> peer_mem_;       // the peers' workspaces, mapped
  std::vector<std::byte*> peer_sync_mem_;  // the peers' synchronization blocks, mapped
};

/// CUDA IPC over the CUDA runtime (see basic_cuda_ipc).
using cuda_ipc = basic_cuda_ipc<cuda_runtime>;

}  // namespace cgx::comm
