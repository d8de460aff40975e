// Runtime choice of the host kernels' instruction set (quant/host_isa.hpp): every path
// this CPU can run writes the same bytes as the scalar reference, for every width,
// rounding, a few bucket shapes, float and double, and buckets of every kind (normal,
// constant, subnormal range, huge range, near the limits, NaN/Inf), and decodes to the
// same bits, also through maxmin's fused add_requantize; the choice logic picks the
// right path for other CPUs' features.
#include <doctest/doctest.h>

#include <cgx/quant/maxmin.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using cgx::quant::host_isa;
using cgx::quant::maxmin;
using cgx::quant::nearest;
using cgx::quant::rng_state;
using cgx::quant::stochastic;

constexpr host_isa all_isas[] = {host_isa::scalar, host_isa::sse2, host_isa::avx2, host_isa::avx512, host_isa::neon};

/// The paths this CPU and build can run.
std::vector<host_isa> runnable() {
  std::vector<host_isa> v;
  for (host_isa i : all_isas)
    if (cgx::quant::host_isa_supported(i, cgx::quant::this_cpu())) v.push_back(i);
  return v;
}

/// Restores the process's path when a test case ends.
struct isa_guard {
  host_isa saved = cgx::quant::active_host_isa();
  ~isa_guard() { cgx::quant::force_host_isa(saved); }
};

/// n values in buckets of B whose kinds cycle: gradient-like, constant, subnormal range,
/// range above 2^120 (inv below 2^-120), near the largest value (wide), one NaN, one Inf,
/// tiny offsets around a large value.
template <class T>
std::vector<T> mixed(std::size_t n, std::size_t B, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double big = static_cast<double>(std::numeric_limits<T>::max());
  const double sub = static_cast<double>(std::numeric_limits<T>::denorm_min());
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t kind = (i / B) % 8;
    double v = 0;
    switch (kind) {
      case 0: v = d(g) * (1.0 + static_cast<double>(i % 97) / 10.0); break;
      case 1: v = 3.25; break;
      case 2: v = sub * std::floor(u(g) * 900.0); break;
      case 3: v = (u(g) - 0.5) * 0x1p122 * (std::is_same_v<T, float> ? 1.0 : 0x1p800); break;
      case 4: v = (u(g) * 2.0 - 1.0) * big; break;
      case 5: v = i % B == 3 ? std::numeric_limits<double>::quiet_NaN() : d(g); break;
      case 6: v = i % B == 5 ? -std::numeric_limits<double>::infinity() : d(g); break;
      default: v = 1e6 + d(g) * 1e-3; break;
    }
    x[i] = static_cast<T>(v);
  }
  return x;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T, class Q>
void paths_agree(std::size_t n, unsigned seed) {
  CAPTURE(n);
  const auto x = mixed<T>(n, Q::bucket_size, seed);
  rng_state rng;
  rng.seed = 0x5eed0000u + seed;
  rng.counter = 11;
  rng.stream = 2;
  rng.position = (std::uint64_t{1} << 32) + 77 * Q::bucket_size;  // positions above 2^32
  const std::size_t bytes = Q::template compressed_bytes<T>(n);
  std::vector<T> acc0(n);
  for (std::size_t i = 0; i < n; ++i) acc0[i] = static_cast<T>(static_cast<double>(i % 7) * 0.37 - 1.0);

  cgx::quant::force_host_isa(host_isa::scalar);
  std::vector<std::byte> want(bytes);
  Q::template compress<T>(x.data(), n, want.data(), rng);
  std::vector<T> want_dec(n), want_add = acc0;
  Q::template decompress<T>(want.data(), n, want_dec.data());
  Q::template decompress_add<T>(want.data(), n, want_add.data());
  // The owner's fused step (add_requantize): x += decoded want, compressed with rng,
  // decoded back; the separate calls on the scalar path give the expected bytes.
  std::vector<T> want_sum = x;
  Q::template decompress_add<T>(want.data(), n, want_sum.data());
  std::vector<std::byte> want_sum_bytes(bytes);
  Q::template compress<T>(want_sum.data(), n, want_sum_bytes.data(), rng);
  Q::template decompress<T>(want_sum_bytes.data(), n, want_sum.data());

  for (host_isa i : runnable()) {
    CAPTURE(cgx::quant::to_string(i));
    cgx::quant::force_host_isa(i);
    REQUIRE(cgx::quant::active_host_isa() == i);
    std::vector<std::byte> got(bytes);
    Q::template compress<T>(x.data(), n, got.data(), rng);
    CHECK(std::memcmp(got.data(), want.data(), bytes) == 0);
    std::vector<T> dec(n), add = acc0;
    Q::template decompress<T>(want.data(), n, dec.data());
    Q::template decompress_add<T>(want.data(), n, add.data());
    CHECK(same_bits(dec, want_dec));
    CHECK(same_bits(add, want_add));
    for (int threads : {1, 3}) {
      CAPTURE(threads);
      std::vector<std::byte> fused(bytes);
      std::vector<T> own = x;  // no addend: compress and decode back in one pass
      Q::template add_requantize<T>(nullptr, own.data(), n, fused.data(), rng, cgx::quant::host_exec{threads});
      CHECK(std::memcmp(fused.data(), want.data(), bytes) == 0);
      CHECK(same_bits(own, want_dec));
      own = x;
      Q::template add_requantize<T>(want.data(), own.data(), n, fused.data(), rng, cgx::quant::host_exec{threads});
      CHECK(std::memcmp(fused.data(), want_sum_bytes.data(), bytes) == 0);
      CHECK(same_bits(own, want_sum));
    }
  }
}

