// The CUDA kernels' bodies (cgx/quant/kernel_bodies.hpp) run on the host, compared byte
// for byte with the host quantizer cgx::quant::maxmin. Shared by the translation units
// of test_kernel_bodies (one per input type, to keep each TU's compile time short).
#pragma once

#include <doctest/doctest.h>

#include <cgx/quant/kernel_bodies.hpp>
#include <cgx/quant/maxmin.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kb_test {

using cgx::quant::maxmin;
using cgx::quant::meta_t;
using cgx::quant::nearest;
using cgx::quant::rng_state;
using cgx::quant::stochastic;
namespace qd = cgx::quant::detail;

/// Input values of type T whose buckets cycle through the cases that take different
/// paths: 0 normal, 1 subnormal range (rescaled encoding; for __half: half subnormals),
/// 2 wide (max - min overflows M), 3 constant, 4 a NaN or an Inf among normals, 5 +-0
/// with tiny normals. `salt` shifts the cycle, so that configurations with only one or
/// two buckets (B = 2^20) still meet every case across the widths.
template <class T>
std::vector<T> make_input(std::size_t n, std::size_t B, unsigned salt) {
  using M = meta_t<T>;
  const bool narrow_range = std::isinf(qd::to_meta<T>(qd::from_meta<T>(M(1e10))));  // __half
  std::mt19937_64 g(0x6b62u + salt);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  const double big = narrow_range ? 60000.0 : static_cast<double>(std::numeric_limits<M>::max()) * 0.9;
  const double sub = narrow_range ? 5.9e-8 * 100 : static_cast<double>(std::numeric_limits<M>::denorm_min()) * 4e6;
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t b = i / B;
    const unsigned kind = static_cast<unsigned>((b + salt) % 6);
    double v = 0;
    switch (kind) {
      case 0: v = nd(g) * std::pow(10.0, static_cast<double>(b % 5) - 2.0) + static_cast<double>(b % 3); break;
      case 1: v = (ud(g) - 0.3) * sub; break;
      case 2: v = (ud(g) * 2.0 - 1.0) * big; break;
      case 3: v = b % 2 ? 1.5 : -0.375; break;
      case 4:
        v = nd(g);
        if (i % B == (b * 7919 + 13) % B) {
          v = (b / 6) % 3 == 0 ? std::numeric_limits<double>::quiet_NaN()
                               : ((b / 6) % 3 == 1 ? std::numeric_limits<double>::infinity()
                                                   : -std::numeric_limits<double>::infinity());
        }
        break;
      default: v = (i % 3 == 0) ? -0.0 : ((i % 3 == 1) ? 0.0 : (i % 7 == 0 ? 1e-3 * nd(g) : 0.0)); break;
    }
    x[i] = qd::from_meta<T>(static_cast<M>(v));
  }
  return x;
}

