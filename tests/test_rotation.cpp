// The rotated max-min codec (cgx::quant::rotated, issue 51) on one process: the transform
// against its definition (hadamard.hpp), inverse within float rounding; the error bounds
// of rotated.hpp (rotated domain per value, L2 and per element, deterministic; the
// stochastic per-element tail and unbiasedness, statistically); non-finite buckets; the
// bits of every host path (threads, add_requantize) against each other; the CUDA kernels'
// bodies run on the host (rotated_bodies.hpp) against the host codec, byte for byte; and,
// where the CUDA toolkit's headers are found (CGX_TEST_ROTATION_SIM), device plans with
// the codec on the simulated CUDA runtime against the host plans' bits.
#include <doctest/doctest.h>

#include <cgx/quant/rotated.hpp>
#include <cgx/quant/rotated_bodies.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if CGX_TEST_ROTATION_SIM
#include "sim_runtime.hpp"

#include <cgx/allreduce_plan.hpp>
#include <cgx/comm/cuda_ipc.cuh>
#include <cgx/comm/device_ring.cuh>
#include <cgx/comm/device_sra.cuh>
#include <cgx/comm/device_tree.cuh>
#include <cgx/device_plan.cuh>

#include <functional>
#include <memory>
#include <thread>

#include "gpu/thread_transport.hpp"
#endif

namespace {

using cgx::quant::maxmin;
using cgx::quant::nearest;
using cgx::quant::rotated;
using cgx::quant::stochastic;

/// Gaussian values with sparse outliers (one in `every`, `scale` times larger): the data
/// the rotation is for.
template <class T>
std::vector<T> spiky(std::size_t n, unsigned seed, std::size_t every = 97, double scale = 40.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(d(g) * (i % every == every / 2 ? scale : 1.0) + 0.1);
  return x;
}

/// Size of the dyadic block of position i in a bucket of r values (hadamard.hpp).
std::size_t block_of(std::size_t i, std::size_t r) {
  std::size_t start = 0;
  for (std::size_t m = std::size_t{1} << 20; m >= 1; m /= 2)
    if (r - start >= m) {
      if (i < start + m) return m;
      start += m;
    }
  return 1;
}

/// c of the block of size m: 1 for even log2 m, sqrt(2) for odd.
double c_of(std::size_t m) {
  unsigned a = 0;
  while ((std::size_t{1} << a) < m) ++a;
  return a % 2 == 0 ? 1.0 : std::sqrt(2.0);
}

/// The forward transform of one bucket from its definition, in double: signs from
/// Philox, then the Hadamard matrix of each dyadic block, entries (-1)^popcount(i & j),
/// times 2^-floor(a/2).
std::vector<double> reference_forward(const std::vector<double>& x, std::uint64_t seed, std::uint64_t bucket) {
  const std::size_t r = x.size();
  std::vector<double> s(r), y(r, 0.0);
  for (std::size_t i = 0; i < r; ++i) {
    const auto blk = cgx::quant::detail::rotation_signs(seed, bucket, static_cast<std::uint32_t>(i / 128));
    const bool neg = (blk.w[(i / 32) % 4] >> (i % 32)) & 1u;
    s[i] = neg ? -x[i] : x[i];
  }
  std::size_t start = 0;
  for (std::size_t m = std::size_t{1} << 20; m >= 1; m /= 2) {
    if (r - start < m) continue;
    unsigned a = 0;
    while ((std::size_t{1} << a) < m) ++a;
    const double scale = std::ldexp(1.0, -static_cast<int>(a / 2));
    for (std::size_t i = 0; i < m; ++i) {
      double acc = 0;
      for (std::size_t j = 0; j < m; ++j) acc += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * s[start + j];
      y[start + i] = acc * scale;
    }
    start += m;
  }
  return y;
}

template <class M>
M meta_at(const std::byte* wire, std::size_t b, int k) {
  M v;
  std::memcpy(&v, wire + b * 2 * sizeof(M) + static_cast<std::size_t>(k) * sizeof(M), sizeof(M));
  return v;
}

}  // namespace

