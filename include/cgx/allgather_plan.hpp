#pragma once
/// \file allgather_plan.hpp
/// `cgx::allgather_plan<T, Q, X>`: every rank contributes a block of `count` values and
/// every rank receives all p blocks, compressed on the wire.
///
/// Rank r compresses its block once (stochastic rounding stream r) and sends the same
/// bytes to every other rank; every rank, r included, decodes block r from those bytes,
/// so all ranks end with the same bits for every block (the owner's block too is
/// replaced by its decoded form). Error per value: one quantization (maxmin: unit/2
/// nearest, < unit stochastic, of the block's bucket); exact with quant::none and on
/// one rank. Traffic per rank: (p - 1) compressed blocks sent, (p - 1) received.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "comm/chunking.hpp"
#include "plan_common.hpp"
#include "quant/host_exec.hpp"
#include "detail/tags.hpp"

namespace cgx {

/// Compressed allgather of blocks of up to `max_count` values of T per rank (see the
/// file comment).
/// T, Q and X as for every collective_plan; construction and every call are collective.
template <class T, class Q, class X>
class allgather_plan : public collective_plan<allgather_plan<T, Q, X>, T, Q, X> {
 public:
  /// The plan's name in error messages.
  static constexpr const char* name = "allgather_plan";

  /// Bytes of workspace for blocks of up to `max_count` values on `ranks` ranks.
  /// Throws cgx::error(errc::invalid_argument) if that size overflows std::size_t.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    return detail::sized(name, max_count, ranks, [&] {
      detail::check_raw_bytes(max_count, sizeof(T));
      return detail::checked_mul(static_cast<std::size_t>(ranks), comm::round_to_line(Q::template compressed_bytes<T>(max_count)));
    });
  }

  /// Collective constructors: with an owned or the caller's workspace (see collective_plan).
  using allgather_plan::collective_plan::collective_plan;

  /// Gathers every rank's block in[0..count) into out[r count .. (r + 1) count) for
  /// r = 0..p-1. `in` may be `out + rank() * count` (in place); otherwise the two must
  /// not overlap. Collective: every rank calls it with the same count. Throws
  /// cgx::error, leaving out untouched, for a null in or out with count > 0, count above
  /// max_count(), or (collective checking) counts or plan types that differ between ranks;
  /// errc::invalid_argument at once, before any communication, when another thread is in
  /// a call of this plan.
  void operator()(const T* in, std::size_t count, T* out) {
    const auto claimed = this->claim();
    this->begin_call(claimed, in == nullptr || out == nullptr, count, signature());
    const int p = this->x_.size();
    const int me = this->x_.rank();
    const quant::rng_state rng0 = this->next_rng();
    if (count == 0) return;
    T* own = out + static_cast<std::size_t>(me) * count;
    if (p == 1) {
      if (own != in) std::memmove(own, in, count * sizeof(T));
      return;
    }
    const std::size_t bytes = Q::template compressed_bytes<T>(count);
    const std::size_t slot = comm::round_to_line(bytes);
    auto wslot = [&](int r) { return this->ws_.data() + static_cast<std::size_t>(r) * slot; };
    const quant::host_exec ex{this->opts_.threads};
    quant::rng_state rng = rng0;
    rng.stream = static_cast<std::uint32_t>(me);
    Q::template compress<T>(in, count, wslot(me), rng, ex);
    reqs_.clear();
    for (int s = 1; s < p; ++s) reqs_.push_back(this->x_.irecv(wslot((me + p - s) % p), bytes, (me + p - s) % p, tag));
    for (int s = 1; s < p; ++s) reqs_.push_back(this->x_.isend(wslot(me), bytes, (me + s) % p, tag));
    this->x_.wait_all(std::span(reqs_));
    reqs_.clear();
    for (int r = 0; r < p; ++r) Q::template decompress<T>(wslot(r), count, out + static_cast<std::size_t>(r) * count, ex);
    claimed.finish();
  }

 private:
  static constexpr int tag = cgx::detail::tag_value(cgx::detail::tag::allgather);
  static std::int64_t signature() { return detail::plan_signature<T, Q>("allgather").value(); }

  std::vector<typename X::request> reqs_ = detail::reserved<typename X::request>(2 * static_cast<std::size_t>(this->x_.size()));
};

}  // namespace cgx
