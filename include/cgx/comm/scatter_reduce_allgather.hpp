#pragma once
/// \file scatter_reduce_allgather.hpp
/// `cgx::comm::scatter_reduce_allgather` (SRA): CGX's compressed allreduce schedule.
///
/// The buffer is cut into p chunks at bucket boundaries; rank o owns chunk o.
///  1. scatter-reduce: every rank r != o compresses its part of chunk o and sends it
///     to o; o adds the p - 1 decoded parts to its own (uncompressed) part, in rank order.
///  2. o compresses the sum once and decodes it into its own buffer.
///  3. allgather: o sends the compressed sum to every rank, which decodes it.
/// Every rank decodes the same bytes with the same code, so all ranks end with the
/// same bits. The pieces, peers, workspace slots, random keys and summation order are
/// those of the description schedule::sra (schedule/sra.hpp); this file runs it.
///
/// Traffic per rank: (p - 1) / p of the compressed buffer sent in each of the two
/// phases, i.e. 2 (p - 1)/p * compressed_bytes(n), received likewise; 2 (p - 1) K
/// messages each way, where run() cuts each chunk into K pieces (1 below 2 MiB per
/// chunk, up to 8) to pipeline the phases.
///
/// Quantizations per element: 2 on the path of each contribution (its own rank's, then
/// the sum's); the owner's contribution is quantized once. Error bound for element i of
/// chunk o, with u_r the unit of the bucket holding i in rank r's input and u_s the
/// unit of that bucket of the sum (u = (max - min) / (2^bits - 1)):
///
///     nearest:     |result_i - sum_i| <= sum_{r != o} u_r / 2 + u_s / 2
///     stochastic:  |result_i - sum_i| <  sum_{r != o} u_r     + u_s
///
/// plus the floating-point rounding of the p - 1 additions and of the decodes (a few
/// ulp of the magnitudes involved). u_s <= (range of the exact sum in that bucket +
/// 2 * the first term) / (2^bits - 1). With the lossless `quant::none` the result is
/// the sum in rank order, exact on integer-valued data.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../concepts.hpp"
#include "../detail/checked.hpp"
#include "chunking.hpp"
#include "schedule_base.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/requantize.hpp"
#include "../quant/rounding.hpp"
#include "../detail/tags.hpp"
#include "../schedule/sra.hpp"

namespace cgx::comm {

/// CGX's scatter-reduce-allgather schedule (see the file comment for traffic and error).
struct scatter_reduce_allgather {
  static constexpr const char* name = "sra";  ///< the reducer's name (benchmarks, plan signatures)

  /// Quantizations an element goes through on its longest path.
  static constexpr int quantizations(int p) { return p > 1 ? 2 : 0; }

  /// On two ranks each sends the other half of the buffer, both at once (see
  /// comm::symmetric_at_two; hierarchical crosses such groups on two nodes).
  static constexpr bool symmetric_at_two = true;

  /// The schedule for values T, quantizer Q, transport X. Holds no buffers of its own
  /// beyond a request list sized at construction; the plan gives it the workspace.
  template <class T, class Q, class X>
  class schedule : public detail::schedule_base<T, Q> {
   public:

    /// Bytes of workspace for up to n values on p ranks: p slots each for what this rank
    /// sends, what it receives in the scatter-reduce, and what it receives in the allgather.
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      return base::workspace(n, [&] { return cgx::detail::checked_mul(description::slots(p), description::slot_bytes(n, p, granule_of<Q>, sizeof(T), bytes)); });
    }

    /// Binds to the plan's transport; allocates only its own request lists.
    explicit schedule(X& x) {
      const auto p = static_cast<std::size_t>(x.size());
      reqs_.reserve(2 * max_pieces * p);
      sends_.reserve(2 * max_pieces * p);
      first_.resize(2 * max_pieces * p);
    }

