#pragma once
/// \file reduce_scatter_plan.hpp
/// `cgx::reduce_scatter_plan<T, Q, X>`: a compressed sum over all ranks of which each
/// rank keeps only its own chunk, the first two phases of the SRA allreduce.
///
/// Chunks: the buffer of n values is cut as comm::scatter_reduce_allgather cuts it, at
/// bucket boundaries (single values for quant::none), balanced to within one bucket:
/// rank r gets `chunk_of(n, p, r)` (some chunks are empty when n has fewer buckets than
/// there are ranks; counts need not be divisible by p). Every rank passes the whole
/// buffer of n values.
///
/// Result: buf[chunk_of(n, p, rank)] holds, bit for bit, what
/// allreduce_plan<T, Q, scatter_reduce_allgather, X> (running its schedule, i.e. with
/// native_below_bytes = 0, and the same seed and call counter) leaves there: the owner's
/// decoded, re-quantized sum, with the error bound stated in scatter_reduce_allgather.hpp.
/// The values of buf outside the rank's chunk are left as they were. On one rank the
/// buffer is left as it is (the exact sum).

#include <cstddef>
#include <span>

#include "comm/chunking.hpp"
#include "comm/scatter_reduce_allgather.hpp"
#include "plan_common.hpp"
#include "quant/host_exec.hpp"

namespace cgx {

/// Compressed reduce-scatter (sum) of up to `max_count` values of T (see the file comment).
/// T, Q, X: see collective_plan. Every rank of the transport constructs the plan and
/// makes every call, in the same order.
template <class T, class Q, class X>
class reduce_scatter_plan : public collective_plan<reduce_scatter_plan<T, Q, X>, T, Q, X> {
 public:
  /// The plan's name in error messages.
  static constexpr const char* name = "reduce_scatter_plan";

  /// Bytes of workspace a plan for `max_count` values on `ranks` ranks needs.
  /// Throws cgx::error(errc::invalid_argument) if that size overflows std::size_t.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    return detail::sized(name, max_count, ranks, [&] { return schedule_type::workspace_bytes(max_count, ranks); });
  }

  /// The values [begin, begin + count) that rank r of p receives for a buffer of n.
  static comm::chunk chunk_of(std::size_t n, int p, int r) { return schedule_type::chunk_of(n, p, r); }

  /// Collective constructors: with an owned or the caller's workspace (see collective_plan).
  using reduce_scatter_plan::collective_plan::collective_plan;

  /// Sums buf[0..n) over all ranks and leaves this rank's chunk of the sum in
  /// buf[chunk_of(n, size(), rank())]. Collective: every rank calls it with the same n.
  /// Throws cgx::error, leaving buf untouched, for a null buf with n > 0, n above
  /// max_count(), or (collective checking) counts or plan types that differ between ranks;
  /// errc::invalid_argument at once, before any communication, when another thread is in
  /// a call of this plan.
  void operator()(T* buf, std::size_t n) {
    const auto claimed = this->claim();
    this->begin_call(claimed, buf == nullptr, n, signature());
    sched_.scatter_reduce(buf, n, this->x_, this->ws_.data(), this->next_rng(), quant::host_exec{this->opts_.threads});
    claimed.finish();
  }

  /// This rank's chunk for a buffer of n values.
  comm::chunk my_chunk(std::size_t n) const { return chunk_of(n, this->x_.size(), this->x_.rank()); }

 private:
  using schedule_type = typename comm::scatter_reduce_allgather::template schedule<T, Q, X>;
  static std::int64_t signature() { return detail::plan_signature<T, Q>("reduce_scatter").value(); }

  schedule_type sched_{this->x_};
};

}  // namespace cgx
