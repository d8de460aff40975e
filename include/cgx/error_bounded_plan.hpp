#pragma once
/// \file error_bounded_plan.hpp
/// `cgx::error_bounded_plan<T, Q, R, X>`: an allreduce (sum, in place) with a guarantee
/// on the final result: for a bound E given per call,
///
///     |result_i - sum_r x_r,i| <= E     for every element i, on every rank,
///
/// up to the rounding of the sum itself (stated in comm/error_bounded_schedules.hpp:
/// the double rounding of p - 1 additions, ~1e-16 relative, and the rounding of the
/// result to T where E / p is below half an ulp of T there). Every rank ends with the
/// same bits.
///
/// The plan splits E over the quantizations of R's schedule: R's error-bounded schedule
/// says how many quantization errors reach an element (`error_terms(p)`, p for both SRA
/// and ring) and each quantization gets E / error_terms(p). The quantizer
/// (quant::error_bounded) then picks each bucket's width so that each decoded value is
/// within that share, checked in floating point as decoded.
///
/// Supported reducers: comm::scatter_reduce_allgather and comm::ring. comm::tree and
/// comm::hierarchical are rejected at compile time. Transports: comm::mpi, comm::shm.
///
/// By default (plan_options::native_below_bytes = auto_threshold) the plan chooses per
/// size class between its compressed schedule and MPI_Allreduce by timing both on its own
/// calls, as allreduce_plan does (see path_for()); the data's compressibility counts too.
/// With static_threshold it hands every call to MPI_Allreduce on one node
/// (error_bounded_native_below_bytes_one_node: over shared memory the codec's compute
/// cost more than the bytes it saved at every size measured) and compresses from
/// default_native_below_bytes (64 KiB) across nodes. An explicit threshold (0: always
/// compress) is used as given.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "comm/error_bounded_schedules.hpp"
#include "concepts.hpp"
#include "detail/path_choice.hpp"
#include "plan_common.hpp"

namespace cgx {

/// The native-allreduce threshold an error_bounded_plan picks (for static_threshold) when
/// all its ranks share one node: larger than any message, so every call goes to the
/// transport's exact native allreduce (MPI_Allreduce). Over shared memory, 4 ranks,
/// 4096 x 4096 floats, the error-bounded allreduce ran at 0.31-0.50x MPI_Allreduce's
/// speed (issue 20), and the codec is compute-bound below shared memory's bandwidth at
/// every size (docs/results/README.md, "Error-bounded allreduce on smooth and rough fields").
inline constexpr std::size_t error_bounded_native_below_bytes_one_node = std::numeric_limits<std::size_t>::max() - 1;

/// What one call of an error_bounded_plan sent, on this rank.
struct error_bounded_stats {
  std::size_t bytes_sent = 0;  ///< bytes this rank sent: compressed payloads plus 8-byte length headers
  std::size_t raw_bytes = 0;   ///< bytes the same schedule would send uncompressed
  double bound = 0;            ///< the bound asked for the result (E)
  double step_bound = 0;       ///< the bound given to each quantization (E / error_terms(p))
  bool native = false;         ///< true if the call went through the transport's exact native allreduce
  /// raw_bytes / bytes_sent (1 when nothing was sent).
  [[nodiscard]] double ratio() const noexcept {
    return bytes_sent == 0 ? 1.0 : static_cast<double>(raw_bytes) / static_cast<double>(bytes_sent);
  }
};

/// Error-bounded compressed allreduce (sum, in place) of up to `max_count` values of T
/// (see the file comment).
///
/// \tparam T  float or double
/// \tparam Q  a variable-size error-bounded quantizer: quant::error_bounded<Bucket, Prediction>
/// \tparam R  comm::scatter_reduce_allgather or comm::ring
/// \tparam X  transport: comm::mpi or comm::shm
///
/// Construction and every call are collective: every rank of the transport must make
/// them, in the same order.
template <class T, class Q, class R, class X>
class error_bounded_plan : public plan_core<X> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cgx::error_bounded_plan: T must be float or double");
  static_assert(requires { requires Q::variable_size; },
                "cgx::error_bounded_plan: Q must be an error-bounded quantizer (cgx::quant::error_bounded<Bucket>); "
                "fixed-size quantizers such as maxmin go through cgx::allreduce_plan");
  static_assert(comm::error_bounded_schedule<R>::supported,
                "cgx::error_bounded_plan: R must be cgx::comm::scatter_reduce_allgather or cgx::comm::ring; the "
                "error-bounded mode does not support the other reducers (tree, hierarchical)");
  static_assert(transport<X>, "cgx::error_bounded_plan: X must be a transport (cgx::comm::mpi or cgx::comm::shm)");

  using traits = comm::error_bounded_schedule<R>;
  using schedule_type = typename traits::template schedule<T, Q, X>;
  using base = plan_core<X>;

 public:
  using value_type = T;          ///< the element type of the buffers
  using quantizer_type = Q;      ///< the quantizer (codec) on the wire
  using reducer_type = R;        ///< the reducer (schedule)
  using transport_type = X;      ///< the transport

  /// Quantization errors that reach an element of the result on p ranks.
  static constexpr int error_terms(int p) { return traits::error_terms(p); }

  /// The bound each quantization gets when the result must be within `bound` on p ranks.
  static double step_bound(double bound, int p) { return p > 1 ? bound / error_terms(p) : bound; }

