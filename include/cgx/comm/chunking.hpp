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
/// Chunk r starts at unit floor(units r / parts) (units = ceil(n / granule)), computed
/// without forming units r, so that no n (up to SIZE_MAX) wraps.
constexpr chunk chunk_of(std::size_t n, int parts, int r, std::size_t granule) {
  const std::size_t units = n / granule + (n % granule != 0 ? 1 : 0);
  const auto P = static_cast<std::size_t>(parts);
  // units r / P = q r + (m r) / P with q = units / P, m = units % P; m r < P^2 fits.
  auto cut = [&](std::size_t k) {
    const std::size_t u = units / P * k + units % P * k / P;
    return u > n / granule ? n : u * granule;  // u granule <= n whenever u <= n / granule
  };
  const std::size_t b = cut(static_cast<std::size_t>(r));
  const std::size_t e = cut(static_cast<std::size_t>(r) + 1);
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
