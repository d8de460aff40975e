#pragma once
/// \file crc32c.hpp
/// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final XOR
/// 0xFFFFFFFF; the checksum of "123456789" is 0xE3069283), the checksum of the host
/// transports' optional wire integrity check (plan_options::verify).
///
/// Two implementations that give the same value for every input:
/// - portable: eight 256-entry tables, eight bytes per step (about 1-2 GB/s);
/// - x86-64 with SSE 4.2: the `crc32` instruction on three independent streams of
///   4 KiB each, joined with a precomputed "append 4 KiB of zeros" operator (the
///   instruction's latency is three cycles, so three streams keep it busy), several
///   times faster. It is compiled with a function target, whatever flags the including
///   code uses, and chosen at run time when the CPU has SSE 4.2 (every x86-64 CPU since
///   2008). AArch64 uses the `crc32c` instructions when the build enables them
///   (`__ARM_FEATURE_CRC32`, e.g. -march=armv8.1-a or later), else the portable code.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../config.hpp"

#if defined(CGX_HOST_SIMD_X86)
#include <nmmintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define CGX_CRC32C_ARM 1
#endif

namespace cgx::detail {

namespace crc32c_impl {

inline constexpr std::uint32_t poly = 0x82F63B78u;  // reflected Castagnoli polynomial

/// slice[k][b]: the register after byte b followed by k zero bytes, from a zero register.
struct slice_tables {
  std::uint32_t t[8][256];
};

constexpr slice_tables make_slice_tables() noexcept {
  slice_tables s{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? poly : 0u);
    s.t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (std::uint32_t b = 0; b < 256; ++b) {
      const std::uint32_t prev = s.t[k - 1][b];
      s.t[k][b] = (prev >> 8) ^ s.t[0][prev & 0xffu];
    }
  return s;
}

inline const slice_tables& slices() noexcept {
  static constexpr slice_tables s = make_slice_tables();
  return s;
}

/// The register update (no initial or final XOR) over p[0..n), eight bytes a step.
inline std::uint32_t update_portable(std::uint32_t c, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = slices().t;
  if constexpr (std::endian::native == std::endian::little) {
    for (; n >= 8; p += 8, n -= 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      w ^= c;
      c = t[7][w & 0xffu] ^ t[6][(w >> 8) & 0xffu] ^ t[5][(w >> 16) & 0xffu] ^ t[4][(w >> 24) & 0xffu] ^
          t[3][(w >> 32) & 0xffu] ^ t[2][(w >> 40) & 0xffu] ^ t[1][(w >> 48) & 0xffu] ^ t[0][w >> 56];
    }
  }
  for (; n > 0; ++p, --n) c = t[0][(c ^ *p) & 0xffu] ^ (c >> 8);
  return c;
}

/// Bytes per stream in the three-stream loops.
inline constexpr std::size_t stream_bytes = 4096;

/// The operator "append stream_bytes zero bytes" on the register, which is linear over
/// GF(2): applied byte by byte through four 256-entry tables.
struct shift_tables {
  std::uint32_t t[4][256];
};

/// Register after `zeros` zero bytes from register c, as a 32x32 GF(2) matrix applied to c.
inline shift_tables make_shift_tables(std::size_t zeros) noexcept {
  using matrix = std::array<std::uint32_t, 32>;  // column i: the image of bit i
  auto apply = [](const matrix& m, std::uint32_t v) {
    std::uint32_t r = 0;
    for (int i = 0; v != 0; ++i, v >>= 1)
      if (v & 1u) r ^= m[static_cast<std::size_t>(i)];
    return r;
  };
  auto compose = [&](const matrix& a, const matrix& b) {  // a after b
    matrix r{};
    for (std::size_t i = 0; i < 32; ++i) r[i] = apply(a, b[i]);
    return r;
  };
  matrix one_bit{};  // one zero bit: shift right, fold the polynomial in
  one_bit[0] = poly;
  for (std::size_t i = 1; i < 32; ++i) one_bit[i] = std::uint32_t{1} << (i - 1);
  matrix step = compose(one_bit, one_bit);  // 2 bits
  step = compose(step, step);               // 4 bits
  step = compose(step, step);               // 8 bits: one zero byte
  matrix acc{};
  for (std::size_t i = 0; i < 32; ++i) acc[i] = std::uint32_t{1} << i;
  for (std::size_t z = zeros; z != 0; z >>= 1) {  // acc = step^zeros, by squaring
    if (z & 1u) acc = compose(step, acc);
    step = compose(step, step);
  }
  shift_tables s{};
  for (std::size_t k = 0; k < 4; ++k)
    for (std::uint32_t b = 0; b < 256; ++b) s.t[k][b] = apply(acc, b << (8 * k));
  return s;
}

/// The register after stream_bytes zero bytes from register c.
inline std::uint32_t shift_stream(std::uint32_t c) noexcept {
  static const shift_tables s = make_shift_tables(stream_bytes);
  return s.t[0][c & 0xffu] ^ s.t[1][(c >> 8) & 0xffu] ^ s.t[2][(c >> 16) & 0xffu] ^ s.t[3][c >> 24];
}

#if defined(CGX_HOST_SIMD_X86)
/// The register update with SSE 4.2's crc32 instruction (see the file comment).
__attribute__((target("sse4.2"))) inline std::uint32_t update_sse42(std::uint32_t c, const unsigned char* p,
                                                                    std::size_t n) noexcept {
  for (; n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0; ++p, --n) c = _mm_crc32_u8(c, *p);
  auto load = [](const unsigned char* q) {
    std::uint64_t w;
    std::memcpy(&w, q, 8);
    return w;
  };
  constexpr std::size_t L = stream_bytes;
  for (; n >= 3 * L; p += 3 * L, n -= 3 * L) {
    std::uint64_t c0 = c, c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < L; i += 8) {
      c0 = _mm_crc32_u64(c0, load(p + i));
      c1 = _mm_crc32_u64(c1, load(p + L + i));
      c2 = _mm_crc32_u64(c2, load(p + 2 * L + i));
    }
    // crc(A B C) from c: shift(shift(crc(A)) ^ crc(B from 0)) ^ crc(C from 0), by linearity.
    c = shift_stream(shift_stream(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1)) ^
        static_cast<std::uint32_t>(c2);
  }
  std::uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) c64 = _mm_crc32_u64(c64, load(p));
  c = static_cast<std::uint32_t>(c64);
  for (; n > 0; ++p, --n) c = _mm_crc32_u8(c, *p);
  return c;
}