template <class T>
bool same_value(T a, T b) {
  using M = meta_t<T>;
  const M fa = qd::to_meta<T>(a), fb = qd::to_meta<T>(b);
  if (std::isnan(fa) || std::isnan(fb)) return std::isnan(fa) && std::isnan(fb);
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

inline std::size_t first_diff(const std::vector<std::byte>& a, const std::vector<std::byte>& b, std::size_t off = 0) {
  for (std::size_t i = 0; i < a.size() - off; ++i)
    if (a[i] != b[i + off]) return i;
  return a.size();
}

/// Counts what the checks covered (printed once per TU, so a reader sees it is not vacuous).
struct coverage {
  std::size_t configs = 0, buckets = 0, nonfinite = 0, values = 0;
};
inline coverage& covered() {
  static coverage c;
  return c;
}

/// One configuration: the kernel bodies' compress (lane orders ascending, shuffled and,
/// for buckets up to 1024, descending; an unaligned output too), decompress and
/// decompress-add against maxmin<Bits, B, R> on the host (for __half/__nv_bfloat16:
/// the host quantizer on the values converted to float, which is exact, and one
/// rounding of its fp32 decode, as maxmin.cuh documents). Returns what differed (empty:
/// nothing); no doctest macro here, which keeps the 96 instantiations per type cheap
/// to compile.
template <class T, int Bits, std::size_t B, class R>
std::string check_config(std::size_t n, const rng_state& rng, unsigned salt) {
  using M = meta_t<T>;
  using Q = maxmin<Bits, B, R>;
  constexpr bool native = std::is_same_v<T, float> || std::is_same_v<T, double>;
  std::string err;
  auto fail = [&](const std::string& m) {
    err += "Bits=" + std::to_string(Bits) + " B=" + std::to_string(B) +
           (std::is_same_v<R, stochastic> ? " stochastic" : " nearest") + " n=" + std::to_string(n) +
           " position=" + std::to_string(rng.position) + " sizeof(T)=" + std::to_string(sizeof(T)) + ": " + m + "\n";
  };
  const std::vector<T> x = make_input<T>(n, B, salt);
  std::vector<M> xm(n);
  for (std::size_t i = 0; i < n; ++i) xm[i] = qd::to_meta<T>(x[i]);
  const std::size_t bytes = Q::template compressed_bytes<M>(n);

  // The host quantizer's bytes.
  std::vector<std::byte> ref(bytes);
  Q::compress(xm.data(), n, ref.data(), rng);

  // The kernel body, in several lane orders.
  const std::size_t nb = (n + B - 1) / B;
  std::uint32_t expect_nonfinite = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    bool finite = true;
    for (std::size_t i = b * B; i < std::min(n, (b + 1) * B); ++i) finite = finite && std::isfinite(xm[i]);
    expect_nonfinite += finite ? 0 : 1;
  }
  const qd::lane_order orders[] = {qd::lane_order::ascending, qd::lane_order::shuffled, qd::lane_order::descending};
  for (const auto order : orders) {
    if (order == qd::lane_order::descending && B > 1024) continue;
    std::vector<std::byte> got(bytes, std::byte{0xa5});
    std::uint32_t nonfinite = 0;
    qd::host_compress<Bits, B, R, T>(x.data(), n, got.data(), rng, order, 77 + salt, &nonfinite);
    const std::size_t d = first_diff(ref, got);
    if (d != bytes) {
      fail("lane order " + std::to_string(static_cast<int>(order)) + ": first differing byte " + std::to_string(d) +
           " of " + std::to_string(bytes) + " (metadata: " + std::to_string(nb * 2 * sizeof(M)) + " bytes)");
    }
    if (nonfinite != expect_nonfinite) fail("non-finite buckets counted " + std::to_string(nonfinite));
  }
  // Unaligned output: metadata stored byte-wise.
  {
    std::vector<std::byte> got(bytes + 1, std::byte{0x5a});
    qd::host_compress<Bits, B, R, T>(x.data(), n, got.data() + 1, rng, qd::lane_order::ascending);
    if (first_diff(ref, got, 1) != bytes) fail("unaligned output differs");
  }

  // Decompress and decompress-add: the body's values against the host's.
  std::vector<M> dec(n);
  Q::decompress(ref.data(), n, dec.data());
  std::vector<T> y0(n);
  for (std::size_t i = 0; i < n; ++i) y0[i] = qd::from_meta<T>(static_cast<M>(static_cast<double>(i % 11) - 5.25));
  std::vector<T> want(n), want_add(n);
  if constexpr (native) {
    want = dec;
    want_add = y0;
    Q::decompress_add(ref.data(), n, want_add.data());
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      want[i] = qd::from_meta<T>(dec[i]);
      want_add[i] = qd::from_meta<T>(qd::to_meta<T>(y0[i]) + dec[i]);
    }
  }
  for (const auto order : {qd::lane_order::ascending, qd::lane_order::descending}) {
    if (order == qd::lane_order::descending && B > 1024) continue;
    std::vector<T> y(n);
    qd::host_decode<Bits, B, false, T>(ref.data(), n, y.data(), order);
    std::vector<T> ya = y0;
    qd::host_decode<Bits, B, true, T>(ref.data(), n, ya.data(), order);
    std::size_t bad = 0, bad_add = 0, first_bad = n;
    for (std::size_t i = 0; i < n; ++i) {
      if (!same_value(y[i], want[i])) {
        ++bad;
        first_bad = std::min(first_bad, i);
      }
      if (!same_value(ya[i], want_add[i])) ++bad_add;
    }
    if (bad != 0 || bad_add != 0) {
      fail("decode: " + std::to_string(bad) + " values differ (first " + std::to_string(first_bad) +
           "), decode-add: " + std::to_string(bad_add));
    }
  }
  auto& c = covered();
  c.configs += 1;
  c.buckets += nb;
  c.nonfinite += expect_nonfinite;
  c.values += n;
  return err;
}

