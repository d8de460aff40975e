// Host kernels of cgx::quant::maxmin: bytes equal to the value-by-value reference,
// error bounds, unbiasedness, edge cases (NaN/Inf, limits, denormals, constants,
// n = 0, partial buckets, unaligned pointers, threads).
#include <doctest/doctest.h>

#include <cgx/quant/maxmin.hpp>
#include <cgx/quant/none.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <random>
#include <vector>

#include "quant_reference.hpp"

namespace {

using cgx::quant::maxmin;
using cgx::quant::nearest;
using cgx::quant::rng_state;
using cgx::quant::stochastic;

template <class T>
std::vector<T> gradient_like(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(d(g) * (1.0 + static_cast<double>(i % 97) / 10.0));
  return x;
}

// Decoded values equal the reference's bit for bit (min + (code * unit), the product
// never contracted into an FMA on any path; NaN matches NaN).
template <class T>
bool same_decode(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T, class Q>
void check_against_reference(std::size_t n, unsigned seed) {
  constexpr int Bits = Q::bits;
  constexpr std::size_t B = Q::bucket_size;
  auto x = gradient_like<T>(n, seed);
  rng_state rng;
  rng.seed = 1234 + seed;
  rng.counter = 7;
  rng.stream = 3;
  rng.position = 4096;
  std::vector<std::byte> got(Q::template compressed_bytes<T>(n) + 1);
  Q::template compress<T>(x.data(), n, got.data(), rng);
  const auto want = cgx_test::reference_compress<Bits, B, typename Q::rounding, T>(x.data(), n, rng);
  REQUIRE(want.size() == Q::template compressed_bytes<T>(n));
  CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);

  std::vector<T> dec(n, T(-1));
  Q::template decompress<T>(got.data(), n, dec.data());
  const auto ref = cgx_test::reference_decompress<Bits, B, T>(want.data(), n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += same_decode(dec[i], ref[i]) ? 0 : 1;
  CHECK(bad == 0);

  std::vector<T> acc(n);
  for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(i % 5) - T(2);
  const auto base = acc;
  Q::template decompress_add<T>(got.data(), n, acc.data());
  bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += same_decode<T>(acc[i], base[i] + ref[i]) ? 0 : 1;
  CHECK(bad == 0);
}

template <class T, int Bits, std::size_t B>
void reference_sweep() {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, B - 1, B, B + 1, 3 * B + 5,
                        std::size_t{10007}}) {
    CAPTURE(n);
    check_against_reference<T, maxmin<Bits, B, nearest>>(n, static_cast<unsigned>(n));
    check_against_reference<T, maxmin<Bits, B, stochastic>>(n, static_cast<unsigned>(n) + 1);
  }
}

template <int Bits>
void reference_all_buckets() {
  CAPTURE(Bits);
  reference_sweep<float, Bits, 8>();
  reference_sweep<float, Bits, 24>();
  reference_sweep<float, Bits, 1024>();
  reference_sweep<double, Bits, 32>();
  reference_sweep<double, Bits, 1024>();
}

}  // namespace

TEST_CASE("maxmin: compressed bytes equal the value-by-value reference, every width") {
  reference_all_buckets<1>();
  reference_all_buckets<2>();
  reference_all_buckets<3>();
  reference_all_buckets<4>();
  reference_all_buckets<5>();
  reference_all_buckets<6>();
  reference_all_buckets<7>();
  reference_all_buckets<8>();
}

