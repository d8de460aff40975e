#pragma once
/// \file tree.hpp
/// `cgx::comm::tree`: recursive halving (reduce-scatter) and recursive doubling
/// (allgather) with compression, O(log p) steps and quantizations.
///
/// Let q be the largest power of two <= p and e = p - q. The buffer is cut into q
/// chunks at bucket boundaries.
///  0. fold: among ranks 0 .. 2e-1, each even rank sends its whole buffer, compressed,
///     to the odd rank above it, which adds it, and then sits out; the q active ranks
///     get virtual ranks v = 0 .. q-1.
///  1. recursive halving, log2 q steps: at distance d = q/2, q/4, ..., 1, virtual rank v
///     and v ^ d split their common chunk range in two; each sends the compressed half
///     the other keeps and adds the decoded half it receives. Each active rank ends
///     with the whole sum of chunk v.
///  2. the owner compresses that sum once and decodes it into its own buffer.
///  3. recursive doubling, log2 q steps: partners exchange all compressed chunks they
///     hold (bytes forwarded unchanged) and decode them.
///  4. unfold: each odd rank of the fold sends the q compressed chunks to its even
///     partner, which decodes them.
///
/// Traffic per active rank: 2 (q - 1)/q * compressed_bytes(n) in 2 log2 q messages
/// rounds (+ compressed_bytes(n) each way for a folded pair); latency O(log p), so it
/// suits small and medium messages and many ranks.
///
/// Quantizations per element: at most log2 q + 2 (the fold, one per halving step on
/// its path, the final sum). Each quantizes a partial sum S~ of a subset of ranks'
/// inputs; its unit u(S~) <= (sum of those ranks' bucket ranges + 2 * error so far) /
/// (2^bits - 1), and the error grows by c u(S~) per quantization, c = 1/2 (nearest),
/// 1 (stochastic); plus the floating-point rounding of the additions.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../concepts.hpp"
#include "../detail/checked.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/rounding.hpp"
#include "chunking.hpp"
#include "../detail/tags.hpp"

namespace cgx::comm {

/// Recursive halving / doubling (see the file comment for traffic and error).
struct tree {
  static constexpr const char* name = "tree";  ///< the reducer's name (benchmarks, plan signatures)

  /// Quantizations an element goes through on its longest path.
  static constexpr int quantizations(int p) {
    if (p <= 1) return 0;
    const int q = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
    return std::countr_zero(static_cast<unsigned>(q)) + 1 + (p != q ? 1 : 0);
  }

  /// On two ranks each sends the other half of the buffer, both at once (see
  /// comm::symmetric_at_two; hierarchical crosses such groups on two nodes).
  static constexpr bool symmetric_at_two = true;

  /// The schedule for values T, quantizer Q and transport X; the plan owns the workspace.
  template <class T, class Q, class X>
  class schedule {
   public:
    static constexpr std::size_t granule = granule_of<Q>;  ///< chunk boundaries fall on multiples of this many values

    /// q slots for the compressed chunks, a receive slot of half the buffer, and (for
    /// the fold) a whole compressed buffer.
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      cgx::detail::check_raw_bytes(n, sizeof(T));
      const int q = pow2(p);
      return cgx::detail::checked_add(cgx::detail::checked_mul(static_cast<std::size_t>(q), slot_bytes(n, q)),
                                 cgx::detail::checked_mul(2, whole_bytes(n)));
    }

    /// Binds to the plan's transport; allocates only its own request lists.
    explicit schedule(X& x) { reqs_.reserve(2 * static_cast<std::size_t>(pow2(x.size())) + 2); }

    /// The values of n that rank r of p owns (its chunk: bucket-aligned, balanced).
    static chunk chunk_of(std::size_t n, int q, int c) { return comm::chunk_of(n, q, c, granule); }