TEST_CASE("rotation: the forward transform is its definition; the inverse undoes it within float rounding") {
  using R1024 = rotated<maxmin<4, 1024, nearest>>;
  using R128 = rotated<maxmin<4, 128, nearest>>;
  using R8 = rotated<maxmin<4, 8, nearest>, 12345>;
  auto check = [](auto q, std::size_t r, std::uint64_t bucket, unsigned seed) {
    using R = decltype(q);
    CAPTURE(R::bucket_size);
    CAPTURE(r);
    CAPTURE(bucket);
    const auto xf = spiky<float>(r, seed);
    std::vector<double> xd(xf.begin(), xf.end());
    const auto want = reference_forward(xd, R::seed, bucket);
    std::vector<float> y = xf;
    R::rotate(y.data(), r, bucket, true);
    double mx = 0, norm_x = 0, norm_y = 0;
    for (std::size_t i = 0; i < r; ++i) {
      mx = std::max(mx, std::fabs(want[i]));
      norm_x += xd[i] * xd[i];
      norm_y += static_cast<double>(y[i]) * y[i] / (c_of(block_of(i, r)) * c_of(block_of(i, r)));
    }
    // Float rounding: log2(B) additions, each within 2^-24 of values at most mx.
    const double tol = 12.0 * 0x1p-24 * mx * (1.0 + std::log2(static_cast<double>(R::bucket_size)));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < r; ++i)
      if (std::fabs(y[i] - want[i]) > tol) ++bad;
    CHECK_MESSAGE(bad == 0, bad << " rotated values differ from the definition by more than " << tol);
    // Orthogonality (Q y / c has x's norm), and the rotation is not the identity.
    CHECK(std::fabs(norm_y - norm_x) <= 1e-5 * norm_x);
    if (r >= 8) {
      std::size_t moved = 0;
      for (std::size_t i = 0; i < r; ++i) moved += std::fabs(y[i] - xf[i]) > 1e-3;
      CHECK(moved > r / 2);
    }
    R::rotate(y.data(), r, bucket, false);
    bad = 0;
    for (std::size_t i = 0; i < r; ++i)
      if (std::fabs(y[i] - xf[i]) > 2 * tol) ++bad;
    CHECK_MESSAGE(bad == 0, bad << " values not restored within " << 2 * tol);
  };
  for (std::size_t r : {std::size_t{1024}, std::size_t{1000}, std::size_t{513}, std::size_t{1}})
    check(R1024{}, r, 3, static_cast<unsigned>(r));
  for (std::size_t r : {std::size_t{128}, std::size_t{127}, std::size_t{64}, std::size_t{5}})
    check(R128{}, r, std::uint64_t{1} << 33, static_cast<unsigned>(r) + 7);
  for (std::size_t r : {std::size_t{8}, std::size_t{3}}) check(R8{}, r, 0, 11);
  // The signs depend on the bucket index and the seed.
  std::vector<float> a(128, 1.0f), b(128, 1.0f), c(128, 1.0f);
  R128::rotate(a.data(), 128, 0, true);
  R128::rotate(b.data(), 128, 1, true);
  rotated<maxmin<4, 128, nearest>, 99>::rotate(c.data(), 128, 0, true);
  CHECK(a != b);
  CHECK(a != c);
}

