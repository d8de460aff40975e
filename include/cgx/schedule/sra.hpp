#pragma once
/// \file schedule/sra.hpp
/// The description of scatter-reduce-allgather (SRA), run by
/// comm::scatter_reduce_allgather (pipelined `run`, and `scatter_reduce` + `allgather`).
///
/// The buffer is cut into p chunks at multiples of the granule (comm::chunk_of); rank o
/// owns chunk o. Each chunk is cut into K pieces, again at the granule (K from n and p
/// only: `pieces`, 1 for the two-phase form); piece k of a chunk lies in a workspace
/// slot at the sum of the compressed sizes of pieces 0..k-1.
///  - scatter: rank r compresses piece k of chunk o (o = r + s mod p, s = 1..p-1, k
///    outer) with key (stream r, position = the piece's first value) into its send
///    slot o and sends it to o, which receives it in its receive slot r;
///  - sum: o adds the p - 1 decoded parts to its own, in rank order (rank_order_skipping),
///    compresses the sum once with key (stream p + o, position = the piece's first value)
///    into its send slot o, and decodes it into its own buffer (lossy quantizers);
///  - gather: o sends that slot to o + s (s = 1..p-1); rank r receives o's sum in its
///    gather slot o (2p + o pipelined, p + o two-phase: the receive slots again) and
///    decodes the others' sums in the order o = r - s (s = 1..p-1).
/// Positions depend on the values only, not on K, so the pipelined and the two-phase
/// forms draw the same random bits and give the same bits. A third form, `whole`, is the
/// two-phase one with slots sized for whole chunks only (the error-bounded SRA of
/// comm/error_bounded_schedules.hpp, which uses the first slots_used() slots).
///
/// What does not depend on the cut (peers, slots, keys, order of sums) is
/// `sra_pattern`, which `sra` extends with its cut; layerwise_plan runs the pattern over
/// layerwise.hpp's cut (layer and per-layer bucket boundaries, one message per chunk).

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common.hpp"

namespace cgx::schedule {

/// What SRA is whatever the cut of the buffer into p chunks (rank o owns chunk o): the
/// peers of each step, the workspace slots, the random keys and the order of sums. sra
/// below cuts n values at one granule; the layer-wise plans (layerwise.hpp) cut at
/// layer and per-layer bucket boundaries, one message per chunk, and run this pattern
/// over that cut.
struct sra_pattern {
  int p;             ///< ranks
  int gather_base;   ///< gather slot o is slot gather_base * p + o (1: the receive slots)
  std::size_t slot;  ///< bytes per workspace slot (cache-line rounded)

  /// Workspace slots this form uses: p send and p receive, then p gather slots unless the
  /// allgather receives into the receive slots (gather_base 1).
  constexpr std::size_t slots_used() const { return static_cast<std::size_t>(gather_base + 1) * static_cast<std::size_t>(p); }

  /// Workspace offset of send slot o: my contribution to chunk o, or (o = me) my compressed sum.
  constexpr std::size_t send_slot(int o) const { return static_cast<std::size_t>(o) * slot; }
  /// Workspace offset of receive slot r: rank r's part of my chunk.
  constexpr std::size_t recv_slot(int r) const { return static_cast<std::size_t>(p + r) * slot; }
  /// Workspace offset of gather slot o: rank o's compressed sum.
  constexpr std::size_t gather_slot(int o) const { return static_cast<std::size_t>(gather_base * p + o) * slot; }

  /// The peer of step s (1..p-1): where rank r sends (its contribution, then its sum).
  constexpr int to(int r, int s) const { return (r + s) % p; }
  /// The owner whose sum rank r decodes at step s (1..p-1) of the gather.
  constexpr int from(int r, int s) const { return (r + p - s) % p; }
  /// The i-th part (i = 0..p-2) the owner o adds to its own: the others in rank order.
  static constexpr int addend(int o, int i) { return rank_order_skipping(o, i); }

  /// Key of rank r's contribution to `values`.
  static constexpr key contribution_key(int r, const chunk& values) { return {static_cast<std::uint32_t>(r), values.begin}; }
  /// Key of owner o's sum of `values`.
  constexpr key sum_key(int o, const chunk& values) const { return {static_cast<std::uint32_t>(p + o), values.begin}; }
};

/// SRA for n values on p ranks (see the file comment).
struct sra : sra_pattern {
  static constexpr int max_pieces = 8;                               ///< most pieces per chunk
  static constexpr std::size_t piece_bytes = std::size_t{1} << 20;   ///< raw input per piece, at least

  /// One piece of a chunk: its values and where its bytes lie in a slot.
  struct piece_t {
    chunk values;        ///< buffer values
    std::size_t offset;  ///< bytes into the slot
    std::size_t bytes;   ///< compressed size
  };

  std::size_t n;             ///< values
  std::size_t granule;       ///< chunk and piece boundaries fall on multiples of this
  int K;                     ///< pieces per chunk
  size_fn bytes;             ///< compressed size of a count

  /// Pieces per chunk of the pipelined form (values of value_size bytes): the largest
  /// chunk's raw bytes over piece_bytes, clamped to [1, max_pieces].
  static constexpr int pieces(std::size_t n, int p, std::size_t granule, std::size_t value_size) {
    const std::size_t raw = comm::largest_chunk(n, p, granule) * value_size;
    return static_cast<int>(std::clamp<std::size_t>(raw / piece_bytes, 1, max_pieces));
  }

