#pragma once
// Minimal test support for cgx's GPU tests: no doctest, no MPI (a GPU machine may
// have neither). A test main calls `require_device()` first: without a CUDA device the
// test exits 77, which CTest reports as skipped (SKIP_RETURN_CODE 77).

#include <cgx/quant.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace gpu_test {

inline int failures = 0;
inline int checks = 0;

inline bool report(bool ok, const char* expr, const char* file, int line, const std::string& msg) {
  ++checks;
  if (!ok) {
    ++failures;
    if (failures <= 50) std::fprintf(stderr, "%s:%d: CHECK(%s) failed %s\n", file, line, expr, msg.c_str());
  }
  return ok;
}

}  // namespace gpu_test

/// Records a failure (and prints it) when cond is false; evaluates to cond.
#define CHECK(cond) ::gpu_test::report(static_cast<bool>(cond), #cond, __FILE__, __LINE__, std::string{})
/// Same, with a context message (a std::string).
#define CHECK_MSG(cond, msg) ::gpu_test::report(static_cast<bool>(cond), #cond, __FILE__, __LINE__, (msg))
/// A CUDA runtime call that must succeed; aborts the test otherwise (later checks would be noise).
#define CUDA_OK(call)                                                                                     \
  do {                                                                                                    \
    const cudaError_t cuda_ok_e_ = (call);                                                                \
    if (cuda_ok_e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(cuda_ok_e_)); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

namespace gpu_test {

/// The number of CUDA devices; 0 when there is none or no driver to reach one (the
/// only cases a GPU test may skip). Any other CUDA error fails the test (exit 1).
inline int device_count(const char* name) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    std::printf("%s: no CUDA device (%s): skipped\n", name, cudaGetErrorString(e));
    return 0;
  }
  if (e != cudaSuccess) {
    std::printf("%s: cudaGetDeviceCount failed: %s (%d)\n", name, cudaGetErrorString(e), static_cast<int>(e));
    std::exit(1);
  }
  if (count == 0) std::printf("%s: no CUDA device (count 0): skipped\n", name);
  return count;
}

/// Exits 77 (skipped) when there is no CUDA device (see device_count()).
inline void require_device(const char* name) {
  if (device_count(name) == 0) std::exit(77);
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: device 0: %s (sm_%d%d)\n", name, prop.name, prop.major, prop.minor);
}

/// Prints the summary and gives main's return value.
inline int finish(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks, failures);
  if (checks == 0) {
    std::printf("%s: no checks ran: failing\n", name);
    return 1;
  }
  return failures == 0 ? 0 : 1;
}