namespace {

// Per-value error of one quantization against the documented bound.
template <class T, class Q>
void check_error_bound(const std::vector<T>& x) {
  using M = cgx::quant::meta_t<T>;
  constexpr std::size_t B = Q::bucket_size;
  constexpr double L = (1 << Q::bits) - 1;
  const std::size_t n = x.size();
  std::vector<std::byte> c(Q::template compressed_bytes<T>(n));
  Q::template compress<T>(x.data(), n, c.data(), rng_state{});
  std::vector<T> y(n);
  Q::template decompress<T>(c.data(), n, y.data());
  std::size_t bad = 0;
  for (std::size_t b = 0; b * B < n; ++b) {
    const std::size_t e = std::min(n, (b + 1) * B);
    const auto [lo, hi] = std::minmax_element(x.begin() + static_cast<std::ptrdiff_t>(b * B), x.begin() + static_cast<std::ptrdiff_t>(e));
    const double unit = (static_cast<double>(*hi) - static_cast<double>(*lo)) / L;
    const double mag = std::max(std::fabs(static_cast<double>(*lo)), std::fabs(static_cast<double>(*hi)));
    // Rounding of the stored unit and of the decode: a few ulp of the bucket's magnitude,
    // and at most one step of the type's grid at the bottom (denorm_min), far below the
    // subnormal test ranges (a 4-bit unit of 200 subnormal steps is 13 of them).
    const double slack = 8 * std::numeric_limits<M>::epsilon() * mag + std::numeric_limits<M>::denorm_min();
    const double bound = std::is_same_v<typename Q::rounding, nearest> ? unit / 2 : unit;
    for (std::size_t i = b * B; i < e; ++i) {
      const double err = std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i]));
      if (!(err <= bound + slack)) ++bad;
    }
  }
  CHECK(bad == 0);
}

template <int Bits>
void error_bounds_for_width() {
  CAPTURE(Bits);
  const auto xf = gradient_like<float>(5000, 11);
  const auto xd = gradient_like<double>(5000, 12);
  check_error_bound<float, maxmin<Bits, 1024, nearest>>(xf);
  check_error_bound<float, maxmin<Bits, 1024, stochastic>>(xf);
  check_error_bound<float, maxmin<Bits, 128, nearest>>(xf);
  check_error_bound<double, maxmin<Bits, 1024, nearest>>(xd);
  check_error_bound<double, maxmin<Bits, 512, stochastic>>(xd);
}

}  // namespace

TEST_CASE("maxmin: error within unit/2 (nearest) and one unit (stochastic)") {
  error_bounds_for_width<1>();
  error_bounds_for_width<2>();
  error_bounds_for_width<3>();
  error_bounds_for_width<4>();
  error_bounds_for_width<5>();
  error_bounds_for_width<6>();
  error_bounds_for_width<7>();
  error_bounds_for_width<8>();
}

TEST_CASE("maxmin: double data with a large offset keeps the fp64 error bound") {
  // fp32 metadata could not even store the minimum of this bucket to within a unit.
  std::vector<double> x(2048);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0e9 + 1e-3 * std::sin(static_cast<double>(i));
  check_error_bound<double, maxmin<8, 1024, nearest>>(x);
  check_error_bound<double, maxmin<4, 1024, stochastic>>(x);
}

TEST_CASE("maxmin stochastic rounding is unbiased") {
  // 256 values in one bucket, T = 20000 independent roundings (the call counter
  // changes). Each rounding of value i has error e with |e| < unit and variance
  // v_i = f(1-f) unit^2 <= unit^2/4. The mean over T trials has standard deviation
  // <= unit / (2 sqrt(T)) = 0.0035 unit; the generator's 16-bit resolution adds a bias
  // of at most 2^-16 unit. Tolerance: 5 standard deviations + that bias, per value.
  using Q = maxmin<3, 256, stochastic>;
  constexpr int trials = 20000;
  std::vector<float> x(256);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  x[0] = -1.0f;
  x[1] = 1.0f;  // range exactly [-1, 1]
  const double unit = 2.0 / 7.0;
  std::vector<double> sum(x.size(), 0.0);
  std::vector<std::byte> c(Q::compressed_bytes<float>(x.size()));
  std::vector<float> y(x.size());
  rng_state rng;
  rng.seed = 99;
  for (int t = 0; t < trials; ++t) {
    rng.counter = static_cast<std::uint32_t>(t);
    Q::compress<float>(x.data(), x.size(), c.data(), rng);
    Q::decompress<float>(c.data(), x.size(), y.data());
    for (std::size_t i = 0; i < x.size(); ++i) sum[i] += y[i];
  }
  const double tol = 5 * unit / (2 * std::sqrt(static_cast<double>(trials))) + unit / 65536;
  double worst = 0, total_bias = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double bias = sum[i] / trials - static_cast<double>(x[i]);
    worst = std::max(worst, std::fabs(bias));
    total_bias += bias;
  }
  CAPTURE(worst);
  CAPTURE(tol);
  CHECK(worst <= tol);
  // The average bias over all 256 values is 16x tighter still.
  CHECK(std::fabs(total_bias / 256) <= tol / 16 * 5);
  // Not vacuous: nearest rounding of the same data is biased far beyond the tolerance.
  using N = maxmin<3, 256, nearest>;
  N::compress<float>(x.data(), x.size(), c.data(), rng);
  N::decompress<float>(c.data(), x.size(), y.data());
  double nearest_worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) nearest_worst = std::max(nearest_worst, std::fabs(double(y[i]) - x[i]));
  CHECK(nearest_worst > 10 * tol);
}

