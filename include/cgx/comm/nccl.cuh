#pragma once
/// \file nccl.cuh
/// `cgx::comm::nccl`: a device transport over NCCL point-to-point. Link `cgx::nccl`
/// (CMake), which adds NCCL to `cgx::cuda`; this header is not part of the umbrella
/// <cgx/cgx.cuh>, so that code without NCCL never needs nccl.h.
///
/// The communicator is set up through a `bootstrap` (comm/bootstrap.hpp): rank 0 calls
/// ncclGetUniqueId, the bootstrap's allgather hands the id to every rank, each calls
/// ncclCommInitRank on the CUDA device current at construction. The bootstrap is an MPI
/// communicator (`nccl{MPI_COMM_WORLD}`, through comm::mpi_bootstrap, when <mpi.h> is
/// reachable) or, with no MPI at all, a comm::socket_bootstrap of processes made by
/// comm::run_forked; it also carries the plans' argument checks (max_all).
///
/// Every NCCL call goes through an API policy N (`nccl_api` forwards to NCCL) and every
/// CUDA runtime call through a runtime policy R (comm/runtime.cuh): `nccl` is
/// basic_nccl<cuda_runtime, nccl_api>; the tests also run it over a simulated runtime
/// and NCCL (tests/sim_runtime.hpp), with injected failures. An exchange posts every ncclSend/ncclRecv of it between
/// ncclGroupStart and ncclGroupEnd on the stream, then enqueues each receive's consumer
/// behind it: nothing waits on the host, the whole reduction is stream-ordered.
/// `native_allreduce` is ncclAllReduce (float, double, __half, __nv_bfloat16).
///
/// CUDA graphs: the device plans over it may be called while the stream captures a graph
/// (graph_capture below; device_plan.cuh says how replays advance the random keys).
///
/// NCCL needs one GPU per rank: it refuses two ranks of one communicator on one device
/// ("Duplicate GPU detected"). To test several processes on one GPU use cuda_ipc.
///
/// Ordering across streams: the transport's workspace_fence (device_transport.cuh) is
/// recorded on the stream at the end of every exchange (behind the consumers) and of
/// every native_allreduce; prepare_send, exchange and native_allreduce first make their
/// stream wait for it. A call on stream s2 therefore receives into no slot that the
/// previous call's decompress_add on s1 still reads, and compresses into no slot that
/// an s1 ncclSend still reads.
///
/// Errors. NCCL reports some failures only asynchronously (a peer's connection lost, a
/// remote error): its kernels then spin on the stream until the communicator is
/// aborted. So:
///  - every call first asks ncclCommGetAsyncError, and the host waits of this file
///    (reserve(), the destructor) poll it while they wait for the fence; an error
///    aborts the communicator (ncclCommAbort, which stops its kernels) and throws
///    cgx::error(errc::transport). NCCL's documentation: after an error nothing can be
///    assumed about the operations enqueued, and the communicator must be aborted.
///  - the send/receive group is closed on every path (an RAII guard calls ncclGroupEnd
///    when a ncclSend/ncclRecv inside it threw: NCCL then discards the group's operations
///    and returns the error; a group left open would swallow the next NCCL calls of the
///    thread).
///  - after any NCCL failure the transport refuses further calls (errc::transport).
///  - destruction: in the normal case every rank destroys its plan, collectively, and
///    the destructor waits for the fence, then ncclCommFinalize (collective: it flushes
///    the operations and synchronizes with the peers) and ncclCommDestroy. When the
///    destructor runs during stack unwinding (an exception thrown after construction,
///    possibly on this rank only) or after an NCCL failure, it calls ncclCommAbort
///    instead: local, it never waits for a peer (ncclCommFinalize would hang when the
///    peers are not destroying theirs), and it stops this rank's pending NCCL kernels, so
///    work still in flight from earlier calls is lost. The peers' operations with this
///    rank then fail (an asynchronous error they see) or wait until they abort too: an
///    application that continues after such an error should abort every rank's plan.

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../error.hpp"
#include "bootstrap.hpp"
#include "device_transport.cuh"
#include "runtime.cuh"
#if __has_include(<mpi.h>)
#include "mpi_bootstrap.hpp"  // an MPI_Comm is a bootstrap_source
#endif