    /// In place sum over all ranks of buf[0..n). Collective.
    ///
    /// Pipelined: each chunk is cut into K pieces (at bucket boundaries; K from n and p
    /// only, 1 for chunks under 2 MiB, at most 8) that travel as separate messages, piece
    /// by piece, so the owner reduces, re-quantizes and sends the sum of piece k while
    /// piece k + 1 is still on the wire, and ranks decode the sums as they arrive. The
    /// link stays busy instead of idling while whole chunks are (de)compressed between
    /// the phases. Pieces start at bucket boundaries and carry the positions of their
    /// values, so the bits are those of the unpipelined schedule (scatter_reduce() then
    /// allgather()). Pieces, peers, slots and keys: schedule::sra::pipelined.
    void run(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const description d = description::pipelined(n, p, granule_of<Q>, sizeof(T), bytes);
      auto at = [&](int phase, int k, int r) -> int& {
        return first_[(static_cast<std::size_t>(phase) * max_pieces + static_cast<std::size_t>(k)) * static_cast<std::size_t>(p) +
                      static_cast<std::size_t>(r)];
      };

      // Every receive is posted first: the parts of my chunk, then the others' sums.
      reqs_.clear();
      sends_.clear();
      for (int k = 0; k < d.K; ++k) {
        const piece_t m = d.piece(me, k);
        for (int r = 0; r < p; ++r) {
          at(0, k, r) = -1;
          if (r == me || m.values.count == 0) continue;
          at(0, k, r) = static_cast<int>(reqs_.size());
          reqs_.push_back(x.irecv(ws + d.recv_slot(r) + m.offset, m.bytes, r, tag_scatter));
        }
      }
      for (int k = 0; k < d.K; ++k)
        for (int r = 0; r < p; ++r) {
          at(1, k, r) = -1;
          const piece_t g = d.piece(r, k);
          if (r == me || g.values.count == 0) continue;
          at(1, k, r) = static_cast<int>(reqs_.size());
          reqs_.push_back(x.irecv(ws + d.gather_slot(r) + g.offset, g.bytes, r, tag_gather));
        }
      // My contributions to every other chunk, piece by piece.
      for (int k = 0; k < d.K; ++k)
        for (int step = 1; step < p; ++step) {
          const int r = d.to(me, step);
          const piece_t c = d.piece(r, k);
          if (c.values.count == 0) continue;
          std::byte* out = ws + d.send_slot(r) + c.offset;
          Q::template compress<T>(buf + c.values.begin, c.values.count, out,
                                  ::cgx::schedule::keyed(rng, description::contribution_key(me, c.values)), ex);
          sends_.push_back(x.isend(out, c.bytes, r, tag_scatter));
          comm::progress(x);  // let the sends posted so far move while the next piece is compressed
        }
      auto wait = [&](int i) { x.wait_all(std::span(reqs_.data() + i, 1)); };
      auto gather = [&](int k) {  // decode piece k of every other rank's sum
        for (int step = 1; step < p; ++step) {
          const int r = d.from(me, step);
          if (at(1, k, r) < 0) continue;
          const piece_t g = d.piece(r, k);
          wait(at(1, k, r));
          Q::template decompress<T>(ws + d.gather_slot(r) + g.offset, g.values.count, buf + g.values.begin, ex);
        }
      };
      for (int k = 0; k < d.K; ++k) {
        const piece_t m = d.piece(me, k);
        if (m.values.count != 0) {
          std::byte* sum = ws + d.send_slot(me) + m.offset;
          reduce_piece(d, me, m, buf, ws, sum, rng, ex, [&](int r) { wait(at(0, k, r)); });
          for (int step = 1; step < p; ++step) sends_.push_back(x.isend(sum, m.bytes, d.to(me, step), tag_gather));
        }
        if (k > 0) gather(k - 1);
      }
      gather(d.K - 1);
      x.wait_all(std::span(sends_));
    }

    /// Pieces per chunk of run()'s pipeline for n values on p ranks (the same on every rank).
    static int pieces(std::size_t n, int p) { return description::pieces(n, p, granule_of<Q>, sizeof(T)); }

    /// Phases 1 and 2: afterwards buf[chunk_of(n, p, rank)] holds the decoded
    /// (re-quantized) sum of this rank's chunk, bit for bit what run() leaves there, and
    /// the workspace holds its compressed bytes for allgather(). The rest of buf is
    /// left as it was. Collective. Chunks, peers, slots and keys: schedule::sra::two_phase.
    void scatter_reduce(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      phase(n, x, [&](int p, int me, const description& d, const piece_t mine) {
        if (mine.bytes != 0)
          for (int r = 0; r < p; ++r)
            if (r != me) reqs_.push_back(x.irecv(ws + d.recv_slot(r), mine.bytes, r, tag_scatter));  // reqs_[r - (r > me)]
        const std::size_t nrecv = reqs_.size();
        for (int step = 1; step < p; ++step) {
          const int r = d.to(me, step);
          const piece_t c = d.piece(r, 0);
          if (c.values.count == 0) continue;
          Q::template compress<T>(buf + c.values.begin, c.values.count, ws + d.send_slot(r),
                                  ::cgx::schedule::keyed(rng, description::contribution_key(me, c.values)), ex);
          reqs_.push_back(x.isend(ws + d.send_slot(r), c.bytes, r, tag_scatter));
        }
        if (mine.values.count != 0) {
          reduce_piece(d, me, mine, buf, ws, ws + d.send_slot(me), rng, ex,
                       [&](int r) { x.wait_all(std::span(reqs_.data() + (r - (r > me ? 1 : 0)), 1)); });
        }
        x.wait_all(std::span(reqs_.data() + nrecv, reqs_.size() - nrecv));
        reqs_.clear();
      });
    }