TEST_CASE("maxmin: constant buckets are reproduced exactly") {
  // As values: a bucket of -0.0 decodes to +0.0 (min + 0 * 0), equal under ==.
  {
    std::vector<float> x(100, -0.0f), y(100, 1.0f);
    std::vector<std::byte> c(maxmin<4, 32>::compressed_bytes<float>(100));
    maxmin<4, 32>::compress<float>(x.data(), 100, c.data());
    maxmin<4, 32>::decompress<float>(c.data(), 100, y.data());
    CHECK(x == y);
  }
  for (float v : {0.0f, 1.0f, -3.25f, 1e30f, -1e-30f, 1e-42f /* denormal */, 3.0e38f}) {
    CAPTURE(v);
    std::vector<float> x(2500, v);
    std::vector<std::byte> c(maxmin<1, 1024>::compressed_bytes<float>(x.size()));
    std::vector<float> y(x.size());
    maxmin<1, 1024, stochastic>::compress<float>(x.data(), x.size(), c.data());
    maxmin<1, 1024, stochastic>::decompress<float>(c.data(), x.size(), y.data());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
    std::vector<std::byte> c8(maxmin<8, 1024>::compressed_bytes<float>(x.size()));
    maxmin<8, 1024, nearest>::compress<float>(x.data(), x.size(), c8.data());
    maxmin<8, 1024, nearest>::decompress<float>(c8.data(), x.size(), y.data());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  }
  std::vector<double> xd(1500, 0.1);
  std::vector<std::byte> c(maxmin<4, 512>::compressed_bytes<double>(xd.size()));
  std::vector<double> yd(xd.size());
  maxmin<4, 512>::compress<double>(xd.data(), xd.size(), c.data());
  maxmin<4, 512>::decompress<double>(c.data(), xd.size(), yd.data());
  CHECK(std::memcmp(xd.data(), yd.data(), xd.size() * sizeof(double)) == 0);
}

TEST_CASE("maxmin: NaN or Inf makes its bucket non-finite, and only its bucket") {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (float s : specials) {
    for (std::size_t pos : {std::size_t{0}, std::size_t{1500}, std::size_t{2047}, std::size_t{2100}}) {
      CAPTURE(s);
      CAPTURE(pos);
      auto x = gradient_like<float>(2200, 5);  // buckets [0,1024) [1024,2048) [2048,2200)
      x[pos] = s;
      using Q = maxmin<4, 1024, stochastic>;
      std::vector<std::byte> c(Q::compressed_bytes<float>(x.size()));
      std::vector<float> y(x.size());
      Q::compress<float>(x.data(), x.size(), c.data());
      Q::decompress<float>(c.data(), x.size(), y.data());
      const std::size_t b = pos / 1024;
      std::size_t finite_in_bad = 0, nonfinite_elsewhere = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (i / 1024 == b)
          finite_in_bad += std::isfinite(y[i]) ? 1 : 0;
        else
          nonfinite_elsewhere += std::isfinite(y[i]) ? 0 : 1;
      }
      CHECK(finite_in_bad == 0);
      CHECK(nonfinite_elsewhere == 0);
      // decompress_add propagates it too.
      std::vector<float> acc(x.size(), 1.0f);
      Q::decompress_add<float>(c.data(), x.size(), acc.data());
      CHECK(!std::isfinite(acc[pos]));
    }
  }
}

