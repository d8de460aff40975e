#pragma once
/// \file ring.hpp
/// `cgx::comm::ring`: the ring allreduce, with compression.
///
/// The buffer is cut into p chunks at bucket boundaries. Rank r sends to r + 1 and
/// receives from r - 1 (mod p).
///  1. reduce-scatter, p - 1 steps: at step s rank r compresses its running sum of
///     chunk (r - s) mod p, sends it right, and adds the decoded chunk (r - s - 1) mod p
///     that arrives from the left to its own. After p - 1 steps rank r holds the whole
///     sum of chunk (r + 1) mod p.
///  2. the owner compresses that sum once and decodes it into its own buffer.
///  3. allgather, p - 1 steps: every rank forwards the compressed bytes it received
///     unchanged and decodes them, so every rank ends with the owner's bits.
/// The chunks, peers, workspace slots, random keys and summation order are those of the
/// description schedule::ring (schedule/ring.hpp); this file runs it.
///
/// Traffic per rank: the same as SRA, 2 (p - 1)/p * compressed_bytes(n) sent, but in
/// 2 (p - 1) messages of 1/p of the buffer to one neighbour only (no incast), so it
/// suits rings of slow links; latency 2 (p - 1) steps.
///
/// Quantizations per element: the running sum of chunk c is re-quantized at each of
/// the p - 1 hops (the chain c, c + 1, ..., c + p - 1), then once more by the owner: p
/// in all. With S_k the exact partial sum after k contributions (k = 1..p-1) and u(.)
/// the bucket unit of the quantity quantized at that hop,
///
///     |result_i - sum_i| <= sum_{k=1}^{p-1} c u(S~_k) + c u(S~_p),   c = 1/2 (nearest), 1 (stochastic)
///
/// where S~_k is the partial sum as carried (exact S_k plus the error so far), so
/// u(S~_k) <= (range of S_k in the bucket + 2 * error so far) / (2^bits - 1); plus the
/// floating-point rounding of the additions. The error grows with p: prefer SRA or
/// tree for many ranks and few bits.

#include <cstddef>
#include <cstdint>
#include <span>

#include "../concepts.hpp"
#include "../detail/checked.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/requantize.hpp"
#include "../quant/rounding.hpp"
#include "chunking.hpp"
#include "schedule_base.hpp"
#include "../detail/tags.hpp"
#include "../schedule/ring.hpp"

namespace cgx::comm {

/// Ring reduce-scatter with re-quantized partial sums, then a ring allgather that
/// forwards compressed bytes (see the file comment for traffic and error).
struct ring {
  static constexpr const char* name = "ring";  ///< the reducer's name (benchmarks, plan signatures)

  /// Quantizations an element goes through on its longest path.
  static constexpr int quantizations(int p) { return p > 1 ? p : 0; }

  /// On two ranks each sends the other half of the buffer, both at once (see
  /// comm::symmetric_at_two; hierarchical crosses such groups on two nodes).
  static constexpr bool symmetric_at_two = true;

  /// The schedule for values T, quantizer Q and transport X; the plan owns the workspace.
  template <class T, class Q, class X>
  class schedule : public detail::schedule_base<T, Q> {
   public:

    /// p slots for the compressed chunks of the allgather, plus one send and one
    /// receive slot for the reduce-scatter (schedule::ring's workspace).
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      return base::workspace(n, [&] { return cgx::detail::checked_mul(description::slots(p), description::make(n, p, granule_of<Q>, bytes).slot); });
    }

    /// Binds to the plan's transport; allocates nothing.
    explicit schedule(X&) {}

    /// The values of chunk c of n on p ranks (bucket-aligned, balanced). Rank r finishes
    /// the sum of chunk r + 1 mod p (schedule::ring::owned), not of chunk r.
    static chunk chunk_of(std::size_t n, int p, int c) { return comm::chunk_of(n, p, c, granule_of<Q>); }

    /// In place sum over all ranks of buf[0..n). Collective. Chunks, peers, slots, keys
    /// and the order of sums: schedule::ring.
    void run(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const description d = description::make(n, p, granule_of<Q>, bytes);
      std::byte* const sbuf = ws + d.send_slot();
      std::byte* const rbuf = ws + d.recv_slot();

      // 1. Reduce: one send and one receive in flight per step.
      for (int s = 0; s + 1 < p; ++s) {
        const chunk out = d.chunk_of(d.reduce_out(me, s));
        const chunk in = d.chunk_of(d.reduce_in(me, s));
        typename X::request q[2];
        int nq = 0;
        if (in.count != 0) q[nq++] = x.irecv(rbuf, bytes(in.count), d.left(me), tag_reduce);
        if (out.count != 0) {
          Q::template compress<T>(buf + out.begin, out.count, sbuf, ::cgx::schedule::keyed(rng, description::contribution_key(me, out)), ex);
          q[nq++] = x.isend(sbuf, bytes(out.count), d.right(me), tag_reduce);
        }
        x.wait_all(std::span(q, static_cast<std::size_t>(nq)));
        // The last step's chunk is the one this rank owns: step 2 adds it.
        if (in.count != 0 && s + 2 < p) Q::template decompress_add<T>(rbuf, in.count, buf + in.begin, ex);
      }

      // 2. The owner adds the last part, quantizes the finished sum once and keeps the
      //    decoded bytes (quant::add_requantize).
      const int own = d.owned(me);
      const chunk mine = d.chunk_of(own);
      if (mine.count != 0)
        quant::add_requantize<Q, T>(rbuf, buf + mine.begin, mine.count, ws + d.gather_slot(own),
                                    ::cgx::schedule::keyed(rng, d.sum_key(me, mine)), ex);

      // 3. Gather: forward the compressed chunks unchanged.
      for (int s = 0; s + 1 < p; ++s) {
        const int cout = d.gather_out(me, s);
        const int cin = d.gather_in(me, s);
        const chunk out = d.chunk_of(cout);
        const chunk in = d.chunk_of(cin);
        typename X::request q[2];
        int nq = 0;
        if (in.count != 0) q[nq++] = x.irecv(ws + d.gather_slot(cin), bytes(in.count), d.left(me), tag_gather);
        if (out.count != 0) q[nq++] = x.isend(ws + d.gather_slot(cout), bytes(out.count), d.right(me), tag_gather);
        x.wait_all(std::span(q, static_cast<std::size_t>(nq)));
        if (in.count != 0) Q::template decompress<T>(ws + d.gather_slot(cin), in.count, buf + in.begin, ex);
      }
    }

   private:
    using base = detail::schedule_base<T, Q>;
    using description = ::cgx::schedule::ring;
    static constexpr ::cgx::schedule::size_fn bytes = &Q::template compressed_bytes<T>;

    static constexpr int tag_reduce = cgx::detail::tag_value(cgx::detail::tag::ring_reduce);
    static constexpr int tag_gather = cgx::detail::tag_value(cgx::detail::tag::ring_gather);
  };
};

}  // namespace cgx::comm
