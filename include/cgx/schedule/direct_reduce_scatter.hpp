#pragma once
/// \file schedule/direct_reduce_scatter.hpp
/// The description of the exact (raw) reduce-scatter and allgather of comm::uncompressed,
/// which hierarchical<uncompressed, Inter> runs inside a node.
///
/// p chunks cut at the granule (the plan quantizer's, as SRA cuts them); rank o owns chunk o.
///  - scatter: rank r sends its raw values of chunk o = r + s (s = 1..p-1) straight from
///    its buffer to o, which receives them in part slot j = r - (r > o) and adds them to
///    its own, in rank order. No compression, so no random keys.
///  - gather: o sends its finished chunk from its buffer to o + s (s = 1..p-1); every
///    rank receives chunk r straight into its buffer.
/// Workspace: p - 1 part slots of the largest chunk's raw bytes.

#include <cstddef>

#include "common.hpp"

namespace cgx::schedule {

/// Direct raw reduce-scatter + allgather for n values of value_size bytes on p ranks.
struct direct_reduce_scatter : cut {
  std::size_t value_size;  ///< bytes per value
  std::size_t slot;        ///< bytes per part slot

  /// The description for n values of value_size bytes on p ranks.
  static constexpr direct_reduce_scatter make(std::size_t n, int p, std::size_t granule, std::size_t value_size) {
    return {{n, p, granule}, value_size, comm::round_to_line(comm::largest_chunk(n, p, granule) * value_size)};
  }
  /// Workspace slots: the p - 1 incoming parts of my chunk.
  static constexpr std::size_t slots(int p) { return p <= 1 ? 0 : static_cast<std::size_t>(p - 1); }

  constexpr int to(int r, int s) const { return (r + s) % p; }                         ///< peer of step s (1..p-1)
  static constexpr int addend(int o, int i) { return rank_order_skipping(o, i); }      ///< i-th part o adds
  /// Workspace offset where owner o receives rank r's part.
  constexpr std::size_t part_slot(int o, int r) const { return static_cast<std::size_t>(r - (r > o ? 1 : 0)) * slot; }

  /// Rank r's sends and receives of the reduce-scatter (gather = false) or the
  /// allgather (gather = true), in posting order.
  template <class F>
  constexpr void messages(int r, F&& f, bool gather) const {
    if (p == 1 || n == 0) return;
    const chunk mine = chunk_of(r);
    const auto raw = [&](const chunk& c) { return c.count * value_size; };
    if (!gather) {
      if (mine.count != 0)
        for (int q = 0; q < p; ++q)
          if (q != r) f(message{phase::scatter, 0, q, r, mine, raw(mine), part_slot(r, q)});
      for (int s = 1; s < p; ++s)
        if (chunk_of(to(r, s)).count != 0) f(message{phase::scatter, 0, r, to(r, s), chunk_of(to(r, s)), raw(chunk_of(to(r, s))), in_buffer});
      return;
    }
    for (int q = 0; q < p; ++q)
      if (q != r && chunk_of(q).count != 0) f(message{phase::gather, 1, q, r, chunk_of(q), raw(chunk_of(q)), in_buffer});
    if (mine.count != 0)
      for (int s = 1; s < p; ++s) f(message{phase::gather, 1, r, to(r, s), mine, raw(mine), in_buffer});
  }
  /// Both halves.
  template <class F>
  constexpr void messages(int r, F&& f) const {
    messages(r, f, false);
    messages(r, f, true);
  }
  /// No compressions.
  template <class F>
  constexpr void compressions(int, F&&) const {}
  /// The ranges rank r ends with after both halves: its own chunk, then the others'.
  template <class F>
  constexpr void results(int r, F&& f) const {
    if (n == 0) return;
    for (int q = 0; q < p; ++q)
      if (chunk_of(q).count != 0) f(chunk_of(q));
    (void)r;
  }
};

}  // namespace cgx::schedule