template <class T, int Bits, std::size_t B>
void sweep() {
  CAPTURE(Bits);
  CAPTURE(B);
  for (std::size_t n : {std::size_t{1}, B - 1, 9 * B, 16 * B + 13}) {
    paths_agree<T, maxmin<Bits, B, nearest>>(n, static_cast<unsigned>(n + Bits));
    paths_agree<T, maxmin<Bits, B, stochastic>>(n, static_cast<unsigned>(n + Bits + 1));
  }
}

template <int Bits>
void sweep_width() {
  sweep<float, Bits, 8>();
  sweep<float, Bits, 40>();
  sweep<float, Bits, 1024>();
  sweep<double, Bits, 24>();
  sweep<double, Bits, 1024>();
}

}  // namespace

TEST_CASE("host_isa: every runnable path writes the scalar reference's bytes and decodes to its bits") {
  isa_guard guard;
  MESSAGE("paths run here: " << [] {
    std::string s;
    for (host_isa i : runnable()) s += std::string(cgx::quant::to_string(i)) + " ";
    return s;
  }());
  sweep_width<1>();
  sweep_width<2>();
  sweep_width<3>();
  sweep_width<4>();
  sweep_width<5>();
  sweep_width<6>();
  sweep_width<7>();
  sweep_width<8>();
}

TEST_CASE("host_isa: a bucket of 2^20 values on every path") {
  isa_guard guard;
  paths_agree<float, maxmin<4, std::size_t{1} << 20, stochastic>>((std::size_t{1} << 20) + 4099, 5);
}

TEST_CASE("host_isa: the choice for other CPUs' features") {
  using cgx::quant::best_host_isa;
  using cgx::quant::cpu_features;
  cpu_features none;
  CHECK(best_host_isa(none) == host_isa::scalar);
#if defined(__x86_64__) && CGX_HAS_HOST_SIMD
  cpu_features f;
  f.sse2 = true;
  CHECK(best_host_isa(f) == host_isa::sse2);
  f.avx2 = true;
  CHECK(best_host_isa(f) == host_isa::sse2);  // AVX2 without FMA is not enough
  f.fma = true;
  CHECK(best_host_isa(f) == host_isa::avx2);
  f.avx512f = f.avx512bw = f.avx512dq = true;
  CHECK(best_host_isa(f) == host_isa::avx2);  // no AVX-512VL
  f.avx512vl = true;
  CHECK(best_host_isa(f) == host_isa::avx512);
  CHECK_FALSE(cgx::quant::host_isa_supported(host_isa::neon, f));
#elif defined(__aarch64__) && CGX_HAS_HOST_SIMD
  cpu_features f;
  f.neon = true;
  CHECK(best_host_isa(f) == host_isa::neon);
  f.avx2 = f.fma = f.sse2 = true;
  CHECK(best_host_isa(f) == host_isa::neon);
#else
  cpu_features f;
  f.sse2 = f.avx2 = f.fma = f.neon = true;
  CHECK(best_host_isa(f) == host_isa::scalar);
#endif
  // This CPU: the detected path is runnable and the best of the runnable ones.
  const auto here = runnable();
  CHECK(cgx::quant::detected_host_isa() == here.back());
}

TEST_CASE("host_isa: forcing a path this CPU cannot run throws and changes nothing") {
  isa_guard guard;
  const host_isa before = cgx::quant::active_host_isa();
  int refused = 0;
  for (host_isa i : all_isas) {
    if (cgx::quant::host_isa_supported(i, cgx::quant::this_cpu())) continue;
    CAPTURE(cgx::quant::to_string(i));
    CHECK_THROWS_AS(cgx::quant::force_host_isa(i), cgx::error);
    CHECK(cgx::quant::active_host_isa() == before);
    ++refused;
  }
  CHECK(refused >= 1);  // no CPU runs both the x86 and the AArch64 paths
  CHECK(cgx::quant::force_host_isa(host_isa::scalar) == before);
  CHECK(cgx::quant::active_host_isa() == host_isa::scalar);
}

TEST_CASE("host_isa: names") {
  for (host_isa i : all_isas) {
    host_isa back{};
    REQUIRE(cgx::quant::parse_host_isa(cgx::quant::to_string(i), back));
    CHECK(back == i);
  }
  host_isa out = host_isa::avx2;
  CHECK_FALSE(cgx::quant::parse_host_isa("avx3", out));
  CHECK(out == host_isa::avx2);
}