  /// Bytes of workspace a plan for `max_count` values on `ranks` ranks needs.
  /// Throws cgx::error(errc::invalid_argument) if that size overflows std::size_t.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    return detail::sized("error_bounded_plan", max_count, ranks, [&] { return schedule_type::workspace_bytes(max_count, ranks); });
  }

  /// Collective. Allocates workspace_bytes(max_count, transport.size()) bytes, and picks
  /// the native-allreduce threshold (see native_below_bytes()).
  error_bounded_plan(X transport, std::size_t max_count, plan_options opts = {})
      : base(std::move(transport), max_count, opts, "error_bounded_plan"),
        native_below_(resolve_native_below(this->x_, opts.native_below_bytes)),
        sched_(this->x_) {
    this->own_workspace(workspace_bytes(max_count, this->x_.size()));
  }

  /// Collective. Uses the caller's workspace (at least workspace_bytes(max_count,
  /// transport.size()) bytes, outliving the plan); throws cgx::error(errc::workspace) if smaller.
  error_bounded_plan(X transport, std::size_t max_count, std::span<std::byte> workspace, plan_options opts = {})
      : base(std::move(transport), max_count, opts, "error_bounded_plan"),
        native_below_(resolve_native_below(this->x_, opts.native_below_bytes)),
        sched_(this->x_) {
    this->use_workspace(workspace, workspace_bytes(max_count, this->x_.size()));
  }

  /// Sums buf[0..n) over all ranks, in place, blocking, so that every element of the
  /// result is within `bound` (absolute, > 0) of the exact sum. Collective: every rank
  /// calls it with the same n and bound. Throws cgx::error(errc::invalid_argument),
  /// leaving buf untouched, for a null buf with n > 0, n above max_count(), or a bound
  /// that is not a finite positive number; with collective checking also (errc::mismatch)
  /// for counts, bounds or plan types that differ between ranks, on every rank.
  /// Messages under native_below_bytes() go through the transport's exact native
  /// allreduce (which meets any bound). Throws errc::invalid_argument at once, before any
  /// communication, when another thread is in a call of this plan.
  void operator()(T* buf, std::size_t n, double bound) {
    const auto claimed = this->claim();
    const bool bad_bound = !(bound > 0) || !std::isfinite(bound);
    detail::signature_hash h = detail::plan_signature<T, Q>(R::name);
    std::uint64_t bits = 0;
    std::memcpy(&bits, &bound, sizeof(bits));
    h.mix(bits);
    h.mix(native_below_);
    this->begin_call(claimed, buf == nullptr, n, h.value(), bad_bound,
                     [&] { return "the bound " + std::to_string(bound) + " is not a finite positive number"; });
    const int p = this->x_.size();
    stats_ = {};
    stats_.bound = bound;
    stats_.step_bound = step_bound(bound, p);
    X& x = this->x_;
    comm::error_bounded_traffic t{};
    auto compressed = [&] { t = sched_.run(buf, n, x, this->ws_.data(), stats_.step_bound); };
    if constexpr (has_native) {
      auto native = [&] { x.native_allreduce(buf, n); };
      const std::size_t bytes = n * sizeof(T);
      if (native_below_ == auto_threshold)
        stats_.native = !detail::run_chosen(choice_, x, bytes, native, compressed);
      else if ((stats_.native = bytes < native_below_))
        native();
      else
        compressed();
    } else {
      compressed();
    }
    stats_.bytes_sent = t.sent;
    stats_.raw_bytes = t.raw;
    claimed.finish();
  }

  /// What the last call sent, on this rank.
  [[nodiscard]] const error_bounded_stats& last_stats() const noexcept { return stats_; }

  /// The native-allreduce threshold in use: plan_options::native_below_bytes, or the
  /// plan's pick for static_threshold (error_bounded_native_below_bytes_one_node when the
  /// transport's single_node() is true, default_native_below_bytes otherwise);
  /// auto_threshold when the path is measured per size class (see path_for()).
  [[nodiscard]] std::size_t native_below_bytes() const noexcept { return native_below_; }

  /// What the measured choice (auto_threshold) knows of calls of `bytes` bytes (see
  /// allreduce_plan::path_for); with a fixed threshold, the pick it makes.
  [[nodiscard]] path_pick path_for(std::size_t bytes) const noexcept {
    if (native_below_ == auto_threshold) return choice_.pick_for(bytes);
    path_pick p;
    p.measured = true;
    p.compressed = !(has_native && bytes < native_below_);
    return p;
  }

 private:
  static constexpr bool has_native = requires(X& x, T* b, std::size_t n) { x.native_allreduce(b, n); };

  /// The threshold a plan over transport `x` uses when asked for `requested` bytes: as
  /// detail::resolve_native_below (the same question to the transport, collective where
  /// X has single_node()), but error_bounded_native_below_bytes_one_node on one node.
  static std::size_t resolve_native_below(X& x, std::size_t requested) {
    bool one_node = false;
    if constexpr (requires { { x.single_node() } -> std::convertible_to<bool>; }) one_node = x.single_node();
    if (requested == auto_threshold && has_native) return auto_threshold;
    if (requested != auto_threshold && requested != static_threshold) return requested;
    return one_node ? error_bounded_native_below_bytes_one_node : default_native_below_bytes;
  }

  std::size_t native_below_;
  detail::path_choice choice_;  // auto_threshold: the measured pick per size class
  schedule_type sched_;
  error_bounded_stats stats_;
};

}  // namespace cgx
