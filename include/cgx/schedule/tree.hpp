#pragma once
/// \file schedule/tree.hpp
/// The description of recursive halving / doubling with compression, run by comm::tree.
///
/// q = the largest power of two <= p, e = p - q; the buffer is cut into q chunks at the
/// granule. Keys: stream = step * p + rank, position = the first value compressed.
///  - fold (step 0): among ranks 0..2e-1 the even rank r compresses its whole buffer
///    (key (r, 0)) into the scratch slot and sends it to r + 1, which adds it and takes
///    virtual rank v = (r + 1) / 2 (-1 for the even rank, which sits out); rank r >= 2e
///    has v = r - e.
///  - halving, steps i = 1..log2 q at distance d = q >> i: before step i, v holds the
///    aligned block of 2d chunks around v; it keeps the half holding v and sends the
///    other half, compressed (key (i p + r, its first value)) into scratch + whole, to
///    the rank of virtual rank v ^ d, receiving the kept half into scratch and adding it.
///  - sum (step log2 q + 1): v compresses chunk v once into chunk slot v and decodes it.
///  - doubling, distance d = 1, 2, ..., q/2: v sends the chunk slots of its aligned
///    block of d chunks, in chunk order, to v ^ d, and receives that rank's block.
///  - unfold: the odd rank r < 2e sends chunk slots 0..q-1 to r - 1, which decodes them.
/// Workspace: q chunk slots, then two whole compressed buffers (scratch).

#include <bit>
#include <cstddef>
#include <cstdint>

#include "common.hpp"

namespace cgx::schedule {

/// Recursive halving / doubling for n values on p ranks (see the file comment).
struct tree {
  std::size_t n;        ///< values
  int p;                ///< ranks
  int q;                ///< active ranks: the largest power of two <= p
  std::size_t granule;  ///< chunk boundaries fall on multiples of this
  size_fn bytes;        ///< compressed size of a count
  std::size_t slot;     ///< bytes per chunk slot
  std::size_t whole;    ///< bytes of a whole compressed buffer (cache-line rounded)

  /// q for p ranks.
  static constexpr int pow2(int p) { return static_cast<int>(std::bit_floor(static_cast<unsigned>(p))); }
  /// The description for n values on p ranks.
  static constexpr tree make(std::size_t n, int p, std::size_t granule, size_fn bytes) {
    const int q = pow2(p);
    return {n, p, q, granule, bytes, comm::round_to_line(largest_compressed(n, q, granule, bytes)),
            comm::round_to_line(bytes(n))};
  }

  constexpr int extra() const { return p - q; }                 ///< ranks folded away
  constexpr int levels() const { return std::countr_zero(static_cast<unsigned>(q)); }  ///< log2 q
  /// Virtual rank of rank r, -1 if it sits out after the fold.
  constexpr int virtual_rank(int r) const { return r < 2 * extra() ? (r % 2 == 0 ? -1 : r / 2) : r - extra(); }
  /// The rank of virtual rank v.
  constexpr int real(int v) const { return v < extra() ? 2 * v + 1 : v + extra(); }
  constexpr chunk chunk_of(int c) const { return comm::chunk_of(n, q, c, granule); }  ///< chunk c's values
  /// The values of chunks [c0, c1).
  constexpr chunk span_of(int c0, int c1) const {
    const chunk a = chunk_of(c0), b = chunk_of(c1 - 1);
    return {a.begin, b.begin + b.count - a.begin};
  }

  /// What virtual rank v does in one halving step.
  struct halving {
    int partner;  ///< virtual rank of the partner
    int klo;      ///< first chunk kept
    int khi;      ///< one past the last chunk kept
    int slo;      ///< first chunk sent
    int shi;      ///< one past the last chunk sent
  };
  /// Halving step i (1..levels()) of virtual rank v.
  constexpr halving halve(int v, int i) const {
    const int d = q >> i;
    const int lo = v & ~(2 * d - 1), mid = lo + d, hi = lo + 2 * d;
    const bool keep_low = (v & d) == 0;
    return {v ^ d, keep_low ? lo : mid, keep_low ? mid : hi, keep_low ? mid : lo, keep_low ? hi : mid};
  }
  /// The aligned block of d chunks around v: what v holds before the doubling step at distance d.
  static constexpr int block_lo(int v, int d) { return v & ~(d - 1); }

