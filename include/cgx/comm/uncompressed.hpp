#pragma once
/// \file uncompressed.hpp
/// `cgx::comm::uncompressed`: an exact allreduce that never quantizes, whatever the
/// plan's quantizer: a direct reduce-scatter of raw values, then a raw allgather.
///
/// Its use is inside a node, as the `Intra` of `hierarchical<uncompressed, Inter>`:
/// shared memory or PCIe inside a node is rarely the bottleneck, so quantizing there
/// costs compute and accuracy for nothing, and the hierarchical schedule then needs only
/// the reduce-scatter half (each local rank gets the node sum of the chunk it takes
/// across nodes).
///
/// The buffer is cut into p chunks at the quantizer's granule (as SRA does); rank o
/// receives chunk o of every other rank and adds them to its own, in rank order.
/// Traffic per rank: 2 (p - 1)/p * n * sizeof(T) sent (half in each phase), in
/// 2 (p - 1) messages. Quantizations per element: 0; the result is the sum in rank
/// order, computed by the chunk's owner and copied to the others (identical bits).
/// The chunks, peers, workspace slots and summation order are those of the description
/// schedule::direct_reduce_scatter (schedule/direct_reduce_scatter.hpp); this file runs it.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../concepts.hpp"
#include "../detail/checked.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/rounding.hpp"
#include "chunking.hpp"
#include "schedule_base.hpp"
#include "../detail/tags.hpp"
#include "../schedule/direct_reduce_scatter.hpp"

namespace cgx::comm {

/// Exact direct reduce-scatter + allgather (see the file comment).
struct uncompressed {
  static constexpr const char* name = "uncompressed";  ///< the reducer's name (benchmarks, plan signatures)

  /// Quantizations an element goes through: none.
  static constexpr int quantizations(int) { return 0; }

  /// On two ranks each sends the other half of the buffer, both at once (see
  /// comm::symmetric_at_two; hierarchical crosses such groups on two nodes).
  static constexpr bool symmetric_at_two = true;

  /// The schedule for values T, quantizer Q and transport X; the plan owns the workspace.
  template <class T, class Q, class X>
  class schedule : public detail::schedule_base<T, Q> {
   public:

    /// Bytes of workspace for up to n values on p ranks: the p - 1 incoming parts of
    /// this rank's chunk (schedule::direct_reduce_scatter's part slots).
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      return base::workspace(n, [&]() -> std::size_t {
        return p <= 1 ? 0 : cgx::detail::checked_mul(description::slots(p), description::make(n, p, granule_of<Q>, sizeof(T)).slot);
      });
    }

    /// Binds to the plan's transport; allocates only its own request lists.
    explicit schedule(X& x) { reqs_.reserve(2 * static_cast<std::size_t>(x.size())); }

    /// In place sum over all ranks of buf[0..n). Collective.
    void run(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state&, quant::host_exec ex) {
      reduce_scatter(buf, n, x, ws, ex);
      allgather(buf, n, x);
    }

    /// Leaves in buf[chunk_of(n, p, rank)] the sum over all ranks of that chunk; the rest
    /// of buf is unspecified. Collective. Chunks, peers, part slots and the order of sums:
    /// schedule::direct_reduce_scatter.
    void reduce_scatter(T* buf, std::size_t n, X& x, std::byte* ws, quant::host_exec ex) {
      phase(n, x, [&](int p, int me, const description& d, const chunk mine) {
        if (mine.count != 0)
          for (int r = 0; r < p; ++r)
            if (r != me) reqs_.push_back(x.irecv(ws + d.part_slot(me, r), mine.count * sizeof(T), r, tag_scatter));  // reqs_[r - (r > me)]
        const std::size_t nrecv = reqs_.size();
        for (int step = 1; step < p; ++step) {
          const int r = d.to(me, step);
          const chunk c = d.chunk_of(r);
          if (c.count != 0) reqs_.push_back(x.isend(buf + c.begin, c.count * sizeof(T), r, tag_scatter));
        }
        if (mine.count != 0) {
          for (int i = 0; i + 1 < p; ++i) {
            const int r = description::addend(me, i);
            x.wait_all(std::span(reqs_.data() + (r - (r > me ? 1 : 0)), 1));
            quant::none::template decompress_add<T>(ws + d.part_slot(me, r), mine.count, buf + mine.begin, ex);
          }
        }
        x.wait_all(std::span(reqs_.data() + nrecv, reqs_.size() - nrecv));
      });
    }

    /// Copies every rank's chunk to all ranks. Collective.
    void allgather(T* buf, std::size_t n, X& x) {
      phase(n, x, [&](int p, int me, const description& d, const chunk mine) {
        for (int r = 0; r < p; ++r) {
          if (r == me) continue;
          const chunk c = d.chunk_of(r);
          if (c.count != 0) reqs_.push_back(x.irecv(buf + c.begin, c.count * sizeof(T), r, tag_gather));
        }
        if (mine.count != 0)
          for (int step = 1; step < p; ++step) reqs_.push_back(x.isend(buf + mine.begin, mine.count * sizeof(T), d.to(me, step), tag_gather));
        x.wait_all(std::span(reqs_));
      });
    }

    /// The values owned by rank r.
    static chunk chunk_of(std::size_t n, int p, int r) { return comm::chunk_of(n, p, r, granule_of<Q>); }

   private:
    using base = detail::schedule_base<T, Q>;
    using description = ::cgx::schedule::direct_reduce_scatter;

    static constexpr int tag_scatter = cgx::detail::tag_value(cgx::detail::tag::uncompressed_scatter);
    static constexpr int tag_gather = cgx::detail::tag_value(cgx::detail::tag::uncompressed_gather);

    // Starts one phase of reduce_scatter() and allgather() on n values over x: nothing on one
    // rank or for n = 0; otherwise body(p, me, d, mine) with this rank's chunk and the
    // request list cleared.
    template <class Body>
    void phase(std::size_t n, X& x, Body&& body) {
      const int p = x.size();
      const int me = x.rank();
      if (p == 1 || n == 0) return;
      const description d = description::make(n, p, granule_of<Q>, sizeof(T));
      reqs_.clear();
      body(p, me, d, d.chunk_of(me));
    }

    std::vector<typename X::request> reqs_;
  };
};

}  // namespace cgx::comm
