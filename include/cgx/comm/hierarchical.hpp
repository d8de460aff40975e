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
///     values (no quantization: the bits stay those of step 2; but see below for two
///     nodes).
///
/// Two nodes (N = 2) are special: there an `Inter` of ring, scatter_reduce_allgather,
/// tree or uncompressed is a symmetric exchange, both ranks of a pair sending to each
/// other at once. Over Open MPI's TCP transport such a pair gets about 2/3 of a full-
/// duplex link each way: the rendezvous handshake of one direction's messages waits
/// behind the other direction's bulk data on the same connection (measured on
/// bench/netns-cluster: a 2 x 2 exchange of 32 MiB each way took 820-870 ms against
/// 560-580 ms for the same bytes sent by different pairs in the two directions, or as
/// eager-sized messages; plain TCP sockets carry both directions at the link's rate).
/// So on two nodes, for chunks of at least `cross_min_bytes`, the groups are paired and
/// crossed: group l's chunk is reduced on node l mod 2. The other node sends its
/// compressed chunk there (piece by piece, compressing as it sends); the owner adds each
/// piece as it arrives and quantizes the sum, and only when all pieces are in does it
/// send the sum back, which the other node decodes. Groups 2i and 2i + 1 run in
/// opposite directions, so each direction of the link is busy with one group's bytes
/// while no pair ever sends both ways at once. The bytes per direction are those of
/// the symmetric exchange (the compressed chunk), the quantizations the same (2 on the
/// sender's contribution, 1 on the owner's; none for uncompressed), and every rank
/// ends with the owner's bits. With L odd the last group has no partner and runs
/// `Inter` as is. `crossed(n)` tells whether this rank's group is crossed.
/// When the groups are crossed, two more things change:
///  - with Intra = uncompressed, steps 1 and 2 run fused, piece by piece: a rank adds
///    the node's parts of piece k of its chunk (in rank order, as uncompressed does)
///    and sends it on while the node's ranks still exchange the later pieces;
///  - under a lossy quantizer, step 3 moves the compressed sums instead of raw values
///    (1/ratio of the bytes through the node); the receivers decode the bytes the
///    group decoded, so the bits are the same.

/// Nodes come from the transport: `X::node()` (for comm::mpi, MPI's shared-memory
/// domains, or the node numbers the caller gave with comm::mpi::nodes), and the
/// inter-node groups from `X::split(local index, node index)`. Both are made once,
/// when the plan is built.
///
/// Traffic per rank between nodes: that of `Inter` on n / L values among N ranks.
/// Quantizations per element: Intra::quantizations(L) + Inter::quantizations(N); the
/// error bound follows by applying the two reducers' bounds in turn (the inter-node
/// inputs are the node sums, each carrying the intra-node error).
///
/// The cut, the groups, the crossed pieces, the workspace slots, the random keys and the
/// messages of hierarchical's own steps (node, cross, back, share) are those of the
/// description schedule::hierarchical (schedule/hierarchical.hpp); this file runs it.

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../concepts.hpp"
#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../quant/host_exec.hpp"
#include "../quant/rounding.hpp"
#include "../quant/none.hpp"
#include "../schedule/hierarchical.hpp"
#include "chunking.hpp"
#include "uncompressed.hpp"
#include "../detail/tags.hpp"

namespace cgx::comm {

/// A transport that can make transports over subsets of its ranks.
template <class X>
concept splittable_transport = transport<X> && requires(const X& x, int color, int key) {
  { x.split(color, key) } -> std::same_as<X>;
  { x.node() } -> std::same_as<X>;
};

/// Whether reducer R, run on two ranks, is a symmetric exchange (each rank sends the
/// other half of the buffer, both at once, and they end with the same bits): R declares
/// `static constexpr bool symmetric_at_two = true`. hierarchical<Intra, R> then crosses
/// its groups on two nodes (see hierarchical.hpp).
template <class R>
inline constexpr bool symmetric_at_two = requires { requires R::symmetric_at_two; };

/// Intra-node allreduce, inter-node allreduce of 1/L of the buffer per local rank,
/// intra-node allgather of raw values (see the file comment).
template <class Intra, class Inter>
struct hierarchical {
  static_assert(reducer<Intra>, "cgx::comm::hierarchical<Intra, Inter>: Intra must be a reducer");
  static_assert(reducer<Inter>, "cgx::comm::hierarchical<Intra, Inter>: Inter must be a reducer");

  static constexpr const char* name = "hierarchical";  ///< the reducer's name (benchmarks, plan signatures)

  /// Upper bound of the quantizations per element for p ranks (the node layout is only
  /// known at run time; the plan's schedule reports the exact figure).
  static constexpr int quantizations(int p) { return Intra::quantizations(p) + Inter::quantizations(p); }

