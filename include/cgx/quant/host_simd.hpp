#pragma once
/// \file host_simd.hpp
/// The host kernels of cgx::quant::maxmin, compiled once per instruction set in the
/// including translation unit and chosen at run time (host_isa.hpp): a default build
/// (no -march) runs the same AVX2 code as a -march=native one on a CPU that has AVX2.
///
/// Each instruction set gets a namespace, compiled between CGX_TARGET_BEGIN and
/// CGX_TARGET_END (GCC/Clang function targets), that includes host_kernels.inl (the
/// vector kernels of one bucket) and host_loops.inl (the bucket loops):
///
///   simd::scalar   the value-by-value reference (host_reference.hpp); every build
///   simd::sse2     x86-64 baseline, 16-byte vectors           (CGX_HOST_SIMD_X86)
///   simd::avx2     AVX2 + FMA, 32-byte vectors                (CGX_HOST_SIMD_X86)
///   simd::avx512   the AVX2 kernels compiled for AVX-512 F/BW/DQ/VL (CGX_HOST_SIMD_X86)
///   simd::neon     AArch64 Advanced SIMD, 16-byte vectors     (CGX_HOST_SIMD_NEON)
///
/// compress_buckets / decode_buckets below switch once per call (per thread's range of
/// buckets) on the chosen instruction set. All of them write the same bytes.
///
/// A program that mixes translation units built with different -march flags gets, for
/// each of these inline functions, one copy chosen by the linker: a copy built with
/// -mavx512f may then serve the "avx2" path. Build the units that include cgx with the
/// same flags (as with any header-only SIMD library).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "../config.hpp"
#include "host_isa.hpp"
#include "host_reference.hpp"
#include "philox.hpp"
#include "rounding.hpp"
#include "wire_format.hpp"

#if defined(CGX_HOST_SIMD_X86)
#include <immintrin.h>
#endif

namespace cgx::quant::simd {

namespace scalar {
/// The scalar reference as kernels: no positions done by vectors.
struct kernels {
  template <class Meta>
  static void bucket_minmax(const Meta* x, std::size_t n, Meta& mn, Meta& mx, bool& finite) {
    detail::host_minmax<Meta, Meta>(x, n, mn, mx, finite);
  }
  template <int Bits, class Rounding, class Meta>
  static std::uint32_t bucket_encode(const Meta*, std::uint32_t, Meta, Meta, Meta, std::uint8_t*, const rng_state&,
                                     std::uint64_t, const Meta*, Meta*, Meta) {
    return 0;
  }
  template <int Bits, bool Add, class Meta>
  static std::uint32_t bucket_decode(const std::uint8_t*, std::uint32_t, Meta, Meta, Meta*, const Meta*) {
    return 0;
  }
};
#include "host_loops.inl"
}  // namespace scalar

#if defined(CGX_HOST_SIMD_X86)
CGX_TARGET_BEGIN("sse2")
namespace sse2 {
inline constexpr int vector_bytes = 16;
#include "host_kernels.inl"
#include "host_loops.inl"
}  // namespace sse2
CGX_TARGET_END

CGX_TARGET_BEGIN("avx2,fma")
namespace avx2 {
inline constexpr int vector_bytes = 32;
#include "host_kernels.inl"
#include "host_loops.inl"
}  // namespace avx2
CGX_TARGET_END

CGX_TARGET_BEGIN("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl")
namespace avx512 {
inline constexpr int vector_bytes = 32;
#include "host_kernels.inl"
#include "host_loops.inl"
}  // namespace avx512
CGX_TARGET_END
#endif

#if defined(CGX_HOST_SIMD_NEON)
namespace neon {
inline constexpr int vector_bytes = 16;
#include "host_kernels.inl"
#include "host_loops.inl"
}  // namespace neon
#endif

/// compress_buckets of the instruction set `isa` (scalar when this build lacks it).
template <int Bits, class Rounding, class T>
void compress_buckets(host_isa isa, const T* in, std::size_t n, std::size_t bucket, std::byte* out,
                      const rng_state& rng, std::size_t b0, std::size_t b1, std::size_t ahead = 1, T* back = nullptr) {
  switch (isa) {
#if defined(CGX_HOST_SIMD_X86)
    case host_isa::avx512: return avx512::compress_buckets<Bits, Rounding, T>(in, n, bucket, out, rng, b0, b1, ahead, back);
    case host_isa::avx2: return avx2::compress_buckets<Bits, Rounding, T>(in, n, bucket, out, rng, b0, b1, ahead, back);
    case host_isa::sse2: return sse2::compress_buckets<Bits, Rounding, T>(in, n, bucket, out, rng, b0, b1, ahead, back);
#endif
#if defined(CGX_HOST_SIMD_NEON)
    case host_isa::neon: return neon::compress_buckets<Bits, Rounding, T>(in, n, bucket, out, rng, b0, b1, ahead, back);
#endif
    default: return scalar::compress_buckets<Bits, Rounding, T>(in, n, bucket, out, rng, b0, b1, ahead, back);
  }
}

/// decode_buckets of the instruction set `isa` (scalar when this build lacks it).
template <int Bits, bool Add, class T>
void decode_buckets(host_isa isa, const std::byte* in, std::size_t n, std::size_t bucket, T* out, std::size_t b0,
                    std::size_t b1) {
  switch (isa) {
#if defined(CGX_HOST_SIMD_X86)
    case host_isa::avx512: return avx512::decode_buckets<Bits, Add, T>(in, n, bucket, out, b0, b1);
    case host_isa::avx2: return avx2::decode_buckets<Bits, Add, T>(in, n, bucket, out, b0, b1);
    case host_isa::sse2: return sse2::decode_buckets<Bits, Add, T>(in, n, bucket, out, b0, b1);
#endif
#if defined(CGX_HOST_SIMD_NEON)
    case host_isa::neon: return neon::decode_buckets<Bits, Add, T>(in, n, bucket, out, b0, b1);
#endif
    default: return scalar::decode_buckets<Bits, Add, T>(in, n, bucket, out, b0, b1);
  }
}

}  // namespace cgx::quant::simd
