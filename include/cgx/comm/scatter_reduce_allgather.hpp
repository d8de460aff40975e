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
/// same bits.
///
/// Traffic per rank: (p - 1) / p of the compressed buffer sent in each of the two
/// phases, i.e. 2 (p - 1)/p * compressed_bytes(n), received likewise; 2 (p - 1)
/// messages each way.
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
#include "chunking.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/rounding.hpp"

namespace cgx::comm {

/// CGX's scatter-reduce-allgather schedule (see the file comment for traffic and error).
struct scatter_reduce_allgather {
  static constexpr const char* name = "sra";

  /// Quantizations an element goes through on its longest path.
  static constexpr int quantizations(int p) { return p > 1 ? 2 : 0; }

  /// The schedule for values T, quantizer Q, transport X. Holds no buffers of its own
  /// beyond a request list sized at construction; the plan gives it the workspace.
  template <class T, class Q, class X>
  class schedule {
   public:
    static constexpr std::size_t granule = granule_of<Q>;

    /// Bytes of workspace for up to n values on p ranks.
    static std::size_t workspace_bytes(std::size_t n, int p) { return 2 * static_cast<std::size_t>(p) * slot_bytes(n, p); }

    explicit schedule(X& x) { reqs_.reserve(4 * static_cast<std::size_t>(x.size())); }

    /// In place sum over all ranks of buf[0..n). Collective.
    void run(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      if (x.size() == 1 || n == 0) return;
      scatter_reduce(buf, n, x, ws, rng, ex);
      allgather(buf, n, x, ws, ex);
    }

    /// Phases 1 and 2: afterwards buf[chunk_of(n, p, rank)] holds the decoded
    /// (re-quantized) sum of this rank's chunk, bit for bit what run() leaves there, and
    /// the workspace holds its compressed bytes for allgather(). The rest of buf is
    /// left as it was. Collective.
    void scatter_reduce(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const std::size_t slot = slot_bytes(n, p);
      std::byte* send = ws;
      std::byte* recv = ws + static_cast<std::size_t>(p) * slot;
      auto sslot = [&](int r) { return send + static_cast<std::size_t>(r) * slot; };
      auto rslot = [&](int r) { return recv + static_cast<std::size_t>(r) * slot; };
      const chunk mine = chunk_of(n, p, me);
      const std::size_t mine_bytes = Q::template compressed_bytes<T>(mine.count);

      reqs_.clear();
      if (mine_bytes != 0)
        for (int r = 0; r < p; ++r)
          if (r != me) reqs_.push_back(x.irecv(rslot(r), mine_bytes, r, tag_scatter));  // reqs_[r - (r > me)]
      const std::size_t nrecv = reqs_.size();
      for (int step = 1; step < p; ++step) {
        const int r = (me + step) % p;
        const chunk c = chunk_of(n, p, r);
        if (c.count == 0) continue;
        quant::rng_state s = rng;
        s.stream = static_cast<std::uint32_t>(me);
        s.position = c.begin;
        Q::template compress<T>(buf + c.begin, c.count, sslot(r), s, ex);
        reqs_.push_back(x.isend(sslot(r), Q::template compressed_bytes<T>(c.count), r, tag_scatter));
      }
      if (mine.count != 0) {
        // In rank order (a fixed summation order), each part as soon as it has arrived.
        for (int r = 0; r < p; ++r) {
          if (r == me) continue;
          x.wait_all(std::span(reqs_.data() + (r - (r > me ? 1 : 0)), 1));
          Q::template decompress_add<T>(rslot(r), mine.count, buf + mine.begin, ex);
        }
        // The sum is quantized once; the owner keeps the decoded bytes, like everyone else.
        quant::rng_state s = rng;
        s.stream = static_cast<std::uint32_t>(p + me);
        s.position = mine.begin;
        Q::template compress<T>(buf + mine.begin, mine.count, sslot(me), s, ex);
        if constexpr (!Q::lossless) Q::template decompress<T>(sslot(me), mine.count, buf + mine.begin, ex);
      }
      x.wait_all(std::span(reqs_.data() + nrecv, reqs_.size() - nrecv));
      reqs_.clear();
    }

    /// Phase 3, after scatter_reduce(): every rank's compressed sum goes to every rank,
    /// which decodes it into buf. Collective.
    void allgather(T* buf, std::size_t n, X& x, std::byte* ws, quant::host_exec ex) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const std::size_t slot = slot_bytes(n, p);
      std::byte* own = ws + static_cast<std::size_t>(me) * slot;
      auto rslot = [&](int r) { return ws + static_cast<std::size_t>(p + r) * slot; };
      const std::size_t mine_bytes = Q::template compressed_bytes<T>(chunk_of(n, p, me).count);
      reqs_.clear();
      for (int r = 0; r < p; ++r) {
        if (r == me) continue;
        const chunk c = chunk_of(n, p, r);
        if (c.count != 0) reqs_.push_back(x.irecv(rslot(r), Q::template compressed_bytes<T>(c.count), r, tag_gather));
      }
      if (mine_bytes != 0)
        for (int step = 1; step < p; ++step) reqs_.push_back(x.isend(own, mine_bytes, (me + step) % p, tag_gather));
      x.wait_all(std::span(reqs_));
      reqs_.clear();
      for (int r = 0; r < p; ++r) {
        if (r == me) continue;
        const chunk c = chunk_of(n, p, r);
        if (c.count != 0) Q::template decompress<T>(rslot(r), c.count, buf + c.begin, ex);
      }
    }

    /// The values owned by rank r.
    static chunk chunk_of(std::size_t n, int p, int r) { return comm::chunk_of(n, p, r, granule); }

   private:
    static constexpr int tag_scatter = 0x6367;
    static constexpr int tag_gather = 0x6368;

    static std::size_t slot_bytes(std::size_t n, int p) {
      return round_to_line(Q::template compressed_bytes<T>(largest_chunk(n, p, granule)));
    }

    std::vector<typename X::request> reqs_;
  };
};

}  // namespace cgx::comm