namespace cgx::comm {

/// NCCL itself as the API policy of basic_nccl: each call forwards to the NCCL function
/// of the same name. Stateless.
struct nccl_api {
  /// ncclGetUniqueId.
  static ncclResult_t get_unique_id(ncclUniqueId* id) { return ncclGetUniqueId(id); }
  /// ncclCommInitRank.
  static ncclResult_t comm_init_rank(ncclComm_t* c, int n, ncclUniqueId id, int r) {
    return ncclCommInitRank(c, n, id, r);
  }
  /// ncclGroupStart.
  static ncclResult_t group_start() { return ncclGroupStart(); }
  /// ncclGroupEnd.
  static ncclResult_t group_end() { return ncclGroupEnd(); }
  /// ncclSend.
  static ncclResult_t send(const void* p, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    return ncclSend(p, n, t, peer, c, s);
  }
  /// ncclRecv.
  static ncclResult_t recv(void* p, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
    return ncclRecv(p, n, t, peer, c, s);
  }
  /// ncclAllReduce.
  static ncclResult_t all_reduce(const void* in, void* out, std::size_t n, ncclDataType_t t, ncclRedOp_t op,
                                 ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(in, out, n, t, op, c, s);
  }
  /// ncclCommGetAsyncError.
  static ncclResult_t comm_get_async_error(ncclComm_t c, ncclResult_t* r) { return ncclCommGetAsyncError(c, r); }
  /// ncclCommAbort.
  static ncclResult_t comm_abort(ncclComm_t c) { return ncclCommAbort(c); }
  /// ncclCommFinalize.
  static ncclResult_t comm_finalize(ncclComm_t c) { return ncclCommFinalize(c); }
  /// ncclCommDestroy.
  static ncclResult_t comm_destroy(ncclComm_t c) { return ncclCommDestroy(c); }
  /// ncclGetErrorString.
  static const char* get_error_string(ncclResult_t r) { return ncclGetErrorString(r); }
  /// ncclGetLastError.
  static const char* get_last_error(ncclComm_t c) { return ncclGetLastError(c); }
};

namespace detail {
/// "`what` failed: " NCCL's text for `r`, and its last error when it has one.
template <class N = nccl_api>
std::string nccl_message(ncclResult_t r, const char* what, ncclComm_t comm) {
  std::string msg = std::string(what) + " failed: " + N::get_error_string(r);
  const char* last = N::get_last_error(comm);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  return msg;
}

/// Throws cgx::error(errc::transport) with NCCL's text for `r` (and its last error).
template <class N = nccl_api>
void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r != ncclSuccess) throw cgx::error(errc::transport, nccl_message<N>(r, what, comm));
}

/// NCCL's data type for T.
template <class T>
constexpr ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, __half>) return ncclFloat16;
  else return ncclBfloat16;
}
}  // namespace detail

/// NCCL device transport (see the file comment). Construction and destruction are
/// collective over the communicator (destruction during stack unwinding is not: see
/// "Errors" in the file comment). Uses the CUDA device current at construction and makes
/// it current in each of its calls. Move-only. R: the CUDA runtime policy
/// (comm/runtime.cuh); N: the NCCL API policy (nccl_api).
template <class R, class N>
class basic_nccl {
 public:
  /// The runtime policy its CUDA calls go through.
  using runtime_type = R;
  /// A plan may call it while its stream captures a CUDA graph (graph_capture_v): every
  /// exchange is NCCL calls and kernels on the stream (NCCL supports capture), the fence
  /// becomes external event nodes, and no call waits on the host.
  static constexpr bool graph_capture = true;

