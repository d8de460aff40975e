#pragma once
// A value-by-value implementation of the maxmin wire format, written from the
// specification in include/cgx/quant/wire_format.hpp (bit concatenation, planes,
// partial buckets). It shares only the per-value arithmetic (encode_value,
// decode_value, make_bucket_params, rounding_offsets) with the library, so it checks
// the kernels' loops, vectorization and layout, not the arithmetic against itself.

#include <cgx/quant/wire_format.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cgx_test {

template <int Bits, std::size_t B, class Rounding, class T>
std::vector<std::byte> reference_compress(const T* x, std::size_t n, const cgx::quant::rng_state& rng) {
  using M = cgx::quant::meta_t<T>;
  using layout = cgx::quant::wire_layout<Bits, B, M>;
  std::vector<std::byte> out(layout::bytes(n), std::byte{0});
  const std::size_t nb = layout::buckets(n);
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t first = b * B;
    const std::size_t count = n - first < B ? n - first : B;
    const std::size_t S = (count + 7) / 8;
    M mn = static_cast<M>(x[first]), mx = mn;
    bool finite = true;
    for (std::size_t i = 0; i < count; ++i) {
      const M v = static_cast<M>(x[first + i]);
      if (!(v - v == M(0))) finite = false;
      if (v < mn) mn = v;
      if (v > mx) mx = v;
    }
    const auto p = cgx::quant::make_bucket_params<Bits, M>(mn, mx, finite);
    const M rec[2] = {p.min, p.unit};
    std::memcpy(out.data() + b * sizeof(rec), rec, sizeof(rec));
    if (!p.finite) continue;
    auto* codes = reinterpret_cast<std::uint8_t*>(out.data()) + layout::codes_offset(n, b);
    for (std::size_t j = 0; j < S; ++j) {
      const cgx::quant::rounding_offsets<Rounding> off(rng, rng.position + first, static_cast<std::uint32_t>(j));
      std::uint64_t word = 0;  // the b-byte word W_j, little-endian bit concatenation
      for (int k = 0; k < 8; ++k) {
        const std::size_t idx = static_cast<std::size_t>(k) * S + j;
        const M v = idx < count ? static_cast<M>(x[first + idx]) : p.min;
        std::uint32_t c;
        if (p.wide)
          c = cgx::quant::encode_value_wide<Bits, M>(v, p.min, p.inv, off.template get<M>(k));
        else if (p.scaled)
          c = cgx::quant::encode_value<Bits, true, M>(v, p.min, p.inv, off.template get<M>(k));
        else
          c = cgx::quant::encode_value<Bits, false, M>(v, p.min, p.inv, off.template get<M>(k));
        word |= static_cast<std::uint64_t>(c) << (k * Bits);
      }
      for (int q = 0; q < Bits; ++q) codes[static_cast<std::size_t>(q) * S + j] = static_cast<std::uint8_t>(word >> (8 * q));
    }
  }
  return out;
}

template <int Bits, std::size_t B, class T>
std::vector<T> reference_decompress(const std::byte* in, std::size_t n) {
  using M = cgx::quant::meta_t<T>;
  using layout = cgx::quant::wire_layout<Bits, B, M>;
  std::vector<T> y(n);
  const std::size_t nb = layout::buckets(n);
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t first = b * B;
    const std::size_t count = n - first < B ? n - first : B;
    const std::size_t S = (count + 7) / 8;
    M rec[2];
    std::memcpy(rec, in + b * sizeof(rec), sizeof(rec));
    const auto* codes = reinterpret_cast<const std::uint8_t*>(in) + layout::codes_offset(n, b);
    const bool wide = cgx::quant::is_wide<Bits, M>(rec[0], rec[1]);
    for (std::size_t j = 0; j < S; ++j) {
      std::uint64_t word = 0;
      for (int q = 0; q < Bits; ++q) word |= static_cast<std::uint64_t>(codes[static_cast<std::size_t>(q) * S + j]) << (8 * q);
      for (int k = 0; k < 8; ++k) {
        const std::size_t idx = static_cast<std::size_t>(k) * S + j;
        if (idx >= count) continue;
        const auto c = static_cast<std::uint32_t>((word >> (k * Bits)) & ((1u << Bits) - 1));
        y[first + idx] = static_cast<T>(wide ? cgx::quant::decode_value_wide<M>(c, rec[0], rec[1])
                                             : cgx::quant::decode_value<M>(c, rec[0], rec[1]));
      }
    }
  }
  return y;
}

}  // namespace cgx_test