    /// In place sum over all ranks of buf[0..n). Collective.
    void run(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const int q = pow2(p);
      const int extra = p - q;
      const std::size_t slot = slot_bytes(n, q);
      auto cslot = [&](int c) { return ws + static_cast<std::size_t>(c) * slot; };
      std::byte* scratch = ws + static_cast<std::size_t>(q) * slot;  // 2 * whole_bytes(n)
      auto bytes_of = [&](std::size_t count) { return Q::template compressed_bytes<T>(count); };
      auto stream = [&](int k) {
        quant::rng_state s = rng;
        s.stream = static_cast<std::uint32_t>(k * p + me);
        return s;
      };

      // 0. Fold the first 2e ranks pairwise.
      int v = -1;  // virtual rank, -1 while sitting out
      if (me < 2 * extra) {
        if (me % 2 == 0) {
          quant::rng_state s = stream(0);
          s.position = rng.position;
          Q::template compress<T>(buf, n, scratch, s, ex);
          auto r = x.isend(scratch, bytes_of(n), me + 1, tag_fold);
          x.wait_all(std::span(&r, 1));
        } else {
          auto r = x.irecv(scratch, bytes_of(n), me - 1, tag_fold);
          x.wait_all(std::span(&r, 1));
          Q::template decompress_add<T>(scratch, n, buf, ex);
          v = me / 2;
        }
      } else {
        v = me - extra;
      }
      auto real = [&](int vr) { return vr < extra ? 2 * vr + 1 : vr + extra; };

      if (v >= 0) {
        // 1. Recursive halving over chunk ranges [lo, hi).
        int lo = 0, hi = q, step = 1;
        for (int d = q / 2; d >= 1; d /= 2, ++step) {
          const int partner = v ^ d;
          const int mid = (lo + hi) / 2;
          const bool keep_low = (v & d) == 0;
          const int klo = keep_low ? lo : mid, khi = keep_low ? mid : hi;
          const int slo = keep_low ? mid : lo, shi = keep_low ? hi : mid;
          const chunk keep = span_of(n, q, klo, khi);
          const chunk send = span_of(n, q, slo, shi);
          reqs_.clear();
          if (keep.count != 0) reqs_.push_back(x.irecv(scratch, bytes_of(keep.count), real(partner), tag_halve));
          if (send.count != 0) {
            quant::rng_state s = stream(step);
            s.position = rng.position + send.begin;
            Q::template compress<T>(buf + send.begin, send.count, scratch + whole_bytes(n), s, ex);
            reqs_.push_back(x.isend(scratch + whole_bytes(n), bytes_of(send.count), real(partner), tag_halve));
          }
          x.wait_all(std::span(reqs_));
          if (keep.count != 0) Q::template decompress_add<T>(scratch, keep.count, buf + keep.begin, ex);
          lo = klo;
          hi = khi;
        }

        // 2. The owner of chunk v quantizes the finished sum once.
        const chunk mine = chunk_of(n, q, v);
        if (mine.count != 0) {
          quant::rng_state s = stream(step);
          s.position = rng.position + mine.begin;
          Q::template compress<T>(buf + mine.begin, mine.count, cslot(v), s, ex);
          if constexpr (!Q::lossless) Q::template decompress<T>(cslot(v), mine.count, buf + mine.begin, ex);
        }

        // 3. Recursive doubling: exchange every compressed chunk held.
        lo = v;
        hi = v + 1;
        for (int d = 1; d < q; d *= 2) {
          const int partner = v ^ d;
          const int plo = lo ^ d, phi = plo + (hi - lo);  // the partner's range
          reqs_.clear();
          for (int c = plo; c < phi; ++c) {
            const chunk cc = chunk_of(n, q, c);
            if (cc.count != 0) reqs_.push_back(x.irecv(cslot(c), bytes_of(cc.count), real(partner), tag_double));
          }
          for (int c = lo; c < hi; ++c) {
            const chunk cc = chunk_of(n, q, c);
            if (cc.count != 0) reqs_.push_back(x.isend(cslot(c), bytes_of(cc.count), real(partner), tag_double));
          }
          x.wait_all(std::span(reqs_));
          for (int c = plo; c < phi; ++c) {
            const chunk cc = chunk_of(n, q, c);
            if (cc.count != 0) Q::template decompress<T>(cslot(c), cc.count, buf + cc.begin, ex);
          }
          lo = std::min(lo, plo);
          hi = std::max(hi, phi);
        }
      }

      // 4. Unfold: the folded partner gets the q compressed chunks.
      if (me < 2 * extra) {
        reqs_.clear();
        const bool receiver = me % 2 == 0;
        const int partner = receiver ? me + 1 : me - 1;
        for (int c = 0; c < q; ++c) {
          const chunk cc = chunk_of(n, q, c);
          if (cc.count == 0) continue;
          reqs_.push_back(receiver ? x.irecv(cslot(c), bytes_of(cc.count), partner, tag_unfold)
                                   : x.isend(cslot(c), bytes_of(cc.count), partner, tag_unfold));
        }
        x.wait_all(std::span(reqs_));
        if (receiver)
          for (int c = 0; c < q; ++c) {
            const chunk cc = chunk_of(n, q, c);
            if (cc.count != 0) Q::template decompress<T>(cslot(c), cc.count, buf + cc.begin, ex);
          }
      }
    }

   private:
    static constexpr int tag_fold = cgx::detail::tag_value(cgx::detail::tag::tree_fold);
    static constexpr int tag_halve = cgx::detail::tag_value(cgx::detail::tag::tree_halve);
    // Several chunks travel between the same pair with one tag: the transport's order
    // per pair and tag matches them (concepts.hpp), both sides post them in chunk order.
    static constexpr int tag_double = cgx::detail::tag_value(cgx::detail::tag::tree_double);
    static constexpr int tag_unfold = cgx::detail::tag_value(cgx::detail::tag::tree_unfold);

    static int pow2(int p) { return static_cast<int>(std::bit_floor(static_cast<unsigned>(p))); }

    /// The values of chunks [c0, c1) of a q-way cut (contiguous).
    static chunk span_of(std::size_t n, int q, int c0, int c1) {
      const chunk a = chunk_of(n, q, c0);
      const chunk b = chunk_of(n, q, c1 - 1);
      return {a.begin, b.begin + b.count - a.begin};
    }

    static std::size_t slot_bytes(std::size_t n, int q) {
      return round_to_line(Q::template compressed_bytes<T>(largest_chunk(n, q, granule)));
    }
    static std::size_t whole_bytes(std::size_t n) { return round_to_line(Q::template compressed_bytes<T>(n)); }

    std::vector<typename X::request> reqs_;
  };
};

}  // namespace cgx::comm
