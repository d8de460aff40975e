#pragma once
/// \file schedule/ring.hpp
/// The description of the compressed ring allreduce, run by comm::ring (and, with
/// length-prefixed messages, by the error-bounded ring and comm::device_ring).
///
/// p chunks cut at the granule; rank r sends to r + 1 and receives from r - 1 (mod p).
///  - reduce, steps s = 0..p-2: r compresses its running sum of chunk r - s with key
///    (stream r, position = the chunk's first value) into its send slot and sends it
///    right; it receives chunk r - s - 1 from the left in its receive slot and adds
///    the decoded values to its own. Chunk c is summed in the order c, c + 1, ..., c + p - 1.
///  - sum: r owns chunk r + 1, compresses it once with key (stream p + r, position = the
///    chunk's first value) into gather slot r + 1 and decodes it into its buffer;
///  - gather, steps s = 0..p-2: r forwards gather slot r + 1 - s unchanged to the right
///    and receives gather slot r - s from the left, which it decodes.
/// Workspace: gather slots 0..p-1, then the send slot, then the receive slot.

#include <cstddef>
#include <cstdint>

#include "common.hpp"

namespace cgx::schedule {

/// Ring for n values on p ranks (see the file comment).
struct ring : cut {
  size_fn bytes;        ///< compressed size of a count
  std::size_t slot;     ///< bytes per workspace slot

  /// The description for n values on p ranks.
  static constexpr ring make(std::size_t n, int p, std::size_t granule, size_fn bytes) {
    return {{n, p, granule}, bytes, comm::round_to_line(largest_compressed(n, p, granule, bytes))};
  }
  /// Workspace slots: p gather slots, one send, one receive.
  static constexpr std::size_t slots(int p) { return static_cast<std::size_t>(p) + 2; }

  constexpr int mod(int v) const { return ((v % p) + p) % p; }  ///< v mod p, in [0, p)
  constexpr int right(int r) const { return mod(r + 1); }        ///< where r sends
  constexpr int left(int r) const { return mod(r - 1); }         ///< where r receives from

  constexpr int reduce_out(int r, int s) const { return mod(r - s); }      ///< chunk r sends at reduce step s
  constexpr int reduce_in(int r, int s) const { return mod(r - s - 1); }   ///< chunk r receives and adds at step s
  constexpr int owned(int r) const { return mod(r + 1); }                  ///< chunk whose sum r finishes
  constexpr int gather_out(int r, int s) const { return mod(r + 1 - s); }  ///< chunk r forwards at gather step s
  constexpr int gather_in(int r, int s) const { return mod(r - s); }       ///< chunk r receives at gather step s
  /// The i-th contribution (i = 0..p-1) in chunk c's sum.
  constexpr int addend(int c, int i) const { return mod(c + i); }

  constexpr std::size_t gather_slot(int c) const { return static_cast<std::size_t>(c) * slot; }     ///< chunk c's sum
  constexpr std::size_t send_slot() const { return static_cast<std::size_t>(p) * slot; }            ///< reduce: outgoing
  constexpr std::size_t recv_slot() const { return static_cast<std::size_t>(p + 1) * slot; }        ///< reduce: incoming

  /// Key of rank r's running sum of `values`.
  static constexpr key contribution_key(int r, const chunk& values) { return {static_cast<std::uint32_t>(r), values.begin}; }
  /// Key of rank r's finished sum of `values` (r owns chunk r + 1).
  constexpr key sum_key(int r, const chunk& values) const { return {static_cast<std::uint32_t>(p + r), values.begin}; }

  /// Rank r's sends and receives, in posting order.
  template <class F>
  constexpr void messages(int r, F&& f) const {
    if (p == 1 || n == 0) return;
    for (int s = 0; s + 1 < p; ++s) {
      const chunk in = chunk_of(reduce_in(r, s)), out = chunk_of(reduce_out(r, s));
      if (in.count != 0) f(message{phase::reduce, s, left(r), r, in, bytes(in.count), recv_slot()});
      if (out.count != 0) f(message{phase::reduce, s, r, right(r), out, bytes(out.count), send_slot()});
    }
    for (int s = 0; s + 1 < p; ++s) {
      const chunk in = chunk_of(gather_in(r, s)), out = chunk_of(gather_out(r, s));
      if (in.count != 0) f(message{phase::gather, s, left(r), r, in, bytes(in.count), gather_slot(gather_in(r, s))});
      if (out.count != 0) f(message{phase::gather, s, r, right(r), out, bytes(out.count), gather_slot(gather_out(r, s))});
    }
  }

  /// Rank r's compressions.
  template <class F>
  constexpr void compressions(int r, F&& f) const {
    if (p == 1 || n == 0) return;
    for (int s = 0; s + 1 < p; ++s) {
      const chunk out = chunk_of(reduce_out(r, s));
      if (out.count != 0) f(compression{phase::reduce, s, out, contribution_key(r, out), send_slot()});
    }
    const chunk mine = chunk_of(owned(r));
    if (mine.count != 0) f(compression{phase::sum, p - 1, mine, sum_key(r, mine), gather_slot(owned(r))});
  }

  /// The ranges rank r ends with: its own sum, then the chunks of the gather.
  template <class F>
  constexpr void results(int r, F&& f) const {
    if (n == 0) return;
    if (p == 1) return f(chunk{0, n});
    if (chunk_of(owned(r)).count != 0) f(chunk_of(owned(r)));
    for (int s = 0; s + 1 < p; ++s)
      if (chunk_of(gather_in(r, s)).count != 0) f(chunk_of(gather_in(r, s)));
  }
};

}  // namespace cgx::schedule