namespace {
/// Compresses x with R, checks the bounds of rotated.hpp per bucket; returns the sum of
/// squared errors of x (for comparisons).
template <class R, class T>
double check_bounds(const std::vector<T>& x, const cgx::quant::rng_state& rng, bool stochastic_rounding) {
  using M = cgx::quant::meta_t<T>;
  constexpr std::size_t B = R::bucket_size;
  const std::size_t n = x.size();
  std::vector<std::byte> wire(R::template compressed_bytes<T>(n));
  R::template compress<T>(x.data(), n, wire.data(), rng);
  std::vector<T> ydec(n), xdec(n);
  R::inner::template decompress<T>(wire.data(), n, ydec.data());  // the rotated domain's decoded values
  R::template decompress<T>(wire.data(), n, xdec.data());
  double total = 0;
  std::size_t bad_rot = 0, bad_l2 = 0, bad_elem = 0;
  for (std::size_t b = 0; b * B < n; ++b) {
    const std::size_t first = b * B, r = std::min(B, n - first);
    std::vector<T> y(x.begin() + static_cast<std::ptrdiff_t>(first),
                     x.begin() + static_cast<std::ptrdiff_t>(first + r));
    R::rotate(y.data(), r, b, true);
    const double unit = meta_at<M>(wire.data(), b, 1);
    const double mn = meta_at<M>(wire.data(), b, 0);
    double ymax = 0;
    for (std::size_t j = 0; j < r; ++j) ymax = std::max(ymax, std::fabs(static_cast<double>(y[j])));
    const double ulps = 8.0 * std::numeric_limits<T>::epsilon() * (ymax + std::fabs(mn));  // decode rounding
    const double lim = stochastic_rounding ? unit : unit / 2;
    double e2 = 0;
    for (std::size_t j = 0; j < r; ++j) {
      if (std::fabs(static_cast<double>(ydec[first + j]) - y[j]) > lim + ulps) ++bad_rot;
      const double e = static_cast<double>(xdec[first + j]) - x[first + j];
      e2 += e * e;
    }
    // Transform rounding in x: log2(B) + 2 roundings of values up to sqrt(B) ymax.
    const double tr = 4.0 * (std::log2(static_cast<double>(B)) + 2) * std::numeric_limits<T>::epsilon() * ymax;
    const double c = r == B ? c_of(B) : 1.0;  // a partial bucket's blocks have c >= 1
    if (std::sqrt(e2) > std::sqrt(static_cast<double>(r)) * (lim + ulps) / c + std::sqrt(static_cast<double>(r)) * tr)
      ++bad_l2;
    for (std::size_t j = 0; j < r; ++j) {
      const double m = static_cast<double>(block_of(j, r));
      const double e = std::fabs(static_cast<double>(xdec[first + j]) - x[first + j]);
      if (e > std::sqrt(m) * (lim + ulps) / c_of(block_of(j, r)) + tr) ++bad_elem;
    }
    total += e2;
  }
  CHECK_MESSAGE(bad_rot == 0, bad_rot << " rotated-domain errors above the unit bound");
  CHECK_MESSAGE(bad_l2 == 0, bad_l2 << " buckets above the L2 bound");
  CHECK_MESSAGE(bad_elem == 0, bad_elem << " values above the per-element worst-case bound");
  return total;
}
}  // namespace

TEST_CASE("rotated: maxmin's sizes; the rotated-domain, L2 and per-element bounds hold; spiky data loses less") {
  const cgx::quant::rng_state rng{.seed = 7, .counter = 2, .stream = 1, .position = 12345};
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{4 * 1024 + 300}}) {
    CAPTURE(n);
    const auto xf = spiky<float>(n, static_cast<unsigned>(n));
    const auto xd = spiky<double>(n, static_cast<unsigned>(n) + 1);
    CHECK(rotated<maxmin<2, 128, nearest>>::compressed_bytes<float>(n) ==
          maxmin<2, 128, nearest>::compressed_bytes<float>(n));
    check_bounds<rotated<maxmin<2, 128, nearest>>>(xf, rng, false);
    check_bounds<rotated<maxmin<4, 1024, stochastic>>>(xf, rng, true);
    check_bounds<rotated<maxmin<1, 256, stochastic>>>(xf, rng, true);
    check_bounds<rotated<maxmin<8, 512, nearest>>>(xd, rng, false);
    check_bounds<rotated<maxmin<3, 64, stochastic>>>(xd, rng, true);
  }
  // What the rotation is for: outliers. Plain maxmin's error against the rotated one's,
  // same bits, bucket and rounding, on 64 Ki spiky values: the rotated must lose less
  // than half as much (measured: about a fifth at 2 and 4 bits).
  const auto x = spiky<float>(std::size_t{1} << 16, 5);
  auto plain_err = [&](auto q) {
    using Q = decltype(q);
    std::vector<std::byte> w(Q::template compressed_bytes<float>(x.size()));
    std::vector<float> y(x.size());
    Q::compress(x.data(), x.size(), w.data(), rng);
    Q::decompress(w.data(), x.size(), y.data());
    double e2 = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double e = static_cast<double>(y[i]) - x[i];
      e2 += e * e;
    }
    return e2;
  };
  const double p2 = plain_err(maxmin<2, 128, nearest>{});
  const double r2 = check_bounds<rotated<maxmin<2, 128, nearest>>>(x, rng, false);
  const double p4 = plain_err(maxmin<4, 1024, stochastic>{});
  const double r4 = check_bounds<rotated<maxmin<4, 1024, stochastic>>>(x, rng, true);
  MESSAGE("squared error, plain / rotated: 2 bits " << p2 / r2 << ", 4 bits " << p4 / r4);
  CHECK(r2 < 0.5 * p2);
  CHECK(r4 < 0.5 * p4);
}