/// Device buffer of `count` elements of T (raw bytes for std::byte).
template <class T>
class dev_buf {
 public:
  explicit dev_buf(std::size_t count) : count_(count) {
    if (count_ != 0) CUDA_OK(cudaMalloc(&p_, count_ * sizeof(T)));
  }
  dev_buf(const dev_buf&) = delete;
  dev_buf& operator=(const dev_buf&) = delete;
  ~dev_buf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  T* get() const { return p_; }
  std::size_t size() const { return count_; }
  /// A copy on the legacy default stream; from pageable memory cudaMemcpy may return
  /// before the bytes reach the device, so it waits for the device after: work on any
  /// stream (non-blocking ones too, which do not wait for the legacy stream) sees them.
  void upload(const T* h, std::size_t k) {
    if (k == 0) return;
    CUDA_OK(cudaMemcpy(p_, h, k * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
  }
  /// A copy on the legacy default stream, which waits for work on blocking streams only:
  /// synchronize a non-blocking stream first.
  void download(T* h, std::size_t k) const {
    if (k != 0) CUDA_OK(cudaMemcpy(h, p_, k * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  T* p_ = nullptr;
  std::size_t count_;
};

/// Value conversions (exact from T to float/double): the library's own, on the host.
template <class T>
inline cgx::quant::meta_t<T> to_m(T v) {
  return cgx::quant::detail::to_meta<T>(v);
}
template <class T>
inline T from_m(cgx::quant::meta_t<T> v) {
  return cgx::quant::detail::from_meta<T>(v);
}

template <class T>
inline bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
inline bool is_nan(T v) {
  return std::isnan(static_cast<double>(to_m<T>(v)));
}

/// Test input: random buckets of varied scale and offset, and (at multiples of 4096, so
/// that they fill whole buckets of every size tested) regions that exercise the special
/// paths: a constant 0.75, a constant 0, a subnormal range (rescaled encoding), huge
/// values (max - min overflows fp32: a "wide" bucket; for Bits = 1 the unit is clamped).
inline std::vector<float> make_data(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-20, 20);
  std::vector<float> x(n);
  float scale = 1.0f, offset = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 97 == 0) {  // a new scale every 97 values: buckets see ranges change inside them
      scale = std::ldexp(1.0f, e(gen));
      offset = u(gen) * scale * 4.0f;
    }
    x[i] = offset + scale * u(gen);
  }
  for (std::size_t i = 8192; i < 12288 && i < n; ++i) x[i] = 0.75f;
  for (std::size_t i = 12288; i < 16384 && i < n; ++i) x[i] = 0.0f;
  for (std::size_t i = 16384; i < 20480 && i < n; ++i) x[i] = std::ldexp(static_cast<float>(i % 61 + 1), -140);
  for (std::size_t i = 20480; i < 24576 && i < n; ++i) x[i] = (i % 2 ? 3.0e38f : -3.0e38f) * (0.5f + 0.5f * std::fabs(u(gen)));
  return x;
}

/// Two decodings of every value of a compressed buffer: the library's (min + code * unit
/// with the product rounded on its own: detail::mul_rn, on host and device), and fused
/// (fma: one rounding), what a compiler's contraction of the plain expression gives:
/// nvcc contracts by default (--fmad=true), and so does g++ for C++ whatever the -std
/// (at -O3 -march=native it emits vfmadd231ss; ISO mode turns contraction off for C
/// only). The two differ by the rounding of code * unit, which can be many ulp of a
/// result near 0. The checks below still accept either, although with mul_rn on both
/// sides the device should give the library's decoding exactly (as the host paths do,
/// compared bit for bit in tests/test_quant.cpp).
template <int Bits, std::size_t B, class M>
struct decoded_ref {
  std::vector<M> plain, fused;
};

template <int Bits, std::size_t B, class M>
decoded_ref<Bits, B, M> decode_reference(const std::byte* wire, std::size_t n) {
  using layout = cgx::quant::wire_layout<Bits, B, M>;
  decoded_ref<Bits, B, M> r;
  r.plain.resize(n);
  r.fused.resize(n);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(wire);
  for (std::size_t b = 0; b < layout::buckets(n); ++b) {
    const std::size_t first = b * B;
    const std::size_t count = n - first < B ? n - first : B;
    const std::size_t S = (count + 7) / 8;
    M rec[2];
    std::memcpy(rec, wire + b * 2 * sizeof(M), sizeof(rec));
    const std::uint8_t* codes = bytes + layout::codes_offset(n, b);
    for (std::size_t j = 0; j < S; ++j) {
      std::uint32_t w[Bits];
      for (int q = 0; q < Bits; ++q) w[q] = codes[q * S + j];
      std::uint32_t c[8];
      [&]<int... K>(std::integer_sequence<int, K...>) {
        ((c[K] = cgx::quant::detail::unpack_code<Bits, K>(w)), ...);
      }(std::make_integer_sequence<int, 8>{});
      for (std::size_t k = 0; k < 8; ++k) {
        const std::size_t idx = k * S + j;
        if (idx >= count) continue;
        if (cgx::quant::is_wide<Bits, M>(rec[0], rec[1])) {
          // One rounding by construction (exact double product for float; explicit fma for double).
          r.plain[first + idx] = r.fused[first + idx] = cgx::quant::decode_value_wide<M>(c[k], rec[0], rec[1]);
        } else {
          r.plain[first + idx] = cgx::quant::decode_value<M>(c[k], rec[0], rec[1]);
          r.fused[first + idx] = std::fma(static_cast<M>(c[k]), rec[1], rec[0]);
        }
      }
    }
  }
  return r;
}

/// First index where two byte vectors differ, or npos.
inline std::size_t first_diff(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  const std::size_t m = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < m; ++i)
    if (a[i] != b[i]) return i;
  return a.size() == b.size() ? std::string::npos : m;
}

/// Compresses data[0..n) (as T) on the device and on the host (as meta_t<T>), with
/// quantizer maxmin<Bits, B, R> and the same rng_state, and checks: the bytes are equal;
/// device decompress and decompress_add equal the host's results, value for value, up
/// to the FMA contraction described at decode_reference (each device value must equal
/// one of the two exact references, rounded to T).
/// True: decoded values must equal the library's decoding exactly (the fused reference
/// is not accepted). test_maxmin_fastmath sets it: the device arithmetic is exact by
/// construction (wire_format.hpp), whatever nvcc's flags.
inline bool strict_decode = false;

template <class T, int Bits, std::size_t B, class R>
void check_case(const std::vector<float>& data, std::size_t n, const cgx::quant::rng_state& rng) {
  using M = cgx::quant::meta_t<T>;
  using Q = cgx::quant::maxmin<Bits, B, R>;
  using D = cgx::quant::device<Q>;
  const std::string ctx = " [T=" + std::string(std::is_same_v<T, float> ? "float" : std::is_same_v<T, double> ? "double" : std::is_same_v<T, __half> ? "half" : "bf16") +
                          " bits=" + std::to_string(Bits) + " bucket=" + std::to_string(B) +
                          " rounding=" + (std::is_same_v<R, cgx::quant::nearest> ? "nearest" : "stochastic") +
                          " n=" + std::to_string(n) + "]";

  std::vector<T> x(n);
  std::vector<M> xm(n);  // the same values as the host quantizer's input type
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, double>) {
      x[i] = static_cast<double>(data[i]) * (1.0 + 0x1p-40 * static_cast<double>(i % 7));  // not float-exact
    } else if constexpr (std::is_same_v<T, __half>) {
      x[i] = from_m<T>(data[i] * 0x1p-7f);  // keep most buckets inside fp16's range (65504)
    } else {
      x[i] = from_m<T>(data[i]);
    }
    xm[i] = to_m<T>(x[i]);
  }
  const std::size_t bytes = D::template compressed_bytes<T>(n);
  CHECK_MSG(bytes == Q::template compressed_bytes<M>(n), ctx);

  std::vector<std::byte> host(bytes), dev(bytes, std::byte{0xAB});
  Q::template compress<M>(xm.data(), n, host.data(), rng);

  dev_buf<T> d_x(n);
  dev_buf<std::byte> d_wire(bytes + 1);
  d_x.upload(x.data(), n);
  if (bytes != 0) CUDA_OK(cudaMemset(d_wire.get(), 0xAB, bytes + 1));
  D::compress(d_x.get(), n, d_wire.get(), rng, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  d_wire.download(dev.data(), bytes);
  const std::size_t at = first_diff(host, dev);
  CHECK_MSG(at == std::string::npos, "first differing byte " + std::to_string(at) + " of " + std::to_string(bytes) + ctx);
  std::byte guard{};
  if (bytes != 0) {
    CUDA_OK(cudaMemcpy(&guard, d_wire.get() + bytes, 1, cudaMemcpyDeviceToHost));
    CHECK_MSG(guard == std::byte{0xAB}, "compress wrote past compressed_bytes" + ctx);
  }

  // Decode the host's bytes on the device.
  d_wire.upload(host.data(), bytes);
  const auto ref = decode_reference<Bits, B, M>(host.data(), n);
  std::vector<M> hdec(n);
  Q::template decompress<M>(host.data(), n, hdec.data());

  dev_buf<T> d_y(n);
  std::vector<T> y(n);
  D::decompress(d_wire.get(), n, d_y.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  d_y.download(y.data(), n);
  std::size_t bad = 0, first_bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool ok = same_bits(y[i], from_m<T>(hdec[i])) || (!strict_decode && same_bits(y[i], from_m<T>(ref.fused[i]))) ||
                    (is_nan(y[i]) && std::isnan(hdec[i]));
    if (!ok && bad++ == 0) first_bad = i;
  }
  CHECK_MSG(bad == 0, "decompress: " + std::to_string(bad) + " values differ, first at " + std::to_string(first_bad) +
                          " (device " + std::to_string(static_cast<double>(to_m<T>(y[first_bad < n ? first_bad : 0]))) +
                          ")" + ctx);

  // decompress_add onto a known y0.
  std::vector<T> y0(n), y1(n);
  std::vector<M> y0m(n);
  for (std::size_t i = 0; i < n; ++i) {
    y0[i] = from_m<T>(xm[(i * 7919) % n] * M(0.5));  // finite where x is (fp16: scaled into range)
    y0m[i] = to_m<T>(y0[i]);
  }
  std::vector<M> hadd = y0m;
  Q::template decompress_add<M>(host.data(), n, hadd.data());
  d_y.upload(y0.data(), n);
  D::decompress_add(d_wire.get(), n, d_y.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  d_y.download(y1.data(), n);
  bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const M fused_sum = y0m[i] + ref.fused[i];
    const bool ok = same_bits(y1[i], from_m<T>(hadd[i])) || (!strict_decode && same_bits(y1[i], from_m<T>(fused_sum))) ||
                    (is_nan(y1[i]) && std::isnan(hadd[i]));
    if (!ok && bad++ == 0) first_bad = i;
  }
  CHECK_MSG(bad == 0, "decompress_add: " + std::to_string(bad) + " values differ, first at " +
                          std::to_string(first_bad) + ctx);
}

