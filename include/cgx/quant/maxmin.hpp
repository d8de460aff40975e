#pragma once
/// \file maxmin.hpp
/// `cgx::quant::maxmin`: CGX's bucketed max-min quantizer, and its host kernels.
/// The bytes it writes are specified in wire_format.hpp; CUDA kernels for the same
/// format are in maxmin.cuh.

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

namespace detail {

/// min, max and "all finite" of x[0..n), n >= 1. Lane-parallel accumulators so that
/// the compiler vectorizes the reduction without -ffast-math.
template <class T, class Meta>
inline void host_minmax(const T* CGX_RESTRICT x, std::size_t n, Meta& mn_out, Meta& mx_out, bool& finite) {
  constexpr std::size_t W = 64 / sizeof(Meta);
  Meta lo[W], hi[W], chk[W];
  const Meta x0 = static_cast<Meta>(x[0]);
  for (std::size_t l = 0; l < W; ++l) {
    lo[l] = x0;
    hi[l] = x0;
    chk[l] = Meta(0);
  }
  std::size_t i = 0;
  for (; i + W <= n; i += W) {
    for (std::size_t l = 0; l < W; ++l) {
      const Meta v = static_cast<Meta>(x[i + l]);
      lo[l] = v < lo[l] ? v : lo[l];
      hi[l] = v > hi[l] ? v : hi[l];
      chk[l] = chk[l] + (v - v);  // NaN once any value is NaN or +-Inf
    }
  }
  for (; i < n; ++i) {
    const Meta v = static_cast<Meta>(x[i]);
    lo[0] = v < lo[0] ? v : lo[0];
    hi[0] = v > hi[0] ? v : hi[0];
    chk[0] = chk[0] + (v - v);
  }
  Meta mn = lo[0], mx = hi[0], c = chk[0];
  for (std::size_t l = 1; l < W; ++l) {
    mn = lo[l] < mn ? lo[l] : mn;
    mx = hi[l] > mx ? hi[l] : mx;
    c = c + chk[l];
  }
  mn_out = mn;
  mx_out = mx;
  finite = (c == Meta(0));
}

/// Codes of one bucket: `count` values at x, S positions per slice. The scalar
/// reference of the SIMD kernels, and the path of partial and wide buckets.
template <int Bits, class Rounding, bool Partial, bool Scaled, class T, class Meta, bool Wide = false>
inline void host_encode_bucket(const T* CGX_RESTRICT x, std::size_t count, std::uint32_t S, std::uint32_t j0,
                               Meta mn, Meta inv, std::uint8_t* CGX_RESTRICT codes, const rng_state& rng,
                               std::uint64_t first) {
  constexpr int BitsC = Bits;
  for (std::uint32_t j = j0; j < S; ++j) {
    const rounding_offsets<Rounding> off(rng, first, j);
    std::uint32_t c[8];
    CGX_UNROLL
    for (int k = 0; k < 8; ++k) {
      const std::size_t idx = static_cast<std::size_t>(k) * S + j;
      Meta v;
      if constexpr (Partial) {
        v = idx < count ? static_cast<Meta>(x[idx]) : mn;
      } else {
        v = static_cast<Meta>(x[idx]);
      }
      if constexpr (Wide)
        c[k] = encode_value_wide<BitsC>(v, mn, inv, off.template get<Meta>(k));
      else
        c[k] = encode_value<BitsC, Scaled>(v, mn, inv, off.template get<Meta>(k));
    }
    [&]<int... Q>(std::integer_sequence<int, Q...>) {
      ((codes[static_cast<std::size_t>(Q) * S + j] = static_cast<std::uint8_t>(pack_byte<BitsC, Q>(c))), ...);
    }(std::make_integer_sequence<int, BitsC>{});
  }
}

/// Values of one bucket from its codes; Add: y += decoded.
template <int Bits, bool Add, bool Partial, class T, class Meta, bool Wide = false>
inline void host_decode_bucket(const std::uint8_t* CGX_RESTRICT codes, std::size_t count, std::uint32_t S,
                               std::uint32_t j0, Meta mn, Meta unit, T* CGX_RESTRICT y) {
  for (std::uint32_t j = j0; j < S; ++j) {
    std::uint32_t b[Bits];
    CGX_UNROLL
    for (int q = 0; q < Bits; ++q) b[q] = codes[static_cast<std::size_t>(q) * S + j];
    [&]<int... K>(std::integer_sequence<int, K...>) {
      (
          [&] {
            const std::size_t idx = static_cast<std::size_t>(K) * S + j;
            if (!Partial || idx < count) {
              const Meta v = Wide ? decode_value_wide<Meta>(unpack_code<Bits, K>(b), mn, unit)
                                  : decode_value<Meta>(unpack_code<Bits, K>(b), mn, unit);
              if constexpr (Add) {
                y[idx] = static_cast<T>(static_cast<Meta>(y[idx]) + v);
              } else {
                y[idx] = static_cast<T>(v);
              }
            }
          }(),
          ...);
    }(std::make_integer_sequence<int, 8>{});
  }
}

template <class Meta>
inline void store_meta(std::byte* out, std::size_t i, Meta mn, Meta unit) {
  const Meta rec[2] = {mn, unit};
  std::memcpy(out + i * sizeof(rec), rec, sizeof(rec));
}

template <class Meta>
inline void load_meta(const std::byte* in, std::size_t i, Meta& mn, Meta& unit) {
  Meta rec[2];
  std::memcpy(rec, in + i * sizeof(rec), sizeof(rec));
  mn = rec[0];
  unit = rec[1];
}

}  // namespace detail

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

  static constexpr int bits = Bits;
  static constexpr std::size_t bucket_size = BucketSize;
  using rounding = Rounding;
  /// Decompress(compress(x)) == x for every x: false for maxmin.
  static constexpr bool lossless = false;

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
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "cgx::quant::maxmin host kernels take float or double");
    if (n == 0) return;
    const std::size_t nb = layout<T>::buckets(n);
    for_each_range(ex, nb, [&](std::size_t b0, std::size_t b1) { compress_buckets<T>(in, n, out, rng, b0, b1); });
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

 private:
  template <class T>
  static void compress_buckets(const T* in, std::size_t n, std::byte* out, const rng_state& rng, std::size_t b0,
                               std::size_t b1) {
    using M = meta_t<T>;
    auto* codes_base = reinterpret_cast<std::uint8_t*>(out);
    for (std::size_t b = b0; b < b1; ++b) {
      const std::size_t first = b * BucketSize;
      const std::size_t count = std::min(BucketSize, n - first);
      const auto S = static_cast<std::uint32_t>((count + 7) / 8);
      const T* x = in + first;
      std::uint8_t* codes = codes_base + layout<T>::codes_offset(n, b);
      M mn, mx;
      bool finite;
#if CGX_HAS_HOST_SIMD
      simd::minmax<M>(x, count, mn, mx, finite);
#else
      detail::host_minmax<T, M>(x, count, mn, mx, finite);
#endif
      const bucket_params<M> p = make_bucket_params<Bits, M>(mn, mx, finite);
      detail::store_meta<M>(out, b, p.min, p.unit);
      if (!p.finite) {
        std::memset(codes, 0, static_cast<std::size_t>(Bits) * S);
        continue;
      }
      const std::uint64_t gfirst = rng.position + first;
      if (p.wide) {  // values near the limits of M: rare, scalar
        detail::host_encode_bucket<Bits, Rounding, true, false, T, M, true>(x, count, S, 0, p.min, p.inv, codes, rng,
                                                                            gfirst);
      } else if (count == BucketSize) {
        const T* next = b + 1 < b1 ? x + BucketSize : nullptr;
        if (!p.scaled)
          encode_full<false>(x, S, p.min, p.inv, codes, rng, gfirst, next);
        else
          encode_full<true>(x, S, p.min, p.inv, codes, rng, gfirst, next);
      } else {
        if (!p.scaled)
          detail::host_encode_bucket<Bits, Rounding, true, false>(x, count, S, 0, p.min, p.inv, codes, rng, gfirst);
        else
          detail::host_encode_bucket<Bits, Rounding, true, true>(x, count, S, 0, p.min, p.inv, codes, rng, gfirst);
      }
    }
  }

  template <bool Scaled, class T, class M>
  static void encode_full(const T* x, std::uint32_t S, M mn, M inv, std::uint8_t* codes, const rng_state& rng,
                          std::uint64_t first, const T* next) {
    std::uint32_t j0 = 0;
#if CGX_HAS_HOST_SIMD
    j0 = simd::encode_full<Bits, Rounding, Scaled, M>(x, S, mn, inv, codes, rng, first, next);
#else
    (void)next;
#endif
    detail::host_encode_bucket<Bits, Rounding, false, Scaled>(x, BucketSize, S, j0, mn, inv, codes, rng, first);
  }

  template <class T, bool Add>
  static void decode(const std::byte* in, std::size_t n, T* out, host_exec ex) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "cgx::quant::maxmin host kernels take float or double");
    using M = meta_t<T>;
    if (n == 0) return;
    const std::size_t nb = layout<T>::buckets(n);
    for_each_range(ex, nb, [&](std::size_t b0, std::size_t b1) {
      const auto* codes_base = reinterpret_cast<const std::uint8_t*>(in);
      for (std::size_t b = b0; b < b1; ++b) {
        const std::size_t first = b * BucketSize;
        const std::size_t count = std::min(BucketSize, n - first);
        const auto S = static_cast<std::uint32_t>((count + 7) / 8);
        M mn, unit;
        detail::load_meta<M>(in, b, mn, unit);
        const std::uint8_t* codes = codes_base + layout<T>::codes_offset(n, b);
        if (is_wide<Bits, M>(mn, unit)) {  // values near the limits of M: rare, scalar
          detail::host_decode_bucket<Bits, Add, true, T, M, true>(codes, count, S, 0, mn, unit, out + first);
        } else if (count == BucketSize) {
          std::uint32_t j0 = 0;
#if CGX_HAS_HOST_SIMD
          j0 = simd::decode_full<Bits, Add, M>(codes, S, mn, unit, out + first,
                                                b + 1 < b1 ? out + first + BucketSize : nullptr);
#endif
          detail::host_decode_bucket<Bits, Add, false>(codes, count, S, j0, mn, unit, out + first);
        } else {
          detail::host_decode_bucket<Bits, Add, true>(codes, count, S, 0, mn, unit, out + first);
        }
      }
    });
  }
};

}  // namespace cgx::quant