TEST_CASE("rotated, stochastic: unbiased per element, and the per-element tail bound holds statistically") {
  // One bucket of 1024 spiky values; N calls with different call counters. The rotation
  // does not depend on the counter, so every call has the same rotated values and units;
  // the error of value i is a sum of independent zero-mean terms (rotated.hpp), so
  //   mean over N calls:  |mean_i - x_i| <= 5 sd / sqrt(N),  sd <= u_rot / (2 c)
  // (a 5-sigma band per value: 1024 values, P(one outside) ~ 1024 * 6e-7 by the normal
  // approximation of the sum of N bounded terms), and Hoeffding's bound,
  //   P(|x'_i - x_i| >= 2 u_rot / c) <= 2 exp(-8) = 6.7e-4,
  // makes the count of such errors over N * 1024 draws Binomial with mean at most
  // 6.7e-4 N 1024: it must stay below that mean plus 6 of its standard deviations.
  using R = rotated<maxmin<2, 1024, stochastic>>;
  constexpr std::size_t n = 1024;
  constexpr int N = 400;
  const auto x = spiky<float>(n, 21, 61, 30.0);
  std::vector<double> mean(n, 0.0);
  std::vector<std::byte> w(R::compressed_bytes<float>(n));
  std::vector<float> y(n);
  double unit = 0;
  std::size_t tail = 0;
  const double c = c_of(n);
  for (int k = 0; k < N; ++k) {
    const cgx::quant::rng_state rng{.seed = 99, .counter = static_cast<std::uint32_t>(k), .stream = 3, .position = 0};
    R::compress(x.data(), n, w.data(), rng);
    R::decompress(w.data(), n, y.data());
    const double u = meta_at<float>(w.data(), 0, 1);
    if (k == 0) unit = u;
    REQUIRE(u == unit);
    for (std::size_t i = 0; i < n; ++i) {
      mean[i] += y[i];
      if (std::fabs(static_cast<double>(y[i]) - x[i]) >= 2 * unit / c) ++tail;
    }
  }
  const double sd = unit / (2 * c);
  std::size_t off = 0;
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(mean[i] / N - x[i]);
    worst = std::max(worst, d / (sd / std::sqrt(double(N))));
    if (d > 5 * sd / std::sqrt(double(N)) + 1e-6 * std::fabs(x[i])) ++off;
  }
  MESSAGE("largest |mean - x| in units of sd/sqrt(N): " << worst << "; tail count " << tail << " of " << N * n);
  CHECK(off == 0);
  const double draws = double(N) * n, p = 2 * std::exp(-8.0);
  CHECK(static_cast<double>(tail) <= draws * p + 6 * std::sqrt(draws * p));
  // Not vacuous: the errors are not all tiny (the sd bound is within 4x of the spread).
  double e2 = 0;
  for (std::size_t i = 0; i < n; ++i) e2 += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
  CHECK(std::sqrt(e2 / n) > sd / 4);
}

