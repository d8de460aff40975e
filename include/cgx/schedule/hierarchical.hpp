#pragma once
/// \file schedule/hierarchical.hpp
/// The description of comm::hierarchical<Intra, Inter> on N nodes of L ranks each, as
/// far as it is hierarchical's own: the cut, the groups, the crossed two-node exchange,
/// the fused node sum and the share; the intra- and inter-node reducers bring their own
/// descriptions (the inter one on chunk_of(l).count values among N ranks).
///
/// Ranks: rank (node, l) is node * L + l here (the executor gets node and local index
/// from the transport; any numbering that keeps the order within a node and within a
/// group describes the same schedule).
///  - The buffer is cut into L chunks at the granule; local rank l takes chunk l across
///    nodes with the ranks (node', l): group l, inter rank = node.
///  - Random keys: the inter-node step uses seed ^ inter_seed, positions offset by the
///    chunk's first value; an Intra that runs whole (not a reduce-scatter) seed ^ intra_seed.
///  - Crossed (N = 2, Inter symmetric at two, largest chunk >= cross_min_bytes raw): the
///    groups l < L - L % 2; group l's owner is node l % 2. Each chunk is cut into
///    cross_pieces pieces at the granule; the other node compresses piece k (key (node,
///    first value)) and sends it (phase cross), the owner adds it, compresses the sum
///    (key (2 + node, first value)), decodes it, and after the last piece sends all
///    sums back (phase back). Out slot at 0, in slot at round_to_line(cross_slot(m)).
///  - Fused (Intra = uncompressed and some group crossed): the node's raw parts of
///    piece k of chunk l travel to l as separate messages (phase node), into part slot j
///    at fused_parts_offset + j * raw_slot + the piece's raw offset; l adds them in rank order.
///  - Share: l sends its finished chunk to the other ranks of the node, raw into their
///    buffers, or (crossed group, lossy wire) the compressed sums into share slot 2 + l.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common.hpp"

namespace cgx::schedule {

/// Hierarchical on N nodes of L ranks (see the file comment).
struct hierarchical {
  static constexpr std::uint64_t intra_seed = 0x1f83d9abfb41bd6bull;  ///< xor'ed into the seed of a whole Intra run
  static constexpr std::uint64_t inter_seed = 0x5be0cd19137e2179ull;  ///< xor'ed into the seed of the inter-node step
  static constexpr std::size_t cross_min_bytes = std::size_t{2} << 20;    ///< raw chunk bytes from which groups cross
  static constexpr std::size_t cross_max_pieces = 8;                      ///< most pieces of a crossed chunk
  static constexpr std::size_t cross_piece_bytes = std::size_t{1} << 20;  ///< raw input per crossed piece, at least

  std::size_t n;           ///< values
  int N;                   ///< nodes
  int L;                   ///< ranks per node
  std::size_t granule;     ///< chunk and piece boundaries fall on multiples of this
  std::size_t value_size;  ///< bytes per value
  size_fn wire;            ///< compressed size of a count in the crossed exchange (raw when Inter does not quantize)
  bool wire_lossless;      ///< whether the crossed exchange's codec is lossless (then the share is raw)
  bool inter_symmetric;    ///< Inter declares symmetric_at_two
  bool intra_uncompressed; ///< Intra is comm::uncompressed (reduce-scatter only; fused when crossed)

  constexpr int rank(int node, int l) const { return node * L + l; }  ///< the rank of (node, l)
  constexpr chunk chunk_of(int l) const { return comm::chunk_of(n, L, l, granule); }  ///< what l takes across nodes

  /// Groups that run crossed in this call: L - L % 2 on two nodes for large chunks, else 0.
  constexpr int crossed_groups() const {
    if (!inter_symmetric || N != 2) return 0;
    return comm::largest_chunk(n, L, granule) * value_size >= cross_min_bytes ? L - L % 2 : 0;
  }
  constexpr bool crossed(int l) const { return l < crossed_groups(); }  ///< whether group l runs crossed
  static constexpr int owner(int l) { return l % 2; }                    ///< node that sums crossed group l
  constexpr bool fused() const { return intra_uncompressed && crossed_groups() > 0; }  ///< steps 1 and 2 fused
  constexpr bool packed_share(int l) const { return !wire_lossless && crossed(l); }    ///< share l's chunk compressed

  /// Pieces of a crossed chunk of m values.
  constexpr std::size_t cross_pieces(std::size_t m) const {
    return std::clamp<std::size_t>(m * value_size / cross_piece_bytes, 1, cross_max_pieces);
  }
  /// Values of piece k of m values (relative to the chunk).
  constexpr chunk piece_values(std::size_t m, std::size_t k) const {
    return comm::chunk_of(m, static_cast<int>(cross_pieces(m)), static_cast<int>(k), granule);
  }
  /// Offset of piece k's bytes in a crossed slot.
  constexpr std::size_t piece_offset(std::size_t m, std::size_t k) const {
    std::size_t off = 0;
    for (std::size_t j = 0; j < k; ++j) off += wire(piece_values(m, j).count);
    return off;
  }
  /// Bytes of all pieces of m values.
  constexpr std::size_t cross_slot(std::size_t m) const { return piece_offset(m, cross_pieces(m)); }
  /// Bytes of a share slot.
  constexpr std::size_t share_slot() const { return comm::round_to_line(cross_slot(comm::largest_chunk(n, L, granule))); }
  /// Raw bytes of a fused part slot.
  constexpr std::size_t raw_slot() const { return comm::round_to_line(comm::largest_chunk(n, L, granule) * value_size); }
  /// Workspace offset of the fused parts: after the crossed exchange's two slots.
  constexpr std::size_t fused_parts_offset() const { return 2 * share_slot(); }
  /// Workspace offset of the crossed exchange's receive slot for group l.
  constexpr std::size_t cross_in(int l) const { return comm::round_to_line(cross_slot(chunk_of(l).count)); }

