#pragma once
/// \file maxmin.hpp
/// `cgx::quant::maxmin`: CGX's bucketed max-min quantizer on host buffers. The bytes it
/// writes are specified in wire_format.hpp; its host kernels, chosen at run time from
/// the CPU's features, are in host_simd.hpp; CUDA kernels for the same format are in
/// maxmin.cuh.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../config.hpp"
#include "host_exec.hpp"
#include "host_simd.hpp"
#include "rounding.hpp"
#include "wire_format.hpp"

namespace cgx::quant {

/// CGX's bucketed max-min quantizer. Each bucket of `BucketSize` consecutive values is
/// mapped onto 2^Bits evenly spaced levels between its minimum and maximum; the wire
/// carries the fp32 (fp64 for double input) minimum and step of each bucket and the
/// Bits-bit codes. Error of one quantization, per value: at most unit/2 with `nearest`,
/// below one unit with `stochastic` (unbiased), unit = (max - min) / (2^Bits - 1), plus
/// the rounding of the decode `min + code * unit` (a few ulp of the bucket's magnitude).
/// A constant bucket is reproduced exactly; a bucket with NaN or Inf decodes to NaN.
///
/// \tparam Bits        bits per value, 1..8
/// \tparam BucketSize  values per bucket: a multiple of 8, at most 2^20
/// \tparam Rounding    `nearest` or `stochastic`
template <int Bits, std::size_t BucketSize = 1024, class Rounding = stochastic>
struct maxmin {
  static_assert(Bits >= 1 && Bits <= 8, "cgx::quant::maxmin: Bits must be between 1 and 8");
  static_assert(BucketSize >= 8 && BucketSize % 8 == 0 && BucketSize <= (std::size_t{1} << 20),
                "cgx::quant::maxmin: BucketSize must be a positive multiple of 8, at most 2^20");
  static_assert(is_rounding_v<Rounding>, "cgx::quant::maxmin: Rounding must be cgx::quant::nearest or "
                                         "cgx::quant::stochastic");

  static constexpr int bits = Bits;                       ///< bits per value, 1..8
  static constexpr std::size_t bucket_size = BucketSize;  ///< values per bucket (one min and unit each)
  using rounding = Rounding;                              ///< quant::nearest or quant::stochastic
  /// Decompress(compress(x)) == x for every x: false for maxmin.
  static constexpr bool lossless = false;

  /// Sizes and offsets of the wire format for values of T (wire_format.hpp).
  template <class T>
  using layout = wire_layout<Bits, BucketSize, meta_t<T>>;

  /// Exact size in bytes of the compressed form of n values of type T.
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return layout<T>::bytes(n);
  }

  /// Compresses in[0..n) into out[0..compressed_bytes<T>(n)). Buffers must not overlap.
  template <class T>
  static void compress(const T* in, std::size_t n, std::byte* out, const rng_state& rng = {},
                       host_exec ex = {}) {
    for_buckets<T>(n, ex, [&](host_isa isa, std::size_t b0, std::size_t b1) {
      simd::compress_buckets<Bits, Rounding, T>(isa, in, n, BucketSize, out, rng, b0, b1);
    });
  }

  /// Decodes compressed_bytes<T>(n) bytes at in into out[0..n).
  template <class T>
  static void decompress(const std::byte* in, std::size_t n, T* out, host_exec ex = {}) {
    decode<T, false>(in, n, out, ex);
  }

  /// out[i] += decoded value i, for i in [0, n): the fused decompress-and-add of a reduction.
  template <class T>
  static void decompress_add(const std::byte* in, std::size_t n, T* out, host_exec ex = {}) {
    decode<T, true>(in, n, out, ex);
  }

  /// buf[0..n) += decoded `addend` (when not null), then compress(buf) into
  /// out[0..compressed_bytes<T>(n)), then buf = decompress(out): the bytes and values of
  /// those three calls, in one pass. It works through buf in blocks of whole buckets of
  /// about 16 KiB, each block added, then compressed and decoded back at once (a full
  /// bucket's decoded values come from its codes still in registers, not from the
  /// packed planes) while it is in the L1 cache, so buf comes from memory once; while a block is encoded the next one is
  /// prefetched, so that the memory stream does not wait for the compute
  /// (docs/results/add-requantize-prefetch.txt). The owner's last step of a reduction
  /// (quant::add_requantize). addend and out must not overlap buf.
  template <class T>
  static void add_requantize(const std::byte* addend, T* buf, std::size_t n, std::byte* out, const rng_state& rng = {},
                             host_exec ex = {}) {
    constexpr std::size_t block = BucketSize * sizeof(T) >= 16384 ? 1 : 16384 / (BucketSize * sizeof(T));
    for_buckets<T>(n, ex, [&](host_isa isa, std::size_t b0, std::size_t b1) {
      for (std::size_t b = b0; b < b1; b += block) {
        const std::size_t e = b1 - b < block ? b1 : b + block;
        if (addend != nullptr) simd::decode_buckets<Bits, true, T>(isa, addend, n, BucketSize, buf, b, e);
        // encoded and decoded back into buf in one pass: the codes are not unpacked again
        simd::compress_buckets<Bits, Rounding, T>(isa, buf, n, BucketSize, out, rng, b, e, block, buf);
      }
    });
  }

 private:
  template <class T, bool Add>
  static void decode(const std::byte* in, std::size_t n, T* out, host_exec ex) {
    for_buckets<T>(n, ex, [&](host_isa isa, std::size_t b0, std::size_t b1) {
      simd::decode_buckets<Bits, Add, T>(isa, in, n, BucketSize, out, b0, b1);
    });
  }

  // Runs kernel(isa, b0, b1) on the buckets [b0, b1) of n values of T, the ranges split
  // over ex's threads (for_each_range), isa the CPU's kernels (chosen once per call).
  template <class T, class Kernel>
  static void for_buckets(std::size_t n, host_exec ex, Kernel&& kernel) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "cgx::quant::maxmin host kernels take float or double");
    if (n == 0) return;
    const host_isa isa = active_host_isa();
    for_each_range(ex, layout<T>::buckets(n), [&](std::size_t b0, std::size_t b1) { kernel(isa, b0, b1); });
  }
};

}  // namespace cgx::quant