  constexpr std::size_t chunk_slot(int c) const { return static_cast<std::size_t>(c) * slot; }  ///< chunk c's sum
  constexpr std::size_t scratch() const { return static_cast<std::size_t>(q) * slot; }          ///< fold/halving receive; fold send
  constexpr std::size_t scratch_send() const { return scratch() + whole; }                        ///< halving send

  /// Key of a compression of rank r at step i of `values`.
  constexpr key key_of(int r, int i, const chunk& values) const { return {static_cast<std::uint32_t>(i * p + r), values.begin}; }

  /// Rank r's sends and receives, in posting order.
  template <class F>
  constexpr void messages(int r, F&& f) const {
    if (p == 1 || n == 0) return;
    const chunk all{0, n};
    if (r < 2 * extra()) {
      if (r % 2 == 0) f(message{phase::fold, 0, r, r + 1, all, bytes(n), scratch()});
      else f(message{phase::fold, 0, r - 1, r, all, bytes(n), scratch()});
    }
    const int v = virtual_rank(r);
    if (v >= 0) {
      for (int i = 1; i <= levels(); ++i) {
        const halving h = halve(v, i);
        const chunk keep = span_of(h.klo, h.khi), send = span_of(h.slo, h.shi);
        if (keep.count != 0) f(message{phase::reduce, i, real(h.partner), r, keep, bytes(keep.count), scratch()});
        if (send.count != 0) f(message{phase::reduce, i, r, real(h.partner), send, bytes(send.count), scratch_send()});
      }
      for (int d = 1, i = 0; d < q; d *= 2, ++i) {
        const int lo = block_lo(v, d), plo = lo ^ d, partner = real(v ^ d);
        for (int c = plo; c < plo + d; ++c)
          if (chunk_of(c).count != 0) f(message{phase::gather, i, partner, r, chunk_of(c), bytes(chunk_of(c).count), chunk_slot(c)});
        for (int c = lo; c < lo + d; ++c)
          if (chunk_of(c).count != 0) f(message{phase::gather, i, r, partner, chunk_of(c), bytes(chunk_of(c).count), chunk_slot(c)});
      }
    }
    if (r < 2 * extra()) {
      const bool receiver = r % 2 == 0;
      for (int c = 0; c < q; ++c)
        if (chunk_of(c).count != 0)
          f(message{phase::unfold, 0, receiver ? r + 1 : r, receiver ? r : r - 1, chunk_of(c), bytes(chunk_of(c).count), chunk_slot(c)});
    }
  }

  /// Rank r's compressions.
  template <class F>
  constexpr void compressions(int r, F&& f) const {
    if (p == 1 || n == 0) return;
    if (r < 2 * extra() && r % 2 == 0) f(compression{phase::fold, 0, chunk{0, n}, key_of(r, 0, chunk{0, n}), scratch()});
    const int v = virtual_rank(r);
    if (v < 0) return;
    for (int i = 1; i <= levels(); ++i) {
      const halving h = halve(v, i);
      const chunk send = span_of(h.slo, h.shi);
      if (send.count != 0) f(compression{phase::reduce, i, send, key_of(r, i, send), scratch_send()});
    }
    if (chunk_of(v).count != 0) f(compression{phase::sum, levels() + 1, chunk_of(v), key_of(r, levels() + 1, chunk_of(v)), chunk_slot(v)});
  }

  /// The ranges rank r ends with.
  template <class F>
  constexpr void results(int r, F&& f) const {
    if (n == 0) return;
    if (p == 1) return f(chunk{0, n});
    const int v = virtual_rank(r);
    if (v < 0) {
      for (int c = 0; c < q; ++c)
        if (chunk_of(c).count != 0) f(chunk_of(c));
      return;
    }
    if (chunk_of(v).count != 0) f(chunk_of(v));
    for (int d = 1; d < q; d *= 2)
      for (int c = block_lo(v, d) ^ d; c < (block_lo(v, d) ^ d) + d; ++c)
        if (chunk_of(c).count != 0) f(chunk_of(c));
  }
};

}  // namespace cgx::schedule
