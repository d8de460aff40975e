#pragma once
/// \file hierarchical.hpp
/// `cgx::comm::hierarchical<Intra, Inter>`: a two-level allreduce for machines whose
/// links inside a node are much faster than the links between nodes.
///
/// With N nodes of L ranks each (every node must hold the same number of ranks):
///  1. within each node, an allreduce with the reducer `Intra` over the node's ranks:
///     every rank of a node then holds the node's sum. With `Intra = uncompressed`
///     (recommended: links inside a node are fast, quantizing there only costs compute
///     and accuracy) only its raw reduce-scatter half runs: local rank l gets the exact
///     node sum of chunk l, which is all step 2 needs;
///  2. the buffer is cut into L chunks at bucket boundaries; local rank l allreduces
///     chunk l with the ranks of local index l on the other nodes, with the reducer
///     `Inter`: L independent inter-node reductions of 1/L of the buffer run side by
///     side, so every rank's link to the other nodes carries 1/L of the data;
///  3. within each node, every rank sends its finished chunk to the others as raw
///     values (no quantization: the bits stay those of step 2).
///
/// Nodes come from the transport: `X::node()` (for comm::mpi, MPI's shared-memory
/// domains, or the node numbers the caller gave with comm::mpi::nodes), and the
/// inter-node groups from `X::split(local index, node index)`. Both are made once,
/// when the plan is built.
///
/// Traffic per rank between nodes: that of `Inter` on n / L values among N ranks.
/// Quantizations per element: Intra::quantizations(L) + Inter::quantizations(N); the
/// error bound follows by applying the two reducers' bounds in turn (the inter-node
/// inputs are the node sums, each carrying the intra-node error).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/rounding.hpp"
#include "chunking.hpp"
#include "uncompressed.hpp"

namespace cgx::comm {

/// A transport that can make transports over subsets of its ranks.
template <class X>
concept splittable_transport = transport<X> && requires(const X& x, int color, int key) {
  { x.split(color, key) } -> std::same_as<X>;
  { x.node() } -> std::same_as<X>;
};

/// Intra-node allreduce, inter-node allreduce of 1/L of the buffer per local rank,
/// intra-node allgather of raw values (see the file comment).
template <class Intra, class Inter>
struct hierarchical {
  static_assert(reducer<Intra>, "cgx::comm::hierarchical<Intra, Inter>: Intra must be a reducer");
  static_assert(reducer<Inter>, "cgx::comm::hierarchical<Intra, Inter>: Inter must be a reducer");

  static constexpr const char* name = "hierarchical";

  /// Upper bound of the quantizations per element for p ranks (the node layout is only
  /// known at run time; the plan's schedule reports the exact figure).
  static constexpr int quantizations(int p) { return Intra::quantizations(p) + Inter::quantizations(p); }

  template <class T, class Q, class X>
  class schedule {
    using intra_schedule = typename Intra::template schedule<T, Q, X>;
    using inter_schedule = typename Inter::template schedule<T, Q, X>;

   public:
    static constexpr std::size_t granule = granule_of<Q>;

    /// An upper bound valid for any split of p ranks into nodes.
    static std::size_t workspace_bytes(std::size_t n, int p) {
      std::size_t a = 0, b = 0;
      for (int k = 1; k <= p; ++k) {
        a = std::max(a, intra_schedule::workspace_bytes(n, k));
        b = std::max(b, inter_schedule::workspace_bytes(n, k));
      }
      return std::max(a, b);
    }

    /// Collective: splits the transport into node and inter-node groups. Throws
    /// cgx::error(errc::communicator) unless every node holds the same number of ranks.
    explicit schedule(X& x) {
      static_assert(splittable_transport<X>,
                    "cgx::comm::hierarchical needs a transport with split() and node(), e.g. cgx::comm::mpi");
      intra_x_.emplace(x.node());
      const int local = intra_x_->rank();
      const int per_node = intra_x_->size();
      // Node index: rank of the node's first rank among the node leaders.
      inter_x_.emplace(x.split(local, x.rank()));
      std::int64_t v[2] = {per_node, -per_node};
      x.max_all(v);
      if (v[0] != -v[1])
        throw error(errc::communicator, "cgx::comm::hierarchical: nodes hold different numbers of ranks (between " +
                                            std::to_string(-v[1]) + " and " + std::to_string(v[0]) +
                                            "); give every node the same number of ranks");
      intra_.emplace(*intra_x_);
      inter_.emplace(*inter_x_);
    }

    /// Ranks per node and number of nodes.
    int ranks_per_node() const { return intra_x_->size(); }
    int nodes() const { return inter_x_->size(); }
    /// Quantizations per element of this layout.
    int quantizations() const { return Intra::quantizations(ranks_per_node()) + Inter::quantizations(nodes()); }

    /// In place sum over all ranks of buf[0..n). Collective.
    void run(T* buf, std::size_t n, X&, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      if (n == 0) return;
      const int L = intra_x_->size();
      const int l = intra_x_->rank();
      // 1. Node sum (of this rank's chunk only, when Intra can reduce-scatter).
      if constexpr (requires { intra_->reduce_scatter(buf, n, *intra_x_, ws, ex); }) {
        static_assert(intra_schedule::granule == granule, "hierarchical: Intra must cut chunks like the plan");
        intra_->reduce_scatter(buf, n, *intra_x_, ws, ex);
      } else {
        quant::rng_state r1 = rng;
        r1.seed = rng.seed ^ 0x1f83d9abfb41bd6bull;
        intra_->run(buf, n, *intra_x_, ws, r1, ex);
      }
      // 2. Chunk l across nodes (its own random stream: a different seed).
      const chunk mine = chunk_of(n, L, l, granule);
      if (mine.count != 0) {
        quant::rng_state r2 = rng;
        r2.seed = rng.seed ^ 0x5be0cd19137e2179ull;
        r2.position = rng.position + mine.begin;
        inter_->run(buf + mine.begin, mine.count, *inter_x_, ws, r2, ex);
      }
      // 3. Share the finished chunks within the node, as raw values.
      if (L > 1) {
        reqs_.clear();
        for (int k = 0; k < L; ++k) {
          if (k == l) continue;
          const chunk c = chunk_of(n, L, k, granule);
          if (c.count != 0) reqs_.push_back(intra_x_->irecv(buf + c.begin, c.count * sizeof(T), k, tag_share));
        }
        if (mine.count != 0)
          for (int k = 0; k < L; ++k)
            if (k != l) reqs_.push_back(intra_x_->isend(buf + mine.begin, mine.count * sizeof(T), k, tag_share));
        intra_x_->wait_all(std::span(reqs_));
      }
    }

   private:
    static constexpr int tag_share = 0x6380;
    std::optional<X> intra_x_, inter_x_;
    std::optional<intra_schedule> intra_;
    std::optional<inter_schedule> inter_;
    std::vector<typename X::request> reqs_;
  };
};

}  // namespace cgx::comm
