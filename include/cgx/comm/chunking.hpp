#pragma once
/// \file chunking.hpp
/// How reducers cut a buffer into per-rank chunks: at multiples of a granule (the
/// quantizer's bucket), so that every rank's buckets cover the same values, balanced
/// to within one granule.

#include <algorithm>
#include <cstddef>

namespace cgx::comm {

/// The values [begin, begin + count) of one chunk.
struct chunk {
  std::size_t begin;  ///< index of the first value
  std::size_t count;  ///< number of values
};

/// Chunk `r` of `parts` chunks of a buffer of n values, cut at multiples of `granule`.
constexpr chunk chunk_of(std::size_t n, int parts, int r, std::size_t granule) {
  const std::size_t units = (n + granule - 1) / granule;
  const std::size_t u0 = units * static_cast<std::size_t>(r) / static_cast<std::size_t>(parts);
  const std::size_t u1 = units * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(parts);
  const std::size_t b = std::min(n, u0 * granule);
  const std::size_t e = std::min(n, u1 * granule);
  return {b, e - b};
}

/// The largest chunk of that cut.
constexpr std::size_t largest_chunk(std::size_t n, int parts, std::size_t granule) {
  std::size_t most = 0;
  for (int r = 0; r < parts; ++r) most = std::max(most, chunk_of(n, parts, r, granule).count);
  return most;
}

/// Quantizer granule: whole buckets, or single values for an unbucketed quantizer.
template <class Q>
inline constexpr std::size_t granule_of = Q::bucket_size > 0 ? Q::bucket_size : 1;

/// Rounds a byte count up to a cache line, so that workspace slots do not share lines.
constexpr std::size_t round_to_line(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace cgx::comm
