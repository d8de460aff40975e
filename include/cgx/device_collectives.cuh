#pragma once
/// \file device_collectives.cuh
/// `cgx::device_reduce_scatter_plan<T, Q, X>` and `cgx::device_allgather_plan<T, Q, X>`:
/// the compressed reduce-scatter and allgather of device buffers, what sharded training
/// (FSDP, ZeRO) runs on its gradients and parameters.
///
/// ```cpp
/// #include <cgx/cgx.cuh>
/// using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
/// using X = cgx::comm::nccl;                            // or cgx::comm::cuda_ipc, cgx::comm::mpi
/// cgx::device_reduce_scatter_plan<float, Q, X> rs{X{MPI_COMM_WORLD}, n};
/// rs(d_grad, n, stream);                                // d_grad[rs.my_chunk(n)] holds the sum
/// cgx::device_allgather_plan<float, Q, X> ag{X{MPI_COMM_WORLD}, shard};
/// ag(d_shard, shard, d_full, stream);                   // d_full[r * shard ...]: rank r's shard
/// ```
///
/// Both run over the one device executor and every device transport the allreduce
/// plan runs over (comm::mpi through comm::mpi_device, comm::cuda_ipc, comm::nccl, any
/// host transport staged), stream-ordered as device_allreduce_plan is (device_plan.cuh:
/// what blocks the host depends on the transport), for float, double, __half and
/// __nv_bfloat16, and give, for float and double, the bits of the host plans
/// (reduce_scatter_plan.hpp, allgather_plan.hpp) with the same seed and call counter:
///  - reduce-scatter: the scatter-reduce phase of device SRA. Rank r's chunk
///    `chunk_of(n, p, r)` (the host plan's and device SRA's: bucket boundaries, balanced)
///    receives the owner's decoded, re-quantized sum, which is also what
///    device_allreduce_plan<T, Q, scatter_reduce_allgather, X> leaves there; the rest of
///    the buffer is left as it was. Traffic per rank: (p - 1) compressed chunks each way.
///  - allgather: rank r compresses its block once (random stream r) and sends the same
///    bytes to every peer; every rank, r included, decodes every block from those bytes,
///    so every rank ends with the same bits. Error per value: one quantization.
/// They have no native (uncompressed) path: a caller that wants an uncompressed
/// collective calls its transport's.
///
/// Workspace: two halves, used by calls in turn (even calls the first, odd the second).
/// Each call makes one exchange, and comm::cuda_ipc lets a rank overwrite only bytes
/// that its peers read in the exchange *before the previous one* (cuda_ipc.cuh: the
/// peers' `done` of the previous exchange may not be recorded yet when the next call
/// starts); with halves in turn, a call writes only what the call before the previous
/// one exposed. The other transports would not need it; all use it (same bytes, same
/// bits, twice the compressed size of workspace).

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "device_plan.cuh"
#include "detail/checked.hpp"

namespace cgx {

/// Compressed reduce-scatter (sum) of up to `max_count` values of T in device memory
/// (see the file comment). Every rank passes the whole buffer of n values and keeps its
/// chunk of the sum.
template <class T, class Q, class X>
class device_reduce_scatter_plan : public device_plan_core<T, Q, X> {
  using core = device_plan_core<T, Q, X>;
  using schedule_type = comm::device_sra<T, Q, typename core::device_transport_type>;
  static_assert(requires(typename core::device_transport_type& x, cudaStream_t s) { x.fence(s); },
                "cgx::device_reduce_scatter_plan: the device transport needs fence(stream) (device_transport.cuh)");

 public:
  /// Bytes of device workspace for up to `max_count` values on `ranks` ranks: two
  /// halves of device SRA's (see the file comment). Throws cgx::error(errc::invalid_argument)
  /// when that overflows std::size_t.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    detail::check_raw_bytes(max_count, sizeof(T));
    return detail::checked_mul(2, schedule_type::workspace_bytes(max_count, ranks));
  }

  /// The values [begin, begin + count) that rank r of p keeps for a buffer of n: those
  /// of reduce_scatter_plan::chunk_of.
  static comm::chunk chunk_of(std::size_t n, int p, int r) { return schedule_type::chunk_of(n, p, r); }

  /// Collective. Takes the transport (comm::mpi becomes comm::mpi_device) and has it
  /// allocate the device workspace on the CUDA device current now.
  device_reduce_scatter_plan(X transport, std::size_t max_count, plan_options opts = {})
      : core(std::move(transport), max_count, opts, &workspace_bytes) {}

  /// Sums d_buf[0..n) over all ranks and leaves this rank's chunk of the sum in
  /// d_buf[my_chunk(n)], in `stream` order. Collective: every rank calls it with the
  /// same n. Throws cgx::error, leaving d_buf untouched, for a null d_buf with n > 0, a
  /// pointer that is not device memory, n above max_count(), or (collective checking)
  /// counts or plan types that differ between ranks; errc::cuda / errc::transport when
  /// CUDA, MPI or NCCL fail; errc::invalid_argument at once when another thread is in a
  /// call of this plan, and before anything is enqueued when `stream` captures a CUDA
  /// graph (not capturable yet: device_plan.cuh, "CUDA graphs").
  void operator()(T* d_buf, std::size_t n, cudaStream_t stream = nullptr) {
    const detail::call_guard claimed(this->busy_, "device_reduce_scatter_plan");
    detail::raise_device_failure(this->x_);
    typename core::device_guard on;
    this->on_device(on);
    this->check("device_reduce_scatter_plan", sig_, d_buf == nullptr, n,
                detail::not_device_memory<typename core::runtime>(d_buf, n), "reduce_scatter_plan",
                core::capture_refusal(core::capturing(stream), false));
    const std::size_t half = (this->calls_ % 2) * schedule_type::workspace_bytes(this->sized_count_, this->x_.size());
    sched_.run(d_buf, n, this->sized_count_, this->x_, this->ws_, this->next_rng(), stream, /*gather=*/false, half);
  }