  /// The schedule for values T, quantizer Q and transport X; the plan owns the workspace.
  template <class T, class Q, class X>
  class schedule {
    using intra_schedule = typename Intra::template schedule<T, Q, X>;
    using inter_schedule = typename Inter::template schedule<T, Q, X>;
    using description = ::cgx::schedule::hierarchical;

   public:
    static constexpr std::size_t granule = granule_of<Q>;  ///< chunk boundaries fall on multiples of this many values

    /// An upper bound valid for any split of p ranks into nodes.
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      cgx::detail::check_raw_bytes(n, sizeof(T));
      std::size_t a = 0, b = 0;
      for (int k = 1; k <= p; ++k) {
        a = std::max(a, intra_schedule::workspace_bytes(n, k));
        b = std::max(b, inter_schedule::workspace_bytes(n, k));
      }
      return std::max({a, b, crossed_bytes(n, p)});
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
    /// Number of nodes (ranks of the inter-node transport).
    int nodes() const { return inter_x_->size(); }
    /// Quantizations per element of this layout.
    int quantizations() const { return Intra::quantizations(ranks_per_node()) + Inter::quantizations(nodes()); }
    /// Whether a call on n values runs this rank's inter-node group as the crossed
    /// two-node exchange instead of `Inter` (see the file comment).
    bool crossed(std::size_t n) const { return describe(n).crossed(intra_x_->rank()); }

    /// The crossed exchange runs only for chunks of at least this many bytes (raw, per
    /// group): below, its two one-way rounds of larger messages cost more latency than
    /// the shared link loses (on bench/netns-cluster at 1 MiB: 1.4 ms against 1.1 for
    /// the ring; equal at 4 MiB; 30.7 against 35.9 ms at 16 MiB, 142 against 169 at 64).
    static constexpr std::size_t cross_min_bytes = description::cross_min_bytes;

    /// The node and inter-node transports follow the plan's, call by call: its wait
    /// limit, integrity option (plan_options::timeout_ms, verify) and call context
    /// (the in-band headers), where the transport has them.
    static void inherit(X& sub, const X& parent) {
      if constexpr (requires { sub.set_wait_limit(parent.wait_limit_value()); })
        sub.set_wait_limit(parent.wait_limit_value());
      if constexpr (requires { sub.set_verify(parent.verify()); }) sub.set_verify(parent.verify());
      if constexpr (requires { sub.begin_call(parent.context()); }) sub.begin_call(parent.context());
    }

    /// In place sum over all ranks of buf[0..n). Collective.
    ///
    /// Failures: a rank waits on the node or the inter-node transport, and hears of a
    /// failure only on the one it waits on. So a rank whose call fails, or that hears of a
    /// failure, tells the peers of all three (node, inter-node, the plan's): then every
    /// rank that waits for it hears it, and, rank by rank, every rank that waits for those.
    void run(T* buf, std::size_t n, X& x, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      if (n == 0) return;
      inherit(*intra_x_, x);
      inherit(*inter_x_, x);
      try {
        steps(buf, n, ws, rng, ex);
      } catch (const cgx::error& e) {
        if constexpr (requires { x.abort(e.code(), std::string()); }) {
          intra_x_->abort(e.code(), e.what());
          inter_x_->abort(e.code(), e.what());
          x.abort(e.code(), e.what());
        }
        throw;
      }
    }