/// Reports a configuration's differences (one non-template function: doctest's macros
/// are instantiated once).
inline void expect_same(const std::string& err) { CHECK_MESSAGE(err.empty(), err); }

/// Number of values for bucket size B: a partial last bucket whose count is not a
/// multiple of 8, and at least 6 buckets below 2^20 (every case of make_input).
template <std::size_t B>
constexpr std::size_t values_for = B < (std::size_t{1} << 20) ? 7 * B - 3 : B + 4099;

/// Width Bits, bucket size B, rounding R: nearest once; stochastic at a small stream
/// position and at one above 2^32 (the high word of the bucket's index changes inside).
template <class T, std::size_t B, int Bits, class R>
void check_one() {
  constexpr std::size_t n = values_for<B>;
  if constexpr (std::is_same_v<R, nearest>) {
    expect_same(check_config<T, Bits, B, nearest>(n, rng_state{}, Bits));
  } else {
    constexpr std::uint64_t above = (std::uint64_t{3} << 32) - B + 7;
    expect_same(check_config<T, Bits, B, stochastic>(
        n, rng_state{.seed = 0x1234567890abull, .counter = 9, .stream = 2, .position = 12345}, Bits + 1));
    expect_same(check_config<T, Bits, B, stochastic>(
        n, rng_state{.seed = 42, .counter = 1u << 31, .stream = 5, .position = above}, Bits + 3));
  }
}

/// Every width, both roundings, for bucket size B.
template <class T, std::size_t B>
void check_every_width() {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((check_one<T, B, I + 1, nearest>(), check_one<T, B, I + 1, stochastic>()), ...);
  }(std::make_integer_sequence<int, 8>{});
}

/// The configurations of one input type. By default (CI): every width and both
/// roundings at B = 1024, and at each other bucket shape two widths, one per rounding,
/// chosen so that every width meets a small, an odd and a huge shape. Each (T, Bits, B,
/// rounding) is a template instantiation costing about 2 s of g++ -O3, so the full
/// product (96 per type) is built only with CGX_KERNEL_BODIES_FULL (CMake option
/// CGX_TEST_KERNEL_BODIES_FULL).
template <class T>
void check_all_buckets() {
#if defined(CGX_KERNEL_BODIES_FULL)
  check_every_width<T, 8>();
  check_every_width<T, 24>();
  check_every_width<T, 40>();
  check_every_width<T, 1024>();
  check_every_width<T, 16384>();
  check_every_width<T, std::size_t{1} << 20>();
#else
  check_every_width<T, 1024>();
  check_one<T, 8, 1, stochastic>();
  check_one<T, 8, 5, nearest>();
  check_one<T, 24, 3, stochastic>();
  check_one<T, 24, 6, nearest>();
  check_one<T, 40, 7, stochastic>();
  check_one<T, 40, 2, nearest>();
  check_one<T, 16384, 4, stochastic>();
  check_one<T, 16384, 8, nearest>();
  check_one<T, std::size_t{1} << 20, 8, stochastic>();
  check_one<T, std::size_t{1} << 20, 3, nearest>();
#endif
  const auto& c = covered();
  MESSAGE("kernel bodies vs host maxmin: ", c.configs, " configurations, ", c.buckets, " buckets (", c.nonfinite,
          " non-finite), ", c.values, " values");
  CHECK(c.nonfinite > 0);
}

}  // namespace kb_test
