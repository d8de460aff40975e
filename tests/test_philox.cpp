// Philox4x32-7 (what stochastic rounding uses) and -10: the published known answers,
// and the statistics of the 16-bit fractions that stochastic rounding uses.
#include <doctest/doctest.h>

#include <cgx/quant/philox.hpp>
#include <cgx/quant/wire_format.hpp>

#include <cmath>
#include <vector>

using cgx::quant::philox4x32;
using cgx::quant::philox_block;

namespace {
struct kat {
  philox_block ctr;
  std::uint32_t k0, k1;
  philox_block want;
};

template <int Rounds>
void check_known_answers(const kat (&kats)[3]) {
  for (const auto& k : kats) {
    const philox_block got = philox4x32<Rounds>(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) CHECK(got.w[i] == k.want.w[i]);
  }
}

// The three counters/keys of Random123's kat_vectors: zeros, ones, digits of pi.
constexpr philox_block zeros{{0, 0, 0, 0}}, ones{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
    pi{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
}  // namespace

TEST_CASE("Philox4x32-10 known-answer vectors (Random123 kat_vectors)") {
  const kat kats[] = {
      {zeros, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {ones, 0xffffffffu, 0xffffffffu, {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {pi, 0xa4093822u, 0x299f31d0u, {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  check_known_answers<10>(kats);
}

TEST_CASE("Philox4x32-7 known-answer vectors (Random123 kat_vectors)") {
  const kat kats[] = {
      {zeros, 0, 0, {{0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}}},
      {ones, 0xffffffffu, 0xffffffffu, {{0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}}},
      {pi, 0xa4093822u, 0x299f31d0u, {{0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}}},
  };
  static_assert(cgx::quant::stochastic_philox_rounds == 7, "update the known answers with the rounds");
  check_known_answers<cgx::quant::stochastic_philox_rounds>(kats);
}

TEST_CASE("stochastic rounding draws its fractions from Philox4x32-7 of {j, P, counter}") {
  // The wire format's promise (wire_format.hpp): position j of the bucket at global
  // index P takes counter {j, lo32(P), hi32(P), rng.counter} and key
  // {lo32(seed) ^ stream, hi32(seed)}; value j + k S uses half (k & 1) of word k / 2.
  cgx::quant::rng_state s;
  s.seed = 0x0123456789abcdefull;
  s.counter = 9;
  s.stream = 2;
  const std::uint64_t P = (std::uint64_t{5} << 32) + 1024 * 77;
  const cgx::quant::rounding_offsets<cgx::quant::stochastic> off(s, P, 13);
  const philox_block want = philox4x32<7>(philox_block{{13, static_cast<std::uint32_t>(P), 5, 9}},
                                          0x89abcdefu ^ 2u, 0x01234567u);
  for (int k = 0; k < 8; ++k) {
    const std::uint32_t half = (want.w[k / 2] >> (16 * (k % 2))) & 0xffffu;
    CHECK(off.get<float>(k) == static_cast<float>(half) / 65536.0f);
  }
}

TEST_CASE("stochastic rounding fractions are uniform on [0, 1)") {
  // 2^20 fractions from consecutive positions of one key, binned into 256 bins:
  // chi-square with 255 degrees of freedom has mean 255 and standard deviation
  // sqrt(510) = 22.6; accept below mean + 6 sd = 390 (fixed seed: deterministic).
  std::vector<double> bins(256, 0.0);
  cgx::quant::rng_state s;
  s.seed = 0x1234567890abcdefull;
  s.counter = 3;
  double mean = 0;
  const std::size_t positions = std::size_t{1} << 17;  // x 8 fractions each
  for (std::size_t j = 0; j < positions; ++j) {
    const cgx::quant::rounding_offsets<cgx::quant::stochastic> off(s, (j / 128) * 1024, static_cast<std::uint32_t>(j % 128));
    for (int k = 0; k < 8; ++k) {
      const float u = off.get<float>(k);
      REQUIRE(u >= 0.0f);
      REQUIRE(u < 1.0f);
      bins[static_cast<std::size_t>(u * 256)] += 1;
      mean += u;
    }
  }
  const double total = static_cast<double>(positions) * 8;
  const double expect = total / 256;
  double chi2 = 0;
  for (double b : bins) chi2 += (b - expect) * (b - expect) / expect;
  CAPTURE(chi2);
  CHECK(chi2 < 390.0);
  // Mean of U[0, 1 - 2^-16] fractions: 0.5 - 2^-17; sd of the mean 0.289 / sqrt(total).
  mean /= total;
  CHECK(std::fabs(mean - (0.5 - 1.0 / 131072)) < 6 * 0.2887 / std::sqrt(total));
  // Different streams (ranks) give different bits for the same position.
  cgx::quant::rng_state t = s;
  t.stream = 1;
  const cgx::quant::rounding_offsets<cgx::quant::stochastic> a(s, 0, 0), b(t, 0, 0);
  CHECK((a.r.w[0] != b.r.w[0] || a.r.w[1] != b.r.w[1]));
}
