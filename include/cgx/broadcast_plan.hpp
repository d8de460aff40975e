#pragma once
/// \file broadcast_plan.hpp
/// `cgx::broadcast_plan<T, Q, X>`: the root's buffer to every rank, compressed once.
///
/// The root compresses its buffer once; the bytes travel down a binomial tree (rank
/// root + k receives from root + k - 2^j, where 2^j is the lowest set bit of k, and
/// forwards the bytes unchanged to root + k + 2^i for every 2^i < 2^j; mod p), so the latency is
/// ceil(log2 p) steps and every rank sends at most ceil(log2 p) messages. Every rank,
/// the root included, then decodes the same bytes: all ranks end with the same bits
/// (the root's buffer is replaced by its decoded form). Error per value: one
/// quantization (maxmin: unit/2 nearest, < unit stochastic); exact with quant::none and
/// on one rank (nothing is sent or changed).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan_common.hpp"
#include "quant/host_exec.hpp"
#include "detail/tags.hpp"

namespace cgx {

/// Compressed broadcast of up to `max_count` values of T (see the file comment).
/// Construction and every call are collective, in the same order on every rank (T, Q
/// and X: see collective_plan).
template <class T, class Q, class X>
class broadcast_plan : public collective_plan<broadcast_plan<T, Q, X>, T, Q, X> {
 public:
  /// The plan's name in error messages.
  static constexpr const char* name = "broadcast_plan";

  /// Bytes of workspace for up to `max_count` values (any number of ranks).
  /// Throws cgx::error(errc::invalid_argument) if that size overflows std::size_t.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    return detail::sized(name, max_count, ranks, [&] {
      detail::check_raw_bytes(max_count, sizeof(T));
      return Q::template compressed_bytes<T>(max_count);
    });
  }

  /// Collective constructors: with an owned or the caller's workspace (see collective_plan).
  using broadcast_plan::collective_plan::collective_plan;

  /// Replaces buf[0..n) on every rank by the root's values (decoded). Collective: every
  /// rank calls it with the same n and root. Throws cgx::error, leaving buf untouched,
  /// for a null buf with n > 0, n above max_count(), a root outside [0, size()), or
  /// (collective checking) counts, roots or plan types that differ between ranks;
  /// errc::invalid_argument at once, before any communication, when another thread is in
  /// a call of this plan.
  void operator()(T* buf, std::size_t n, int root) {
    const auto claimed = this->claim();
    const int p = this->x_.size();
    const bool bad_root = root < 0 || root >= p;
    detail::signature_hash h = detail::plan_signature<T, Q>("broadcast");
    h.mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(root)));
    this->begin_call(claimed, buf == nullptr, n, h.value(), bad_root,
                     [&] { return "root " + std::to_string(root) + " outside [0, " + std::to_string(p) + ")"; });
    const quant::rng_state rng0 = this->next_rng();
    if (p == 1 || n == 0) return;
    const int me = this->x_.rank();
    const int k = (me - root + p) % p;  // position in the tree
    auto real = [&](int v) { return (v + root) % p; };
    const std::size_t bytes = Q::template compressed_bytes<T>(n);
    std::byte* w = this->ws_.data();
    const quant::host_exec ex{this->opts_.threads};
    int mask = 1;
    if (k == 0) {
      quant::rng_state rng = rng0;
      rng.stream = static_cast<std::uint32_t>(root);
      Q::template compress<T>(buf, n, w, rng, ex);
      while (mask < p) mask <<= 1;
    } else {
      while ((k & mask) == 0) mask <<= 1;  // the lowest set bit names the parent
      auto q = this->x_.irecv(w, bytes, real(k - mask), tag);
      this->x_.wait_all(std::span(&q, 1));
    }
    reqs_.clear();
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (k + mask < p) reqs_.push_back(this->x_.isend(w, bytes, real(k + mask), tag));
    this->x_.wait_all(std::span(reqs_));
    reqs_.clear();
    Q::template decompress<T>(w, n, buf, ex);
    claimed.finish();
  }

 private:
  static constexpr int tag = cgx::detail::tag_value(cgx::detail::tag::broadcast);

  std::vector<typename X::request> reqs_;
};

}  // namespace cgx
