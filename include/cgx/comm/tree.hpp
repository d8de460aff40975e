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
///
/// The chunks, peers, virtual ranks, workspace slots, random keys and summation order
/// are those of the description schedule::tree (schedule/tree.hpp); this file runs it.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../concepts.hpp"
#include "../detail/checked.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/requantize.hpp"
#include "../quant/rounding.hpp"
#include "chunking.hpp"
#include "schedule_base.hpp"
#include "../detail/tags.hpp"
#include "../schedule/tree.hpp"

namespace cgx::comm {

/// Recursive halving / doubling (see the file comment for traffic and error).
struct tree {
  static constexpr const char* name = "tree";  ///< the reducer's name (benchmarks, plan signatures)

  /// Quantizations an element goes through on its longest path.
  static constexpr int quantizations(int p) {
    if (p <= 1) return 0;
    const int q = ::cgx::schedule::tree::pow2(p);
    return std::countr_zero(static_cast<unsigned>(q)) + 1 + (p != q ? 1 : 0);
  }

  /// On two ranks each sends the other half of the buffer, both at once (see
  /// comm::symmetric_at_two; hierarchical crosses such groups on two nodes).
  static constexpr bool symmetric_at_two = true;

  /// The schedule for values T, quantizer Q and transport X; the plan owns the workspace.
  template <class T, class Q, class X>
  class schedule : public detail::schedule_base<T, Q> {
   public:

    /// q slots for the compressed chunks, then two whole compressed buffers: the
    /// receive slot of the fold and of the halving, and the halving's send slot
    /// (schedule::tree's workspace).
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      return base::workspace(n, [&] {
        const description d = description::make(n, p, granule_of<Q>, bytes);
        return cgx::detail::checked_add(cgx::detail::checked_mul(static_cast<std::size_t>(d.q), d.slot), cgx::detail::checked_mul(2, d.whole));
      });
    }

    /// Binds to the plan's transport; allocates only its own request list.
    explicit schedule(X& x) { reqs_.reserve(2 * static_cast<std::size_t>(description::pow2(x.size())) + 2); }

    /// The values of chunk c of the q-way cut of n (bucket-aligned, balanced).
    static chunk chunk_of(std::size_t n, int q, int c) { return comm::chunk_of(n, q, c, granule_of<Q>); }

    /// In place sum over all ranks of buf[0..n). Collective. Chunks, peers, virtual
    /// ranks, slots, keys and the order of sums: schedule::tree.
    void run(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const description d = description::make(n, p, granule_of<Q>, bytes);
      const int q = d.q;
      auto cslot = [&](int c) { return ws + d.chunk_slot(c); };
      std::byte* const scratch = ws + d.scratch();
      std::byte* const scratch_send = ws + d.scratch_send();
      auto compress = [&](const chunk& c, std::byte* out, int step) {
        Q::template compress<T>(buf + c.begin, c.count, out, ::cgx::schedule::keyed(rng, d.key_of(me, step, c)), ex);
      };

      // 0. Fold the first 2e ranks pairwise.
      const int v = d.virtual_rank(me);  // -1: sits out after the fold
      if (me < 2 * d.extra()) {
        if (me % 2 == 0) {
          compress(chunk{0, n}, scratch, 0);
          auto r = x.isend(scratch, bytes(n), me + 1, tag_fold);
          x.wait_all(std::span(&r, 1));
        } else {
          auto r = x.irecv(scratch, bytes(n), me - 1, tag_fold);
          x.wait_all(std::span(&r, 1));
          Q::template decompress_add<T>(scratch, n, buf, ex);
        }
      }

      if (v >= 0) {
        // 1. Recursive halving: keep the half holding v, send the other half.
        for (int i = 1; i <= d.levels(); ++i) {
          const auto h = d.halve(v, i);
          const chunk keep = d.span_of(h.klo, h.khi);
          const chunk send = d.span_of(h.slo, h.shi);
          const int partner = d.real(h.partner);
          reqs_.clear();
          if (keep.count != 0) reqs_.push_back(x.irecv(scratch, bytes(keep.count), partner, tag_halve));
          if (send.count != 0) {
            compress(send, scratch_send, i);
            reqs_.push_back(x.isend(scratch_send, bytes(send.count), partner, tag_halve));
          }
          x.wait_all(std::span(reqs_));
          if (keep.count != 0) Q::template decompress_add<T>(scratch, keep.count, buf + keep.begin, ex);
        }

        // 2. The owner of chunk v quantizes the finished sum once.
        const chunk mine = d.chunk_of(v);
        if (mine.count != 0)
          quant::add_requantize<Q, T>(nullptr, buf + mine.begin, mine.count, cslot(v),
                                      ::cgx::schedule::keyed(rng, d.key_of(me, d.levels() + 1, mine)), ex);

        // 3. Recursive doubling: exchange every compressed chunk held (the aligned block
        //    of d chunks around v) for the partner's block.
        for (int dist = 1; dist < q; dist *= 2) {
          const int lo = description::block_lo(v, dist), plo = lo ^ dist;
          const int partner = d.real(v ^ dist);
          reqs_.clear();
          for (int c = plo; c < plo + dist; ++c) {
            const chunk cc = d.chunk_of(c);
            if (cc.count != 0) reqs_.push_back(x.irecv(cslot(c), bytes(cc.count), partner, tag_double));
          }
          for (int c = lo; c < lo + dist; ++c) {
            const chunk cc = d.chunk_of(c);
            if (cc.count != 0) reqs_.push_back(x.isend(cslot(c), bytes(cc.count), partner, tag_double));
          }
          x.wait_all(std::span(reqs_));
          for (int c = plo; c < plo + dist; ++c) {
            const chunk cc = d.chunk_of(c);
            if (cc.count != 0) Q::template decompress<T>(cslot(c), cc.count, buf + cc.begin, ex);
          }
        }
      }

      // 4. Unfold: the folded partner gets the q compressed chunks.
      if (me < 2 * d.extra()) {
        reqs_.clear();
        const bool receiver = me % 2 == 0;
        const int partner = receiver ? me + 1 : me - 1;
        for (int c = 0; c < q; ++c) {
          const chunk cc = d.chunk_of(c);
          if (cc.count == 0) continue;
          reqs_.push_back(receiver ? x.irecv(cslot(c), bytes(cc.count), partner, tag_unfold)
                                   : x.isend(cslot(c), bytes(cc.count), partner, tag_unfold));
        }
        x.wait_all(std::span(reqs_));
        if (receiver)
          for (int c = 0; c < q; ++c) {
            const chunk cc = d.chunk_of(c);
            if (cc.count != 0) Q::template decompress<T>(cslot(c), cc.count, buf + cc.begin, ex);
          }
      }
    }

   private:
    using base = detail::schedule_base<T, Q>;
    using description = ::cgx::schedule::tree;
    static constexpr ::cgx::schedule::size_fn bytes = &Q::template compressed_bytes<T>;

    static constexpr int tag_fold = cgx::detail::tag_value(cgx::detail::tag::tree_fold);
    static constexpr int tag_halve = cgx::detail::tag_value(cgx::detail::tag::tree_halve);
    // Several chunks travel between the same pair with one tag: the transport's order
    // per pair and tag matches them (concepts.hpp), both sides post them in chunk order.
    static constexpr int tag_double = cgx::detail::tag_value(cgx::detail::tag::tree_double);
    static constexpr int tag_unfold = cgx::detail::tag_value(cgx::detail::tag::tree_unfold);

    std::vector<typename X::request> reqs_;
  };
};

}  // namespace cgx::comm