TEST_CASE("rotated: a NaN or Inf decodes to NaN for its bucket only; a rotation that overflows too") {
  using R = rotated<maxmin<4, 128, nearest>>;
  const std::size_t n = 128 * 3 + 50;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), 3.0e38f}) {
    CAPTURE(bad);
    for (std::size_t at : {std::size_t{5}, std::size_t{128 * 3 + 49}}) {
      auto x = spiky<float>(n, 3);
      x[at] = bad;
      if (bad == 3.0e38f) x[at ^ 1] = bad;  // two of them: the sum overflows
      std::vector<std::byte> w(R::compressed_bytes<float>(n));
      std::vector<float> y(n), acc(n, 1.0f);
      R::compress(x.data(), n, w.data());
      R::decompress(w.data(), n, y.data());
      R::decompress_add(w.data(), n, acc.data());
      const std::size_t b = at / 128;
      for (std::size_t i = 0; i < n; ++i) {
        if (i / 128 == b) {
          REQUIRE(std::isnan(y[i]));
          REQUIRE(std::isnan(acc[i]));
        } else {
          REQUIRE(std::isfinite(y[i]));
        }
      }
    }
  }
}

TEST_CASE("rotated: the same bits on 1 and 3 threads, in pieces of whole buckets, and from add_requantize") {
  using R = rotated<maxmin<3, 256, stochastic>>;
  const std::size_t n = 256 * 37 + 77;
  const auto x = spiky<float>(n, 8);
  const cgx::quant::rng_state rng{.seed = 5, .counter = 9, .stream = 2, .position = 1000};
  std::vector<std::byte> w1(R::compressed_bytes<float>(n)), w3(w1.size()), wf(w1.size());
  R::compress(x.data(), n, w1.data(), rng);
  R::compress(x.data(), n, w3.data(), rng, {.threads = 3});
  CHECK(w1 == w3);
  std::vector<float> y1(n), y3(n);
  R::decompress(w1.data(), n, y1.data());
  R::decompress(w1.data(), n, y3.data(), {.threads = 3});
  CHECK(std::memcmp(y1.data(), y3.data(), n * sizeof(float)) == 0);
  // add_requantize against decompress_add + compress + decompress.
  const auto base = spiky<float>(n, 9);
  std::vector<float> a = base, b = base;
  R::add_requantize(w1.data(), a.data(), n, wf.data(), rng, {.threads = 2});
  R::decompress_add(w1.data(), n, b.data());
  R::compress(b.data(), n, w3.data(), rng);
  R::decompress(w3.data(), n, b.data());
  CHECK(wf == w3);
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
  // decompress_add adds the decoded values, each rounded once.
  std::vector<float> s = base;
  R::decompress_add(w1.data(), n, s.data(), {.threads = 3});
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += s[i] != base[i] + y1[i];
  CHECK(bad == 0);
}

namespace {
/// The CUDA kernels' bodies run on the host against the host codec: bytes and values.
template <int Bits, std::size_t B, class Rounding, class T>
void bodies_match(std::size_t n, cgx::quant::detail::lane_order order) {
  using R = rotated<maxmin<Bits, B, Rounding>>;
  CAPTURE(Bits);
  CAPTURE(B);
  CAPTURE(n);
  CAPTURE(sizeof(T));
  auto x = spiky<T>(n, static_cast<unsigned>(n + B));
  if (n > 2 * B) x[B + 3] = std::numeric_limits<T>::quiet_NaN();  // a non-finite bucket too
  const cgx::quant::rng_state rng{.seed = 17, .counter = 4, .stream = 6, .position = (std::uint64_t{1} << 32) + 9};
  std::vector<std::byte> host(R::template compressed_bytes<T>(n)), dev(host.size());
  R::template compress<T>(x.data(), n, host.data(), rng);
  std::uint32_t nonfinite = 0;
  cgx::quant::detail::host_rotated_compress<Bits, B, Rounding, T>(x.data(), n, dev.data(), rng, R::seed, order, n,
                                                                  &nonfinite);
  CHECK(host == dev);
  CHECK(nonfinite == (n > 2 * B ? 1u : 0u));
  std::vector<T> yh(n), yd(n), ah(x), ad(x);
  R::template decompress<T>(host.data(), n, yh.data());
  cgx::quant::detail::host_rotated_decode<Bits, B, false, T>(host.data(), n, yd.data(), R::seed, order, 3);
  CHECK(std::memcmp(yh.data(), yd.data(), n * sizeof(T)) == 0);
  R::template decompress_add<T>(host.data(), n, ah.data());
  cgx::quant::detail::host_rotated_decode<Bits, B, true, T>(host.data(), n, ad.data(), R::seed, order, 5);
  CHECK(std::memcmp(ah.data(), ad.data(), n * sizeof(T)) == 0);
}
}  // namespace

