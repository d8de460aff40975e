#pragma once
/// \file philox.hpp
/// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw
/// ("Parallel random numbers: as easy as 1, 2, 3", SC 2011). A pure function of a
/// 128-bit counter and a 64-bit key: any element's random bits can be computed
/// by any thread on host or device, so stochastic rounding does not depend on
/// the thread layout and host and device agree bit for bit.

#include <cstdint>

#include "../config.hpp"

namespace cgx::quant {

/// Four 32-bit words: a Philox counter or output block.
struct philox_block {
  std::uint32_t w[4];
};

namespace detail {
CGX_HOST_DEVICE CGX_FORCEINLINE void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                               std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace detail

/// Philox4x32 with `Rounds` rounds (10 is the published default and what cgx uses).
template <int Rounds = 10>
CGX_HOST_DEVICE CGX_FORCEINLINE philox_block philox4x32(philox_block c, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;  // multipliers
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;  // key schedule (Weyl) increments
  CGX_UNROLL
  for (int r = 0; r < Rounds; ++r) {
    std::uint32_t h0, l0, h1, l1;
    detail::mul_hi_lo(m0, c.w[0], h0, l0);
    detail::mul_hi_lo(m1, c.w[2], h1, l1);
    c = philox_block{{h1 ^ c.w[1] ^ k0, l1, h0 ^ c.w[3] ^ k1, l0}};
    k0 += w0;
    k1 += w1;
  }
  return c;
}

}  // namespace cgx::quant
