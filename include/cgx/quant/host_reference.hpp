#pragma once
/// \file host_reference.hpp
/// The scalar host kernels of cgx::quant::maxmin: one value at a time, exactly the
/// expressions of wire_format.hpp. They are the portable path (compilers other than
/// GCC and Clang, CGX_NO_HOST_SIMD, other CPUs), the tails and partial buckets of the SIMD paths, and
/// the reference the SIMD paths are tested against. The bucket functions are never
/// inlined: every instruction set's loop calls the one copy (a call per bucket), instead
/// of each compiling its own.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "../config.hpp"
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
CGX_NOINLINE void host_encode_bucket(const T* CGX_RESTRICT x, std::size_t count, std::uint32_t S, std::uint32_t j0,
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
CGX_NOINLINE void host_decode_bucket(const std::uint8_t* CGX_RESTRICT codes, std::size_t count, std::uint32_t S,
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

}  // namespace cgx::quant