TEST_CASE("rotated: the CUDA kernels' bodies, run on the host, write the host codec's bytes and values") {
  using cgx::quant::detail::lane_order;
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{5000}}) {
    bodies_match<4, 1024, stochastic, float>(n, lane_order::shuffled);
    bodies_match<2, 128, nearest, float>(n, lane_order::descending);
    bodies_match<1, 8, stochastic, float>(n, lane_order::ascending);
    bodies_match<8, 256, nearest, double>(n, lane_order::shuffled);
    bodies_match<5, 4096, stochastic, double>(n, lane_order::shuffled);
  }
}

#if CGX_TEST_ROTATION_SIM
// ---- device plans with the rotated codec on the simulated CUDA runtime -----------------

/// sim::kernels for the rotated codec: the CUDA kernels' bodies (rotated_bodies.hpp) on
/// the host, lanes shuffled, with the simulated device's access checks.
template <int Bits, std::size_t B, class Rounding, std::uint64_t Seed>
struct sim::kernels<cgx::quant::rotated<cgx::quant::maxmin<Bits, B, Rounding>, Seed>> {
  using quantizer = cgx::quant::rotated<cgx::quant::maxmin<Bits, B, Rounding>, Seed>;
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return quantizer::template compressed_bytes<T>(n);
  }
  template <class T>
  static void compress(const T* in, std::size_t n, std::byte* out, const cgx::quant::rng_state& rng = {},
                       cudaStream_t s = nullptr) {
    if (n == 0) return;
    const std::uint32_t* calls = std::is_same_v<Rounding, cgx::quant::stochastic> ? rng.device_calls : nullptr;
    const range r[] = {{in, n * sizeof(T), false},
                       {out, compressed_bytes<T>(n), true},
                       {calls, calls != nullptr ? sizeof(std::uint32_t) : 0, false}};
    w().launch(s, r, "rotated compress", [=] {
      cgx::quant::rng_state k = rng;
      if (calls != nullptr) k.counter += *calls;
      using cgx::quant::detail::lane_order;
      cgx::quant::detail::host_rotated_compress<Bits, B, Rounding, T>(in, n, out, k, Seed, lane_order::shuffled,
                                                                      k.position);
    });
  }
  template <class T>
  static void decompress(const std::byte* in, std::size_t n, T* out, cudaStream_t s = nullptr) {
    decode<T, false>(in, n, out, s, "rotated decompress");
  }
  template <class T>
  static void decompress_add(const std::byte* in, std::size_t n, T* out, cudaStream_t s = nullptr) {
    decode<T, true>(in, n, out, s, "rotated decompress_add");
  }

 private:
  template <class T, bool Add>
  static void decode(const std::byte* in, std::size_t n, T* out, cudaStream_t s, const char* what) {
    if (n == 0) return;
    const range r[] = {{in, compressed_bytes<T>(n), false}, {out, n * sizeof(T), true}};
    w().launch(s, r, what, [=] {
      using cgx::quant::detail::lane_order;
      cgx::quant::detail::host_rotated_decode<Bits, B, Add, T>(in, n, out, Seed, lane_order::shuffled, n);
    });
  }
};