  /// Collective over `source`: a bootstrap (comm::socket_bootstrap, comm::mpi_bootstrap,
  /// comm::any_bootstrap), taken over, or a bootstrap_source such as an MPI_Comm
  /// (duplicated, through comm::mpi_bootstrap). Throws cgx::error(errc::transport) when
  /// NCCL cannot create the communicator (for example two ranks on one GPU), on every
  /// rank that NCCL reports it to, or when the bootstrap fails.
  template <class S>
    requires(bootstrap<S> || bootstrap_source<S>)
  explicit basic_nccl(S source) : x_(to_bootstrap(std::move(source))), fence_("cgx::comm::nccl") {
    device_ = detail::current_device<R>("cgx::comm::nccl");
    const int p = x_.size();
    const int me = x_.rank();
    ncclUniqueId id{};
    if (me == 0) detail::nccl_check<N>(N::get_unique_id(&id), "cgx::comm::nccl: ncclGetUniqueId");
    std::vector<ncclUniqueId> all(static_cast<std::size_t>(p));
    x_.allgather(std::as_bytes(std::span<const ncclUniqueId>(&id, 1)), std::as_writable_bytes(std::span(all)));
    detail::nccl_check<N>(N::comm_init_rank(&comm_, p, all[0], me),
                          ("cgx::comm::nccl: ncclCommInitRank (rank " + std::to_string(me) + " of " +
                           std::to_string(p) + " on device " + std::to_string(device_) +
                           "; NCCL needs a distinct GPU per rank)")
                              .c_str());
  }
  /// Takes over o's NCCL communicator and buffers; o holds none after.
  basic_nccl(basic_nccl&& o) noexcept
      : x_(std::move(o.x_)),
        device_(o.device_),
        comm_(std::exchange(o.comm_, nullptr)),
        failed_(o.failed_),
        unwinding_at_start_(o.unwinding_at_start_),
        fence_(std::move(o.fence_)),
        mem_(std::move(o.mem_)) {}
  basic_nccl& operator=(basic_nccl&&) = delete;
  basic_nccl(const basic_nccl&) = delete;
  basic_nccl& operator=(const basic_nccl&) = delete;
  /// Collective in the normal case: waits for this transport's work (polling NCCL's
  /// asynchronous errors), then ncclCommFinalize and ncclCommDestroy. During stack
  /// unwinding, after an NCCL failure, or when an asynchronous error shows while it
  /// waits: ncclCommAbort (local; see "Errors" in the file comment).
  ~basic_nccl() {
    if (comm_ == nullptr) return;
    guard on(device_, std::nothrow);
    const bool unwinding = std::uncaught_exceptions() > unwinding_at_start_;
    if (!failed_ && !unwinding && quiesce()) {
      (void)N::comm_finalize(comm_);
      (void)N::comm_destroy(comm_);
    } else if (comm_ != nullptr) {  // (quiesce() aborts itself on an asynchronous error)
      (void)N::comm_abort(comm_);
    }
    comm_ = nullptr;
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return x_.rank(); }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return x_.size(); }
  /// The CUDA device this rank uses.
  [[nodiscard]] int device() const noexcept { return device_; }
  /// The NCCL communicator (nullptr once aborted after an error).
  [[nodiscard]] ncclComm_t comm() const noexcept { return comm_; }

  /// A device workspace of `bytes` bytes (cudaMalloc). Before releasing a previous one,
  /// waits for the work that uses it (the fence), polling NCCL's asynchronous errors.
  std::byte* reserve(std::size_t bytes) {
    guard on(device_);
    check_alive();
    if (mem_.get() != nullptr) wait_for_fence();
    mem_ = basic_device_memory<R>(bytes);
    return mem_.get();
  }

  /// Orders the caller's coming writes to the workspace after the previous exchange's
  /// work, whatever its stream (the fence). NCCL reads the sends in stream order.
  void prepare_send(cudaStream_t stream) {
    guard on(device_);
    check_alive();
    fence_.order(stream);
  }

  /// Records the workspace fence behind the work enqueued on `stream` so far; no host wait.
  void fence(cudaStream_t stream) {
    guard on(device_);
    check_alive();
    fence_.record(stream);
  }

  /// Collective: every send and receive in one NCCL group on `stream`; then
  /// `arrived(i, workspace + recvs[i].offset)` for each receive, in order, then the
  /// fence. Does not block the host.
  template <class F>
  void exchange(std::span<const device_message> sends, std::span<const device_message> recvs, cudaStream_t stream,
                F&& arrived) {
    if (sends.empty() && recvs.empty()) return;
    guard on(device_);
    check_alive();
    fence_.order(stream);
    {
      group g(*this);
      for (const auto& m : recvs)
        call(N::recv(mem_.get() + m.offset, m.bytes, ncclUint8, m.peer, comm_, stream), "cgx::comm::nccl: ncclRecv");
      for (const auto& m : sends)
        call(N::send(mem_.get() + m.offset, m.bytes, ncclUint8, m.peer, comm_, stream), "cgx::comm::nccl: ncclSend");
      g.end();
    }
    for (std::size_t i = 0; i < recvs.size(); ++i)
      arrived(i, static_cast<const std::byte*>(mem_.get() + recvs[i].offset));
    fence_.record(stream);
  }

  /// Collective: element-wise maximum over all ranks (host values, over the bootstrap).
  void max_all(std::span<std::int64_t> v) { comm::max_all(x_, v, gathered_); }

  /// ncclAllReduce (sum, in place) of d_buf[0..n) on `stream`; does not block the host.
  template <class T>
    requires(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
             std::is_same_v<T, __nv_bfloat16>)
  void native_allreduce(T* d_buf, std::size_t n, cudaStream_t stream) {
    if (n == 0) return;
    guard on(device_);
    check_alive();
    fence_.order(stream);
    call(N::all_reduce(d_buf, d_buf, n, detail::nccl_type<T>(), ncclSum, comm_, stream),
         "cgx::comm::nccl: ncclAllReduce");
    fence_.record(stream);
  }

 private:
  /// ncclGroupStart on construction; ncclGroupEnd on destruction when end() was not
  /// reached (a call inside the group threw: NCCL discards the group's operations).
  class group {
   public:
    explicit group(basic_nccl& x) : x_(x) { x_.call(N::group_start(), "cgx::comm::nccl: ncclGroupStart"); }
    group(const group&) = delete;
    group& operator=(const group&) = delete;
    /// Ends the group: NCCL enqueues its operations on the stream.
    void end() {
      open_ = false;
      x_.call(N::group_end(), "cgx::comm::nccl: ncclGroupEnd");
    }
    ~group() {
      if (open_) (void)N::group_end();
    }

   private:
    basic_nccl& x_;
    bool open_ = true;
  };

  /// Throws (and marks the transport failed) when an NCCL call returned an error.
  void call(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    failed_ = true;
    detail::nccl_check<N>(r, what, comm_);
  }

  /// Throws when the communicator was aborted, when an NCCL call of this transport failed
  /// before, or when NCCL reports an asynchronous error (which aborts it).
  void check_alive() {
    if (comm_ == nullptr)
      throw cgx::error(errc::transport, "cgx::comm::nccl: the NCCL communicator was aborted after an error");
    if (failed_)
      throw cgx::error(errc::transport,
                       "cgx::comm::nccl: an NCCL call of this transport failed before; its communicator is unusable "
                       "(destroy the plan: it aborts the communicator)");
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = N::comm_get_async_error(comm_, &async);
    if (r != ncclSuccess) async = r;
    if (async != ncclSuccess && async != ncclInProgress) abort_and_throw(async);
  }

  [[noreturn]] void abort_and_throw(ncclResult_t async) {
    failed_ = true;
    const std::string msg =
        detail::nccl_message<N>(async, "cgx::comm::nccl: an earlier NCCL operation (asynchronous error)", comm_);
    (void)N::comm_abort(comm_);
    comm_ = nullptr;
    throw cgx::error(errc::transport, msg + "; the communicator was aborted");
  }

  /// Blocks until the work before the fence is done; throws (after aborting) on an
  /// asynchronous NCCL error seen meanwhile.
  void wait_for_fence() {
    check_alive();
    detail::poll_until([&] {
      if (fence_.ready()) return true;
      check_alive();
      return false;
    });
  }

  /// wait_for_fence() for the destructor: false on any error (then the caller aborts).
  bool quiesce() noexcept {
    try {
      wait_for_fence();
      return true;
    } catch (...) {
      return false;
    }
  }

  using guard = detail::basic_device_guard<R>;

  any_bootstrap x_;
  std::vector<std::byte> gathered_;  // max_all's gather buffer (argument checks, every call)
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  bool failed_ = false;                                // an NCCL call failed: abort on destruction
  int unwinding_at_start_ = std::uncaught_exceptions();  // > this in the destructor: unwinding
  basic_workspace_fence<R> fence_;
  basic_device_memory<R> mem_;
};

/// The NCCL transport over the CUDA runtime and NCCL (see basic_nccl).
using nccl = basic_nccl<cuda_runtime, nccl_api>;

}  // namespace cgx::comm