   private:
    void steps(T* buf, std::size_t n, std::byte* ws, const quant::rng_state& rng, quant::host_exec ex) {
      const description d = describe(n);
      const int L = d.L;
      const int l = intra_x_->rank();
      const int node = inter_x_->rank();
      // With Intra = uncompressed and crossed groups, steps 1 and 2 run fused, piece by
      // piece: the node sum of piece k is ready (and on its way to the other node) while
      // the ranks of the node still exchange the later pieces. The choice is node-wide
      // (every local rank must post the same messages): with L odd the last, uncrossed
      // group takes part in the fused step 1 and sums all its pieces before running Inter.
      const bool fuse = d.fused();
      const chunk mine = d.chunk_of(l);
      // 1. Node sum (of this rank's chunk only, when Intra can reduce-scatter).
      if (fuse) {
        node_recv_.clear();
        node_send_.clear();
        post(d, node, l, ::cgx::schedule::phase::node, buf, ws, node_recv_, node_send_, tag_node);
      } else if constexpr (requires { intra_->reduce_scatter(buf, n, *intra_x_, ws, ex); }) {
        static_assert(intra_schedule::granule == granule, "hierarchical: Intra must cut chunks like the plan");
        intra_->reduce_scatter(buf, n, *intra_x_, ws, ex);
      } else {
        quant::rng_state r1 = rng;
        r1.seed = rng.seed ^ description::intra_seed;
        intra_->run(buf, n, *intra_x_, ws, r1, ex);
      }
      // 2. Chunk l across nodes (its own random stream: a different seed).
      if (mine.count != 0) {
        quant::rng_state r2 = rng;
        r2.seed = rng.seed ^ description::inter_seed;
        // Adds the node's other parts of piece k of my chunk, in rank order (fused only):
        // node_recv_ holds them part by part, piece by piece, as the description posts them.
        const std::size_t K = d.cross_pieces(mine.count);
        auto node_sum = [&](std::size_t k) {
          if (!fuse) return;
          const chunk pv = d.piece_values(mine.count, k);
          for (std::size_t j = 0; j + 1 < static_cast<std::size_t>(L); ++j) {
            intra_x_->wait_all(std::span(node_recv_.data() + j * K + k, 1));
            quant::none::template decompress_add<T>(ws + d.fused_parts_offset() + j * d.raw_slot() + pv.begin * sizeof(T),
                                                     pv.count, buf + mine.begin + pv.begin, ex);
          }
        };
        if (!d.crossed(l)) {
          for (std::size_t k = 0; fuse && k < K; ++k) node_sum(k);
          r2.position = rng.position + mine.begin;
          inter_->run(buf + mine.begin, mine.count, *inter_x_, ws, r2, ex);
        } else {
          cross(d, node, l, buf, ws, r2, ex, node_sum);
        }
      }
      if (fuse) intra_x_->wait_all(std::span(node_send_));  // buf is written again below
      // 3. Share the finished chunks within the node: as raw values, or, for the chunks
      // of crossed groups under a lossy quantizer, as the compressed sum every rank of
      // the group decoded (the receiver decodes the same bytes: the same bits, 1/ratio
      // of the bytes through the node), sent from where cross() left it.
      if (L > 1) {
        reqs_.clear();
        post(d, node, l, ::cgx::schedule::phase::share, buf, ws, reqs_, reqs_, tag_share);
        intra_x_->wait_all(std::span(reqs_));
        d.messages(node, l, [&](const ::cgx::schedule::message& m) {
          if (m.ph == ::cgx::schedule::phase::share && m.from != d.rank(node, l) && m.offset != ::cgx::schedule::in_buffer)
            unpack(d, ws + m.offset, m.values.count, buf + m.values.begin, ex);
        });
      }
    }

    static constexpr int tag_share = cgx::detail::tag_value(cgx::detail::tag::hier_share);
    static constexpr int tag_cross = cgx::detail::tag_value(cgx::detail::tag::hier_cross);  // to the owner
    static constexpr int tag_back = cgx::detail::tag_value(cgx::detail::tag::hier_back);   // the sum, from the owner
    static constexpr int tag_node = cgx::detail::tag_value(cgx::detail::tag::hier_node);   // fused step 1: a piece of the node sum

    /// What the crossed exchange sends: the plan's quantizer, or raw values when Inter
    /// does not quantize.
    using wire_q = std::conditional_t<Inter::quantizations(2) == 0, quant::none, Q>;

    /// The description of a call on n values on N nodes of L ranks.
    static constexpr description describe(std::size_t n, int N, int L) {
      return {n, N, L, granule, sizeof(T), &wire_q::template compressed_bytes<T>, wire_q::lossless, symmetric_at_two<Inter>,
              std::is_same_v<Intra, uncompressed>};
    }
    /// The description of a call on n values with this plan's layout.
    description describe(std::size_t n) const { return describe(n, nodes(), ranks_per_node()); }

    /// Posts rank (node, l)'s messages of phase ph on the node transport, in the
    /// description's order: receives into `recvs`, sends into `sends`.
    void post(const description& d, int node, int l, ::cgx::schedule::phase ph, T* buf, std::byte* ws,
              std::vector<typename X::request>& recvs, std::vector<typename X::request>& sends, int tag) {
      const int me = d.rank(node, l);
      d.messages(node, l, [&](const ::cgx::schedule::message& m) {
        if (m.ph != ph) return;
        void* at = m.offset == ::cgx::schedule::in_buffer ? static_cast<void*>(buf + m.values.begin) : ws + m.offset;
        if (m.to == me)
          recvs.push_back(intra_x_->irecv(at, m.bytes, m.from % d.L, tag));
        else
          sends.push_back(intra_x_->isend(at, m.bytes, m.to % d.L, tag));
      });
    }

    /// Decodes the pieces of m values (a crossed slot) into out[0..m).
    static void unpack(const description& d, const std::byte* in, std::size_t m, T* out, quant::host_exec ex) {
      for (std::size_t k = 0, off = 0; k < d.cross_pieces(m); ++k) {
        const chunk pv = d.piece_values(m, k);
        wire_q::template decompress<T>(in + off, pv.count, out + pv.begin, ex);
        off += d.wire(pv.count);
      }
    }