  /// Bytes per slot: the largest chunk's compressed bytes, whole or in the K pieces of
  /// the pipelined form, rounded to a cache line (both forms use the same slots).
  static constexpr std::size_t slot_bytes(std::size_t n, int p, std::size_t granule, std::size_t value_size, size_fn bytes) {
    const int K = pieces(n, p, granule, value_size);
    std::size_t most = 0;
    for (int r = 0; r < p; ++r) {
      const std::size_t count = comm::chunk_of(n, p, r, granule).count;
      std::size_t sum = 0;
      for (int k = 0; k < K; ++k) sum += bytes(comm::chunk_of(count, K, k, granule).count);
      most = std::max({most, sum, bytes(count)});
    }
    return comm::round_to_line(most);
  }

  /// The pipelined form (comm::scatter_reduce_allgather's run).
  static constexpr sra pipelined(std::size_t n, int p, std::size_t granule, std::size_t value_size, size_fn bytes) {
    return {{p, 2, slot_bytes(n, p, granule, value_size, bytes)}, n, granule, pieces(n, p, granule, value_size), bytes};
  }
  /// The two-phase form (scatter_reduce then allgather): one piece per chunk, the
  /// allgather receiving into the scatter's receive slots.
  static constexpr sra two_phase(std::size_t n, int p, std::size_t granule, std::size_t value_size, size_fn bytes) {
    return {{p, 1, slot_bytes(n, p, granule, value_size, bytes)}, n, granule, 1, bytes};
  }

  /// One piece per chunk, the allgather receiving into the receive slots, each slot
  /// sized for the largest whole chunk only (no pipelined form shares this workspace):
  /// the error-bounded SRA, whose `bytes` is the worst-case compressed size and whose
  /// messages carry their real lengths.
  static constexpr sra whole(std::size_t n, int p, std::size_t granule, size_fn bytes) {
    return {{p, 1, comm::round_to_line(largest_compressed(n, p, granule, bytes))}, n, granule, 1, bytes};
  }

  /// The whole form in a workspace whose slots are sized elsewhere: `slot` bytes, at
  /// least whole(n, ...).slot (comm::device_sra, whose slots hold the largest chunk of
  /// the count its workspace was sized for).
  static constexpr sra whole_in(std::size_t n, int p, std::size_t granule, size_fn bytes, std::size_t slot) {
    return {{p, 1, slot}, n, granule, 1, bytes};
  }

  /// Workspace slots: p send, p receive, p gather (slots_used() of the pipelined form).
  static constexpr std::size_t slots(int p) { return 3 * static_cast<std::size_t>(p); }

  /// The values rank o owns.
  constexpr chunk chunk_of(int o) const { return comm::chunk_of(n, p, o, granule); }
  /// Piece k of chunk o.
  constexpr piece_t piece(int o, int k) const {
    const chunk c = chunk_of(o);
    std::size_t off = 0;
    for (int j = 0; j < k; ++j) off += bytes(comm::chunk_of(c.count, K, j, granule).count);
    const chunk v = comm::chunk_of(c.count, K, k, granule);
    return {{c.begin + v.begin, v.count}, off, bytes(v.count)};
  }

  /// Rank r's sends and receives, in the order the pipelined executor posts them.
  template <class F>
  constexpr void messages(int r, F&& f) const {
    if (p == 1 || n == 0) return;
    for (int k = 0; k < K; ++k) {
      const piece_t m = piece(r, k);
      for (int q = 0; q < p; ++q)
        if (q != r && m.values.count != 0) f(message{phase::scatter, 0, q, r, m.values, m.bytes, recv_slot(q) + m.offset});
    }
    for (int k = 0; k < K; ++k)
      for (int o = 0; o < p; ++o) {
        const piece_t g = piece(o, k);
        if (o != r && g.values.count != 0) f(message{phase::gather, 1, o, r, g.values, g.bytes, gather_slot(o) + g.offset});
      }
    for (int k = 0; k < K; ++k)
      for (int s = 1; s < p; ++s) {
        const piece_t c = piece(to(r, s), k);
        if (c.values.count != 0) f(message{phase::scatter, 0, r, to(r, s), c.values, c.bytes, send_slot(to(r, s)) + c.offset});
      }
    for (int k = 0; k < K; ++k) {
      const piece_t m = piece(r, k);
      if (m.values.count == 0) continue;
      for (int s = 1; s < p; ++s) f(message{phase::gather, 1, r, to(r, s), m.values, m.bytes, send_slot(r) + m.offset});
    }
  }

  /// Rank r's compressions.
  template <class F>
  constexpr void compressions(int r, F&& f) const {
    if (p == 1 || n == 0) return;
    for (int k = 0; k < K; ++k) {
      for (int s = 1; s < p; ++s) {
        const piece_t c = piece(to(r, s), k);
        if (c.values.count != 0)
          f(compression{phase::scatter, 0, c.values, contribution_key(r, c.values), send_slot(to(r, s)) + c.offset});
      }
      const piece_t m = piece(r, k);
      if (m.values.count != 0) f(compression{phase::sum, 1, m.values, sum_key(r, m.values), send_slot(r) + m.offset});
    }
  }

  /// The ranges rank r ends with: its own sum (decoded), then the others' sums.
  template <class F>
  constexpr void results(int r, F&& f) const {
    if (p == 1 || n == 0) {
      if (n != 0) f(chunk{0, n});
      return;
    }
    for (int k = 0; k < K; ++k) {
      if (piece(r, k).values.count != 0) f(piece(r, k).values);
      for (int s = 1; s < p; ++s)
        if (piece(from(r, s), k).values.count != 0) f(piece(from(r, s), k).values);
    }
  }
};

}  // namespace cgx::schedule
