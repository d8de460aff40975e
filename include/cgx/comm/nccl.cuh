#pragma once
/// \file nccl.cuh
/// `cgx::comm::nccl`: a device transport over NCCL point-to-point. Link `cgx::nccl`
/// (CMake), which adds NCCL to `cgx::cuda`; this header is not part of the umbrella
/// <cgx/cgx.cuh>, so that code without NCCL never needs nccl.h.
///
/// The communicator is bootstrapped over MPI: rank 0 calls ncclGetUniqueId, MPI_Bcast
/// hands the id to every rank, each calls ncclCommInitRank on the CUDA device current
/// at construction. An exchange posts every ncclSend/ncclRecv of it between
/// ncclGroupStart and ncclGroupEnd on the stream, then enqueues each receive's consumer
/// behind it: nothing waits on the host, the whole reduction is stream-ordered.
/// `native_allreduce` is ncclAllReduce (float, double, __half, __nv_bfloat16).
///
/// NCCL needs one GPU per rank: it refuses two ranks of one communicator on one device
/// ("Duplicate GPU detected"). To test several processes on one GPU use cuda_ipc.

#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../error.hpp"
#include "device_transport.cuh"
#include "mpi.hpp"

namespace cgx::comm {

namespace detail {
/// Throws cgx::error(errc::transport) with NCCL's text for `r` (and its last error).
inline void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  throw cgx::error(errc::transport, msg);
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
/// collective over the communicator. Move-only.
class nccl {
 public:
  /// Collective over `comm` (duplicated; it carries the bootstrap and argument checks).
  /// Throws cgx::error(errc::transport) when NCCL cannot create the communicator (for
  /// example two ranks on one GPU), on every rank that NCCL reports it to.
  explicit nccl(MPI_Comm comm) : x_(comm) {
    device_ = detail::current_device("cgx::comm::nccl");
    ncclUniqueId id{};
    if (x_.rank() == 0) detail::nccl_check(ncclGetUniqueId(&id), "cgx::comm::nccl: ncclGetUniqueId");
    detail::check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, x_.comm()), "cgx::comm::nccl: MPI_Bcast of the NCCL id");
    detail::nccl_check(ncclCommInitRank(&comm_, x_.size(), id, x_.rank()),
                       ("cgx::comm::nccl: ncclCommInitRank (rank " + std::to_string(x_.rank()) + " of " +
                        std::to_string(x_.size()) + " on device " + std::to_string(device_) +
                        "; NCCL needs a distinct GPU per rank)")
                           .c_str());
  }
  /// Takes over o's NCCL communicator and buffers; o holds none after.
  nccl(nccl&& o) noexcept
      : x_(std::move(o.x_)), device_(o.device_), comm_(std::exchange(o.comm_, nullptr)), mem_(std::move(o.mem_)) {}
  nccl& operator=(nccl&&) = delete;
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  /// Collective: destroys the NCCL communicator (after its pending work).
  ~nccl() {
    if (comm_ != nullptr) {
      (void)ncclCommFinalize(comm_);
      (void)ncclCommDestroy(comm_);
    }
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return x_.rank(); }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return x_.size(); }
  /// The NCCL communicator.
  [[nodiscard]] ncclComm_t comm() const noexcept { return comm_; }

  /// A device workspace of `bytes` bytes (cudaMalloc). Waits for the device before
  /// releasing a previous one.
  std::byte* reserve(std::size_t bytes) {
    if (mem_.get() != nullptr) detail::cuda_check(cudaDeviceSynchronize(), "cgx::comm::nccl: cudaDeviceSynchronize");
    mem_ = device_memory(bytes);
    return mem_.get();
  }

  /// Nothing to order: NCCL reads the sends in stream order.
  void prepare_send(cudaStream_t) noexcept {}

  /// Collective: every send and receive in one NCCL group on `stream`; then
  /// `arrived(i, workspace + recvs[i].offset)` for each receive, in order. Does not
  /// block the host.
  template <class F>
  void exchange(std::span<const device_message> sends, std::span<const device_message> recvs, cudaStream_t stream,
                F&& arrived) {
    if (sends.empty() && recvs.empty()) return;
    detail::nccl_check(ncclGroupStart(), "cgx::comm::nccl: ncclGroupStart", comm_);
    for (const auto& m : recvs)
      detail::nccl_check(ncclRecv(mem_.get() + m.offset, m.bytes, ncclUint8, m.peer, comm_, stream),
                         "cgx::comm::nccl: ncclRecv", comm_);
    for (const auto& m : sends)
      detail::nccl_check(ncclSend(mem_.get() + m.offset, m.bytes, ncclUint8, m.peer, comm_, stream),
                         "cgx::comm::nccl: ncclSend", comm_);
    detail::nccl_check(ncclGroupEnd(), "cgx::comm::nccl: ncclGroupEnd", comm_);
    for (std::size_t i = 0; i < recvs.size(); ++i)
      arrived(i, static_cast<const std::byte*>(mem_.get() + recvs[i].offset));
  }

  /// Collective: element-wise maximum over all ranks (host values, over MPI).
  void max_all(std::span<std::int64_t> v) { x_.max_all(v); }

  /// ncclAllReduce (sum, in place) of d_buf[0..n) on `stream`; does not block the host.
  template <class T>
    requires(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
             std::is_same_v<T, __nv_bfloat16>)
  void native_allreduce(T* d_buf, std::size_t n, cudaStream_t stream) {
    if (n == 0) return;
    detail::nccl_check(ncclAllReduce(d_buf, d_buf, n, detail::nccl_type<T>(), ncclSum, comm_, stream),
                       "cgx::comm::nccl: ncclAllReduce", comm_);
  }

 private:
  mpi x_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  device_memory mem_;
};

}  // namespace cgx::comm
