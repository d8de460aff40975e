#pragma once
// What the fuzz harnesses (and make_corpus) share: a reader over a libFuzzer input, and
// the values fuzz_varsize's rank holds.
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace cgx_fuzz {

// Fixed-size fields from the front of the input; p and left are then the rest.
struct input {
  const std::uint8_t* p;
  std::size_t left;
  // The next byte, or 0 past the end.
  std::uint8_t byte() {
    if (left == 0) return 0;
    --left;
    return *p++;
  }
  // The next two bytes, little-endian.
  std::size_t u16() {
    const std::size_t lo = byte();
    return lo | static_cast<std::size_t>(byte()) << 8;
  }
};

// The value rank r holds at index i in fuzz_varsize (and in the corpus): smooth, so that
// the encoder writes coded buckets, plus a rank-dependent offset.
inline double value_of(int r, std::size_t i) { return std::sin(0.01 * static_cast<double>(i)) + 0.25 * r; }

}  // namespace cgx_fuzz
