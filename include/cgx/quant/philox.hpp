#pragma once
/// \file philox.hpp
/// Philox4x32-R, the counter-based generator of Salmon, Moraes, Dror and Shaw
/// ("Parallel random numbers: as easy as 1, 2, 3", SC 2011). A pure function of a
/// 128-bit counter and a 64-bit key: any element's random bits can be computed
/// by any thread on host or device, so stochastic rounding does not depend on
/// the thread layout and host and device agree bit for bit.

#include <cstdint>

#include "../config.hpp"

namespace cgx::quant {

/// Four 32-bit words: a Philox counter or output block.
struct philox_block {
  std::uint32_t w[4];  ///< the words, lowest first
};

namespace detail {
CGX_HOST_DEVICE CGX_FORCEINLINE void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                               std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace detail

/// The rounds of Philox4x32 that stochastic rounding uses: 7, the fewest that the
/// generator's authors found to pass all of TestU01's BigCrush ("Crush-resistant");
/// their default of 10 adds a margin of 3 rounds. The 16-bit fractions of stochastic
/// rounding need far less than BigCrush, and on the host the rounds are most of
/// the cost of a stochastic compress (each costs two 32x32->64-bit multiplies per
/// block: vpmuludq-bound on AVX2), so cgx spends 7. Both variants have published
/// known answers (Random123's kat_vectors); tests/test_philox.cpp checks both.
inline constexpr int stochastic_philox_rounds = 7;

/// Philox4x32 with `Rounds` rounds (10 is the published default; stochastic rounding
/// uses stochastic_philox_rounds).
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