  /// This rank's chunk for a buffer of n values.
  comm::chunk my_chunk(std::size_t n) { return chunk_of(n, this->x_.size(), this->x_.rank()); }

 private:
  std::int64_t sig_ = detail::device_signature<T, Q>("reduce_scatter", 0);
  schedule_type sched_;
};

/// Compressed allgather of blocks of up to `max_count` values of T per rank in device
/// memory (see the file comment).
template <class T, class Q, class X>
class device_allgather_plan : public device_plan_core<T, Q, X> {
  using core = device_plan_core<T, Q, X>;
  using D = typename core::kernels;

 public:
  /// Bytes of device workspace for blocks of up to `max_count` values on `ranks` ranks:
  /// two halves (see the file comment) of one compressed block per rank. Throws
  /// cgx::error(errc::invalid_argument) when that overflows std::size_t.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    if (ranks < 2) return 0;
    detail::check_raw_bytes(max_count, sizeof(T));
    return detail::checked_mul(2 * static_cast<std::size_t>(ranks), slot_bytes(max_count));
  }

  /// Collective. Takes the transport (comm::mpi becomes comm::mpi_device) and has it
  /// allocate the device workspace on the CUDA device current now.
  device_allgather_plan(X transport, std::size_t max_count, plan_options opts = {})
      : core(std::move(transport), max_count, opts, &workspace_bytes) {}

  /// Gathers every rank's block d_in[0..count) into d_out[r count .. (r + 1) count) for
  /// r = 0..p-1, in `stream` order. d_in may be d_out + rank() * count (in place);
  /// otherwise the two must not overlap. Collective: every rank calls it with the same
  /// count. Throws cgx::error, leaving d_out untouched, for a null d_in or d_out with
  /// count > 0, a pointer that is not device memory, count above max_count(), or
  /// (collective checking) counts or plan types that differ between ranks;
  /// errc::cuda / errc::transport when CUDA, MPI or NCCL fail; errc::invalid_argument
  /// at once when another thread is in a call of this plan, and before anything is
  /// enqueued when `stream` captures a CUDA graph (not capturable yet).
  void operator()(const T* d_in, std::size_t count, T* d_out, cudaStream_t stream = nullptr) {
    const detail::call_guard claimed(this->busy_, "device_allgather_plan");
    detail::raise_device_failure(this->x_);
    typename core::device_guard on;
    this->on_device(on);
    using RT = typename core::runtime;
    this->check("device_allgather_plan", sig_, d_in == nullptr || d_out == nullptr, count,
                detail::not_device_memory<RT>(d_in, count) || detail::not_device_memory<RT>(d_out, count),
                "allgather_plan", core::capture_refusal(core::capturing(stream), false));
    auto& x = this->x_;
    const int p = x.size();
    const int me = x.rank();
    const std::size_t first = (this->calls_ % 2) * static_cast<std::size_t>(p);  // this call's half
    quant::rng_state rng = this->next_rng();
    if (count == 0) return;
    T* own = d_out + static_cast<std::size_t>(me) * count;
    if (p == 1) {
      if (own != d_in)
        comm::detail::cuda_check<RT>(RT::memcpy_async(own, d_in, count * sizeof(T), cudaMemcpyDeviceToDevice, stream),
                                     "cgx::device_allgather_plan: cudaMemcpyAsync");
      return;
    }
    const std::size_t bytes = D::template compressed_bytes<T>(count);
    const std::size_t slot = slot_bytes(this->sized_count_);
    const auto at = [&](int r) { return (first + static_cast<std::size_t>(r)) * slot; };
    // Rank me's bytes in its slot me (of this call's half): the only slot a rank writes,
    // and the one every peer reads (from this rank's workspace, over CUDA IPC) or
    // receives into its own slot me; so the messages pair up as the transport contract asks.
    x.prepare_send(stream);
    rng.stream = static_cast<std::uint32_t>(me);
    D::template compress<T>(d_in, count, this->ws_ + at(me), rng, stream);
    // The owner's block from its own bytes, like every peer's (in place, d_in was read
    // by the compress before). Enqueued before the exchange, so that the transport's
    // workspace fence, recorded at its end, orders the next call's writes of slot me
    // after this read too, whatever stream that call comes on.
    D::template decompress<T>(this->ws_ + at(me), count, own, stream);
    sends_.clear();
    recvs_.clear();
    for (int s = 1; s < p; ++s) sends_.push_back(comm::device_msg((me + s) % p, at(me), at(me), bytes));
    for (int s = 1; s < p; ++s) {
      const int o = (me + p - s) % p;
      recvs_.push_back(comm::device_msg(o, at(o), at(o), bytes));
    }
    x.exchange(std::span<const comm::device_message>(sends_), std::span<const comm::device_message>(recvs_), stream,
               [&](std::size_t i, const std::byte* in) {
                 D::template decompress<T>(in, count, d_out + static_cast<std::size_t>(recvs_[i].peer) * count, stream);
               });
  }

 private:
  static std::size_t slot_bytes(std::size_t max_count) {
    return comm::round_to_line(D::template compressed_bytes<T>(max_count));
  }

  std::int64_t sig_ = detail::device_signature<T, Q>("allgather", 0);
  std::vector<comm::device_message> sends_;
  std::vector<comm::device_message> recvs_;
};

}  // namespace cgx