TEST_CASE("maxmin: values near the float limits (max - min overflows)") {
  const float big = std::numeric_limits<float>::max();
  std::vector<float> x(1024);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 2 ? 1.0f : -1.0f) * (big * (static_cast<float>(i % 7 + 1) / 7.0f));
  x[0] = -big;
  x[1] = big;
  for (float v : x) REQUIRE(std::isfinite(v));
  auto check = [&](auto q) {
    using Q = decltype(q);
    std::vector<std::byte> c(Q::template compressed_bytes<float>(x.size()));
    std::vector<float> y(x.size());
    Q::template compress<float>(x.data(), x.size(), c.data(), rng_state{});
    Q::template decompress<float>(c.data(), x.size(), y.data());
    std::size_t nonfinite = 0, too_far = 0;
    const double unit = 2.0 * static_cast<double>(big) / ((1 << Q::bits) - 1);
    // The documented bound: unit / 2 for nearest, under one unit for stochastic.
    const double bound = (std::is_same_v<typename Q::rounding, nearest> ? 0.5 : 1.0) * unit * 1.0001;
    for (std::size_t i = 0; i < x.size(); ++i) {
      nonfinite += std::isfinite(y[i]) ? 0 : 1;
      if (std::fabs(static_cast<double>(y[i]) - x[i]) > bound) ++too_far;
    }
    CHECK(nonfinite == 0);
    CHECK(too_far == 0);
    // The wide path is part of the wire format: same bytes as the reference.
    const auto want = cgx_test::reference_compress<Q::bits, 1024, typename Q::rounding, float>(x.data(), x.size(), rng_state{});
    CHECK(std::memcmp(c.data(), want.data(), want.size()) == 0);
  };
  check(maxmin<1, 1024, nearest>{});
  check(maxmin<1, 1024, stochastic>{});
  check(maxmin<2, 1024, nearest>{});
  check(maxmin<4, 1024, stochastic>{});
  check(maxmin<8, 1024, nearest>{});
}

TEST_CASE("maxmin: subnormal ranges") {
  // Range of a few subnormal steps: 1/unit overflows float, the rescaled path is used.
  std::vector<float> x(1024);
  const float tiny = std::numeric_limits<float>::denorm_min();
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = tiny * static_cast<float>(i % 200);
  check_error_bound<float, maxmin<4, 1024, nearest>>(x);
  check_error_bound<float, maxmin<8, 1024, stochastic>>(x);
  check_error_bound<float, maxmin<2, 1024, stochastic>>(x);
  // Fewer subnormal steps than codes: (max - min) / L underflows to 0, and the unit is
  // the smallest subnormal (every value then decodes exactly; before, all decoded to min).
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = tiny * static_cast<float>(i % 50);
  check_error_bound<float, maxmin<8, 1024, nearest>>(x);
  check_error_bound<float, maxmin<8, 1024, stochastic>>(x);
  check_error_bound<float, maxmin<7, 1024, nearest>>(x);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -tiny * static_cast<float>(i % 3);
  check_error_bound<float, maxmin<4, 1024, nearest>>(x);
  // Subnormal values riding on a normal offset.
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1e-38f + tiny * static_cast<float>(i % 13);
  check_error_bound<float, maxmin<4, 1024, nearest>>(x);
  std::vector<double> xd(600);
  for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = std::numeric_limits<double>::denorm_min() * static_cast<double>(i % 300);
  check_error_bound<double, maxmin<5, 512, nearest>>(xd);
  for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = std::numeric_limits<double>::denorm_min() * static_cast<double>(i % 20);
  check_error_bound<double, maxmin<6, 512, nearest>>(xd);
  check_error_bound<double, maxmin<8, 512, stochastic>>(xd);
}

TEST_CASE("maxmin: n = 0 and partial last buckets") {
  using Q = maxmin<4, 1024, stochastic>;
  CHECK(Q::compressed_bytes<float>(0) == 0);
  Q::compress<float>(nullptr, 0, nullptr);
  Q::decompress<float>(nullptr, 0, static_cast<float*>(nullptr));
  Q::decompress_add<float>(nullptr, 0, static_cast<float*>(nullptr));
  // A partial bucket never writes past compressed_bytes nor past n on decode.
  for (std::size_t n : {1, 5, 8, 13, 1023, 1025, 2047}) {
    auto x = gradient_like<float>(n, 3);
    std::vector<std::byte> c(Q::compressed_bytes<float>(n) + 64, std::byte{0xAB});
    Q::compress<float>(x.data(), n, c.data());
    for (std::size_t i = Q::compressed_bytes<float>(n); i < c.size(); ++i) CHECK(c[i] == std::byte{0xAB});
    std::vector<float> y(n + 16, 42.0f);
    Q::decompress<float>(c.data(), n, y.data());
    for (std::size_t i = n; i < y.size(); ++i) CHECK(y[i] == 42.0f);
  }
}