  /// Key (relative to the inter-node step's position, i.e. to the call's base) of
  /// node's compression of piece k of crossed group l: a contribution, or the owner's sum.
  constexpr key cross_key(int node, int l, std::size_t k) const {
    const chunk c = chunk_of(l);
    return {static_cast<std::uint32_t>(node == owner(l) ? 2 + node : node), c.begin + piece_values(c.count, k).begin};
  }

  /// Rank (node, l)'s own messages (node, cross, back, share), in posting order; the
  /// Intra and Inter reducers' messages are theirs.
  template <class F>
  constexpr void messages(int node, int l, F&& f) const {
    if (n == 0) return;
    const int me = rank(node, l);
    const chunk mine = chunk_of(l);
    if (fused()) {
      if (mine.count != 0)
        for (int r = 0, j = 0; r < L; ++r) {
          if (r == l) continue;
          for (std::size_t k = 0; k < cross_pieces(mine.count); ++k) {
            const chunk pv = piece_values(mine.count, k);
            f(message{phase::node, static_cast<int>(k), rank(node, r), me, {mine.begin + pv.begin, pv.count}, pv.count * value_size,
                      fused_parts_offset() + static_cast<std::size_t>(j) * raw_slot() + pv.begin * value_size});
          }
          ++j;
        }
      for (std::size_t k = 0; k < cross_max_pieces; ++k)
        for (int s = 1; s < L; ++s) {
          const int r = (l + s) % L;
          const chunk c = chunk_of(r);
          if (c.count == 0 || k >= cross_pieces(c.count)) continue;
          const chunk pv = piece_values(c.count, k);
          f(message{phase::node, static_cast<int>(k), me, rank(node, r), {c.begin + pv.begin, pv.count}, pv.count * value_size, in_buffer});
        }
    }
    if (crossed(l) && mine.count != 0) {
      const int other = rank(1 - node, l);
      const std::size_t K = cross_pieces(mine.count);
      auto pc = [&](std::size_t k) {
        const chunk pv = piece_values(mine.count, k);
        return chunk{mine.begin + pv.begin, pv.count};
      };
      if (node != owner(l)) {
        for (std::size_t k = 0; k < K; ++k)
          f(message{phase::back, 2, other, me, pc(k), wire(pc(k).count), cross_in(l) + piece_offset(mine.count, k)});
        for (std::size_t k = 0; k < K; ++k)
          f(message{phase::cross, 1, me, other, pc(k), wire(pc(k).count), piece_offset(mine.count, k)});
      } else {
        for (std::size_t k = 0; k < K; ++k)
          f(message{phase::cross, 1, other, me, pc(k), wire(pc(k).count), cross_in(l) + piece_offset(mine.count, k)});
        for (std::size_t k = 0; k < K; ++k)
          f(message{phase::back, 2, me, other, pc(k), wire(pc(k).count), piece_offset(mine.count, k)});
      }
    }
    if (L > 1) {
      for (int k = 0; k < L; ++k) {
        const chunk c = chunk_of(k);
        if (k == l || c.count == 0) continue;
        if (packed_share(k))
          f(message{phase::share, 3, rank(node, k), me, c, cross_slot(c.count), static_cast<std::size_t>(2 + k) * share_slot()});
        else
          f(message{phase::share, 3, rank(node, k), me, c, c.count * value_size, in_buffer});
      }
      if (mine.count != 0)
        for (int k = 0; k < L; ++k) {
          if (k == l) continue;
          // A packed share is sent from where the group's compressed sum lies: the owner's
          // out slot, the other node's in slot.
          if (packed_share(l))
            f(message{phase::share, 3, me, rank(node, k), mine, cross_slot(mine.count), node == owner(l) ? 0 : cross_in(l)});
          else
            f(message{phase::share, 3, me, rank(node, k), mine, mine.count * value_size, in_buffer});
        }
    }
  }

  /// Rank (node, l)'s compressions in the crossed exchange.
  template <class F>
  constexpr void compressions(int node, int l, F&& f) const {
    const chunk mine = chunk_of(l);
    if (n == 0 || !crossed(l) || mine.count == 0) return;
    for (std::size_t k = 0; k < cross_pieces(mine.count); ++k) {
      const chunk pv = piece_values(mine.count, k);
      f(compression{node == owner(l) ? phase::sum : phase::cross, 1, {mine.begin + pv.begin, pv.count}, cross_key(node, l, k),
                    piece_offset(mine.count, k)});
    }
  }

  /// The ranges rank (node, l) ends with: its own chunk (from Inter or the crossed
  /// exchange), then the others' chunks from the share.
  template <class F>
  constexpr void results(int node, int l, F&& f) const {
    if (n == 0) return;
    (void)node;
    if (chunk_of(l).count != 0) f(chunk_of(l));
    for (int k = 0; k < L; ++k)
      if (k != l && chunk_of(k).count != 0) f(chunk_of(k));
  }
};

}  // namespace cgx::schedule