/// True when this CPU has SSE 4.2 (asked once).
inline bool have_sse42() noexcept {
  static const bool v = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return v;
}
#endif

#if defined(CGX_CRC32C_ARM)
/// The register update with AArch64's crc32c instructions.
inline std::uint32_t update_arm(std::uint32_t c, const unsigned char* p, std::size_t n) noexcept {
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c = __crc32cd(c, w);
  }
  for (; n > 0; ++p, --n) c = __crc32cb(c, *p);
  return c;
}
#endif

}  // namespace crc32c_impl

/// Which implementation computes crc32c (tests force each one).
enum class crc32c_path { portable, hardware };

/// True when this build and CPU have the hardware path.
[[nodiscard]] inline bool crc32c_hardware_available() noexcept {
#if defined(CGX_HOST_SIMD_X86)
  return crc32c_impl::have_sse42();
#elif defined(CGX_CRC32C_ARM)
  return true;
#else
  return false;
#endif
}

/// CRC-32C of data[0..n) through `path` (the hardware path falls back to the portable
/// one where it is not available), continuing from the checksum `crc` of what came
/// before (0 for none).
[[nodiscard]] inline std::uint32_t crc32c(crc32c_path path, const void* data, std::size_t n,
                                          std::uint32_t crc = 0) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint32_t c = ~crc;
  if (path == crc32c_path::hardware) {
#if defined(CGX_HOST_SIMD_X86)
    if (crc32c_impl::have_sse42()) return ~crc32c_impl::update_sse42(c, p, n);
#elif defined(CGX_CRC32C_ARM)
    return ~crc32c_impl::update_arm(c, p, n);
#endif
  }
  return ~crc32c_impl::update_portable(c, p, n);
}

/// CRC-32C of data[0..n), by the fastest path this CPU has.
[[nodiscard]] inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  return crc32c(crc32c_path::hardware, data, n, crc);
}

}  // namespace cgx::detail