namespace {
using sim_ipc = cgx::comm::basic_cuda_ipc<sim::runtime>;

std::vector<float> sim_input(int rank, std::size_t n, int call) {
  auto v = spiky<float>(n, static_cast<unsigned>(1000 * rank + 17 * call + 5));
  for (auto& x : v) x += 0.25f * static_cast<float>(rank);
  return v;
}

/// Every rank's results of the calls `counts` of a host allreduce_plan<float, Q, R> over
/// threads, and of a device_allreduce_plan<float, Q, R> over simulated CUDA IPC.
template <class Q, class R>
void sim_matches_host(int p, const std::vector<std::size_t>& counts, std::uint64_t seed) {
  CAPTURE(p);
  CAPTURE(R::name);
  std::size_t max_n = 0;
  for (auto n : counts) max_n = std::max(max_n, n);
  std::vector<std::vector<std::vector<float>>> want(static_cast<std::size_t>(p)), got(want.size());
  {
    auto g = std::make_shared<gpu_test::thread_group>(p);
    std::vector<std::thread> t;
    for (int r = 0; r < p; ++r)
      t.emplace_back([&, r] {
        cgx::plan_options o;
        o.native_below_bytes = 0;
        cgx::allreduce_plan<float, Q, R, gpu_test::thread_transport> plan{gpu_test::thread_transport(g, r), max_n, o};
        int call = 0;
        for (const std::size_t n : counts) {
          auto v = sim_input(r, n, call++);
          plan(v.data(), n);
          want[static_cast<std::size_t>(r)].push_back(std::move(v));
        }
      });
    for (auto& x : t) x.join();
  }
  sim::world w(seed);
  sim::scope use(w);
  auto g = std::make_shared<sim::group>(p);
  std::vector<std::thread> t;
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      w.attach(r);
      try {
        cgx::plan_options o;
        o.native_below_bytes = 0;
        cgx::device_allreduce_plan<float, Q, R, sim_ipc> plan{sim_ipc{sim::thread_bootstrap(g, r)}, max_n, o};
        cudaStream_t s = sim::w().create_stream();
        void* mem = nullptr;
        REQUIRE(sim::runtime::malloc(&mem, max_n * sizeof(float)) == cudaSuccess);
        auto* d = static_cast<float*>(mem);
        int call = 0;
        for (const std::size_t n : counts) {
          auto v = sim_input(r, n, call++);
          sim::runtime::memcpy_async(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
          plan(d, n, s);
          sim::runtime::memcpy_async(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s);
          sim::runtime::stream_synchronize(s);
          got[static_cast<std::size_t>(r)].push_back(std::move(v));
        }
        REQUIRE(sim::runtime::free(d) == cudaSuccess);
      } catch (...) {
        err[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& x : t) x.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
  CHECK(w.violations().empty());
  for (int r = 0; r < p; ++r)
    for (std::size_t c = 0; c < counts.size(); ++c) {
      const auto& a = got[static_cast<std::size_t>(r)][c];
      const auto& b = want[static_cast<std::size_t>(r)][c];
      REQUIRE(a.size() == b.size());
      CAPTURE(r);
      CAPTURE(c);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
}
}  // namespace

TEST_CASE("rotated: device SRA, ring and tree plans on the simulated runtime give the host plans' bits") {
  using Q4 = rotated<maxmin<4, 256, stochastic>>;
  using Q2 = rotated<maxmin<2, 128, nearest>>;
  const std::vector<std::size_t> counts{2048 + 100, 1000 + 37, 5};
  for (const int p : {2, 3}) {
    sim_matches_host<Q4, cgx::comm::scatter_reduce_allgather>(p, counts, 40u + p);
    sim_matches_host<Q2, cgx::comm::ring>(p, counts, 50u + p);
    sim_matches_host<Q4, cgx::comm::tree>(p, counts, 60u + p);
  }
}
#endif  // CGX_TEST_ROTATION_SIM
