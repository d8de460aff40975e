#pragma once
/// \file none.hpp
/// `cgx::quant::none`: the uncompressed passthrough quantizer. The wire carries the
/// values as they are; a reduction through it is exact up to the order of additions.

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "host_exec.hpp"
#include "rounding.hpp"

namespace cgx::quant {

/// Passthrough: compressed bytes are the raw values. Any trivially copyable arithmetic T.
struct none {
  static constexpr int bits = 0;  ///< 0 marks "uncompressed"
  static constexpr std::size_t bucket_size = 0;  ///< no buckets
  using rounding = nearest;                      ///< unused: nothing is rounded
  static constexpr bool lossless = true;         ///< decompress(compress(x)) == x

  /// n * sizeof(T): the raw bytes.
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return n * sizeof(T);
  }

  /// Copies the n values to out.
  template <class T>
  static void compress(const T* in, std::size_t n, std::byte* out, const rng_state& = {}, host_exec = {}) {
    if (n != 0) std::memcpy(out, in, n * sizeof(T));
  }

  /// Copies n values from in.
  template <class T>
  static void decompress(const std::byte* in, std::size_t n, T* out, host_exec = {}) {
    if (n != 0) std::memcpy(out, in, n * sizeof(T));
  }

  /// out[i] += the i-th value of in, in T arithmetic.
  template <class T>
  static void decompress_add(const std::byte* in, std::size_t n, T* out, host_exec ex = {}) {
    for_each_range(ex, n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        T v;
        std::memcpy(&v, in + i * sizeof(T), sizeof(T));
        out[i] += v;
      }
    });
  }
};

}  // namespace cgx::quant