    /// Workspace of the crossed exchange (a send and a receive slot for the chunk of a
    /// group), of the fused node sum (a raw slot per other local rank) and of the
    /// compressed share (a slot per local rank), for any L >= 2.
    static std::size_t crossed_bytes(std::size_t n, int p) {
      if constexpr (!symmetric_at_two<Inter>) {
        return 0;
      } else {
        std::size_t most = 0;
        for (int L = 2; L <= p; ++L) {
          const description d = describe(n, 2, L);
          const std::size_t fused =
              cgx::detail::checked_add(d.fused_parts_offset(), cgx::detail::checked_mul(static_cast<std::size_t>(L - 1), d.raw_slot()));
          const std::size_t packed = wire_q::lossless ? 0 : cgx::detail::checked_mul(static_cast<std::size_t>(L + 2), d.share_slot());
          most = std::max({most, fused, packed});
        }
        return most;
      }
    }

    /// The crossed two-node exchange of group l's chunk of buf with the other node's rank
    /// of the group (see the file comment), in d's pieces, slots and keys; the inter-node
    /// seed is rng's. Leaves the compressed sum, which every rank of the group decoded
    /// into buf, in ws: in the owner's out slot, the other node's in slot.
    template <class NodeSum>
    void cross(const description& d, int node, int l, T* buf, std::byte* ws, const quant::rng_state& rng,
                           quant::host_exec ex, NodeSum&& node_sum) {
      X& x = *inter_x_;
      const int other = 1 - node;
      const chunk mine = d.chunk_of(l);
      T* const v = buf + mine.begin;
      const std::size_t K = d.cross_pieces(mine.count);
      std::byte* const out = ws;
      std::byte* const in = ws + d.cross_in(l);
      auto values = [&](std::size_t k) { return d.piece_values(mine.count, k); };
      auto offset = [&](std::size_t k) { return d.piece_offset(mine.count, k); };
      auto bytes = [&](std::size_t k) { return d.wire(values(k).count); };
      auto key = [&](std::size_t k) { return ::cgx::schedule::keyed(rng, d.cross_key(node, l, k)); };
      cross_recv_.clear();
      cross_send_.clear();
      if (node != description::owner(l)) {
        // Post the receives of the sums, then compress and send piece by piece.
        for (std::size_t k = 0; k < K; ++k) cross_recv_.push_back(x.irecv(in + offset(k), bytes(k), other, tag_back));
        for (std::size_t k = 0; k < K; ++k) {
          node_sum(k);
          wire_q::template compress<T>(v + values(k).begin, values(k).count, out + offset(k), key(k), ex);
          cross_send_.push_back(x.isend(out + offset(k), bytes(k), other, tag_cross));
          comm::progress(x);  // let the pieces sent so far move while the next one is compressed
        }
        for (std::size_t k = 0; k < K; ++k) {
          x.wait_all(std::span(cross_recv_.data() + k, 1));
          wire_q::template decompress<T>(in + offset(k), values(k).count, v + values(k).begin, ex);
        }
        x.wait_all(std::span(cross_send_));
        return;
      }
      for (std::size_t k = 0; k < K; ++k) cross_recv_.push_back(x.irecv(in + offset(k), bytes(k), other, tag_cross));
      // Add each piece as it arrives and quantize its sum at once (the owner keeps the
      // decoded bytes, like the other node), but send nothing back before the last piece
      // is in: then the pair's connection carries one direction at a time.
      for (std::size_t k = 0; k < K; ++k) {
        node_sum(k);
        x.wait_all(std::span(cross_recv_.data() + k, 1));
        wire_q::template decompress_add<T>(in + offset(k), values(k).count, v + values(k).begin, ex);
        comm::progress(x);  // answer the next pieces' senders between the passes
        wire_q::template compress<T>(v + values(k).begin, values(k).count, out + offset(k), key(k), ex);
        comm::progress(x);
        if constexpr (!wire_q::lossless) wire_q::template decompress<T>(out + offset(k), values(k).count, v + values(k).begin, ex);
      }
      for (std::size_t k = 0; k < K; ++k) cross_send_.push_back(x.isend(out + offset(k), bytes(k), other, tag_back));
      x.wait_all(std::span(cross_send_));
    }

    std::optional<X> intra_x_, inter_x_;
    std::vector<typename X::request> cross_recv_, cross_send_, node_recv_, node_send_;
    std::optional<intra_schedule> intra_;
    std::optional<inter_schedule> inter_;
    std::vector<typename X::request> reqs_;
  };
};

}  // namespace cgx::comm