/// The counts tested for bucket size B: empty, shorter than a bucket, partial last
/// buckets of every residue class that matters (r mod 8), exact multiples, and a size
/// that reaches the special regions of make_data.
template <std::size_t B>
std::vector<std::size_t> counts() {
  std::vector<std::size_t> c{0, 1, 7, 9, B - 1, B, B + 1, 3 * B + 5, 5 * B};
  const std::size_t big = 26000 + 13;  // past the special regions (up to 24576)
  c.push_back(big > 5 * B ? big : 6 * B + 3);
  return c;
}

inline cgx::quant::rng_state test_rng() {
  cgx::quant::rng_state r;
  r.seed = 0x0123456789abcdefull;
  r.counter = 5;
  r.stream = 3;
  r.position = 1000003;
  return r;
}

/// check_case over counts<B>() for one configuration.
template <class T, int Bits, std::size_t B, class R>
void check_config(const std::vector<float>& data) {
  for (std::size_t n : counts<B>()) check_case<T, Bits, B, R>(data, n, test_rng());
}

/// check_config for Bits = 1..8.
template <class T, std::size_t B, class R>
void check_all_bits(const std::vector<float>& data) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (check_config<T, I + 1, B, R>(data), ...);
  }(std::make_integer_sequence<int, 8>{});
}

}  // namespace gpu_test