    /// Phase 3, after scatter_reduce(): every rank's compressed sum goes to every rank,
    /// which decodes it into buf. Collective.
    void allgather(T* buf, std::size_t n, X& x, std::byte* ws, quant::host_exec ex) {
      phase(n, x, [&](int p, int me, const description& d, const piece_t mine) {
        for (int r = 0; r < p; ++r) {
          const piece_t g = d.piece(r, 0);
          if (r != me && g.values.count != 0) reqs_.push_back(x.irecv(ws + d.gather_slot(r), g.bytes, r, tag_gather));
        }
        if (mine.bytes != 0)
          for (int step = 1; step < p; ++step) reqs_.push_back(x.isend(ws + d.send_slot(me), mine.bytes, d.to(me, step), tag_gather));
        x.wait_all(std::span(reqs_));
        reqs_.clear();
        for (int r = 0; r < p; ++r) {
          const piece_t g = d.piece(r, 0);
          if (r != me && g.values.count != 0) Q::template decompress<T>(ws + d.gather_slot(r), g.values.count, buf + g.values.begin, ex);
        }
      });
    }

    /// The values owned by rank r.
    static chunk chunk_of(std::size_t n, int p, int r) { return comm::chunk_of(n, p, r, granule_of<Q>); }

   private:
    using base = detail::schedule_base<T, Q>;
    using description = ::cgx::schedule::sra;
    using piece_t = description::piece_t;
    static constexpr ::cgx::schedule::size_fn bytes = &Q::template compressed_bytes<T>;

    static constexpr int tag_scatter = cgx::detail::tag_value(cgx::detail::tag::sra_scatter);
    static constexpr int tag_gather = cgx::detail::tag_value(cgx::detail::tag::sra_gather);

    // Starts one phase of scatter_reduce() and allgather() on n values over x: nothing on one
    // rank or for n = 0; otherwise body(p, me, d, mine) with the two-phase description,
    // this rank's piece and the request list cleared.
    template <class Body>
    void phase(std::size_t n, X& x, Body&& body) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const description d = description::two_phase(n, p, granule_of<Q>, sizeof(T), bytes);
      reqs_.clear();
      body(p, me, d, d.piece(me, 0));
    }

    static constexpr std::size_t max_pieces = description::max_pieces;

    /// The owner me sums piece m: it adds the other ranks' decoded parts to its own in
    /// the description's order, each as soon as it has arrived (wait(r) waits for rank
    /// r's), the last one fused with quantizing the sum once, into `out`, and decoding it
    /// back into buf: the owner keeps the decoded bytes, like everyone else.
    template <class Wait>
    static void reduce_piece(const description& d, int me, const piece_t& m, T* buf, std::byte* ws, std::byte* out,
                             const quant::rng_state& rng, quant::host_exec ex, Wait&& wait) {
      const std::byte* last = nullptr;
      for (int i = 0; i + 1 < d.p; ++i) {
        const int r = description::addend(me, i);
        wait(r);
        const std::byte* part = ws + d.recv_slot(r) + m.offset;
        if (i + 2 < d.p)
          Q::template decompress_add<T>(part, m.values.count, buf + m.values.begin, ex);
        else
          last = part;
      }
      quant::add_requantize<Q, T>(last, buf + m.values.begin, m.values.count, out,
                                  ::cgx::schedule::keyed(rng, d.sum_key(me, m.values)), ex);
    }

    std::vector<typename X::request> reqs_, sends_;
    std::vector<int> first_;  // index in reqs_ of the receive of (phase, piece, rank), -1 if none
  };
};

}  // namespace cgx::comm