TEST_CASE("maxmin: unaligned input and output pointers give the same bytes") {
  using Q = maxmin<4, 1024, nearest>;
  using S = maxmin<3, 1024, stochastic>;
  const std::size_t n = 5000;
  auto x = gradient_like<float>(n + 8, 9);
  std::vector<std::byte> ref(Q::compressed_bytes<float>(n));
  std::vector<float> aligned(x.begin() + 3, x.begin() + 3 + static_cast<std::ptrdiff_t>(n));
  Q::compress<float>(aligned.data(), n, ref.data());
  std::vector<std::byte> raw(ref.size() + 16);
  Q::compress<float>(x.data() + 3, n, raw.data() + 1);  // input off by 12 bytes, output odd
  CHECK(std::memcmp(raw.data() + 1, ref.data(), ref.size()) == 0);
  std::vector<std::byte> sref(S::compressed_bytes<float>(n)), sraw(sref.size() + 8);
  S::compress<float>(aligned.data(), n, sref.data());
  S::compress<float>(x.data() + 3, n, sraw.data() + 5);
  CHECK(std::memcmp(sraw.data() + 5, sref.data(), sref.size()) == 0);
  std::vector<float> y1(n), y2(n + 1);
  Q::decompress<float>(raw.data() + 1, n, y2.data() + 1);
  Q::decompress<float>(ref.data(), n, y1.data());
  CHECK(std::memcmp(y1.data(), y2.data() + 1, n * sizeof(float)) == 0);
}

TEST_CASE("maxmin: threads split buckets without changing a byte") {
  using Q = maxmin<4, 512, stochastic>;
  const std::size_t n = 100003;
  auto x = gradient_like<float>(n, 21);
  std::vector<std::byte> one(Q::compressed_bytes<float>(n)), three(one.size());
  rng_state rng;
  rng.seed = 5;
  Q::compress<float>(x.data(), n, one.data(), rng, cgx::quant::host_exec{1});
  Q::compress<float>(x.data(), n, three.data(), rng, cgx::quant::host_exec{3});
  CHECK(one == three);
  std::vector<float> a(n, 1.0f), b(n, 1.0f);
  Q::decompress_add<float>(one.data(), n, a.data(), cgx::quant::host_exec{1});
  Q::decompress_add<float>(one.data(), n, b.data(), cgx::quant::host_exec{3});
  CHECK(a == b);
}

TEST_CASE("maxmin: compressing a buffer in pieces at bucket boundaries gives the same bytes") {
  // rng_state::position makes the random bits depend on the global index only.
  using Q = maxmin<2, 256, stochastic>;
  const std::size_t n = 256 * 10;
  auto x = gradient_like<float>(n, 4);
  rng_state rng;
  rng.seed = 77;
  std::vector<std::byte> whole(Q::compressed_bytes<float>(n));
  Q::compress<float>(x.data(), n, whole.data(), rng);
  std::vector<float> a(n), b(n);
  Q::decompress<float>(whole.data(), n, a.data());
  for (std::size_t piece = 0; piece < 10; piece += 5) {
    rng_state r = rng;
    r.position = piece * 256;
    std::vector<std::byte> part(Q::compressed_bytes<float>(5 * 256));
    Q::compress<float>(x.data() + piece * 256, 5 * 256, part.data(), r);
    Q::decompress<float>(part.data(), 5 * 256, b.data() + piece * 256);
  }
  CHECK(a == b);
}

TEST_CASE("none: passthrough") {
  std::vector<double> x = {1.5, -2.0, 3.25};
  std::vector<std::byte> c(cgx::quant::none::compressed_bytes<double>(3));
  CHECK(c.size() == 24);
  cgx::quant::none::compress<double>(x.data(), 3, c.data());
  std::vector<double> y = {1, 1, 1};
  cgx::quant::none::decompress_add<double>(c.data(), 3, y.data());
  CHECK(y == std::vector<double>{2.5, -1.0, 4.25});
}
