// Device maxmin for __half, __nv_bfloat16 and double input, and the special cases:
//  - half/bf16: bytes equal the host compress of the values converted to float (exact);
//    decompress rounds the fp32 decode once to T; decompress_add accumulates in fp32;
//  - double: fp64 metadata and arithmetic, bytes equal the host's;
//  - a bucket holding NaN, +Inf or -Inf decodes to NaN (every value of it, nothing
//    else), and device_status counts it;
//  - a constant bucket is reproduced exactly;
//  - a compressed buffer at an odd address (metadata read and written byte-wise);
//  - device<none>: copies, and y += x.
#include "gpu_test.hpp"

#include <limits>

namespace {

using cgx::quant::nearest;
using cgx::quant::stochastic;
using gpu_test::dev_buf;

template <class T>
void check_types() {
  const std::vector<float> data = gpu_test::make_data(1 << 16, 3);
  gpu_test::check_config<T, 1, 1024, stochastic>(data);
  gpu_test::check_config<T, 4, 1024, nearest>(data);
  gpu_test::check_config<T, 4, 1024, stochastic>(data);
  gpu_test::check_config<T, 8, 1024, stochastic>(data);
  gpu_test::check_config<T, 3, 32, stochastic>(data);
  gpu_test::check_config<T, 5, 4096, nearest>(data);
}

/// NaN / Inf buckets, constant buckets and device_status, for input type T.
template <class T>
void check_special() {
  using Q = cgx::quant::maxmin<4, 64, stochastic>;
  using D = cgx::quant::device<Q>;
  using M = cgx::quant::meta_t<T>;
  const std::size_t B = 64, nb = 7, n = nb * B - 5;  // partial last bucket
  const M inf = std::numeric_limits<M>::infinity();
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = gpu_test::from_m<T>(static_cast<M>(static_cast<int>(i % 13) - 6) * M(0.25));
  // bucket 1: one NaN; bucket 2: +Inf; bucket 3: -Inf; bucket 4: constant 1.5;
  // bucket 5: constant -0.375; bucket 6 (partial): a NaN in its last value.
  x[1 * B + 17] = gpu_test::from_m<T>(std::numeric_limits<M>::quiet_NaN());
  x[2 * B + 63] = gpu_test::from_m<T>(inf);
  x[3 * B + 0] = gpu_test::from_m<T>(-inf);
  for (std::size_t i = 4 * B; i < 5 * B; ++i) x[i] = gpu_test::from_m<T>(M(1.5));
  for (std::size_t i = 5 * B; i < 6 * B; ++i) x[i] = gpu_test::from_m<T>(M(-0.375));
  x[n - 1] = gpu_test::from_m<T>(std::numeric_limits<M>::quiet_NaN());
  const bool nonfinite[nb] = {false, true, true, true, false, false, true};

  const std::size_t bytes = D::template compressed_bytes<T>(n);
  dev_buf<T> d_x(n), d_y(n);
  dev_buf<std::byte> d_wire(bytes);
  dev_buf<cgx::quant::device_status> d_status(1);
  d_x.upload(x.data(), n);
  CUDA_OK(cudaMemset(d_status.get(), 0, sizeof(cgx::quant::device_status)));
  D::compress(d_x.get(), n, d_wire.get(), gpu_test::test_rng(), nullptr, d_status.get());
  D::compress(d_x.get(), n, d_wire.get(), gpu_test::test_rng(), nullptr, d_status.get());  // adds again
  cgx::quant::device_status status{};
  d_status.download(&status, 1);
  CHECK_MSG(status.nonfinite_buckets == 2 * 4, "nonfinite_buckets = " + std::to_string(status.nonfinite_buckets));

  // The bytes equal the host's (NaN metadata included).
  std::vector<M> xm(n);
  for (std::size_t i = 0; i < n; ++i) xm[i] = gpu_test::to_m<T>(x[i]);
  std::vector<std::byte> host(bytes), dev(bytes);
  Q::template compress<M>(xm.data(), n, host.data(), gpu_test::test_rng());
  d_wire.download(dev.data(), bytes);
  CHECK_MSG(gpu_test::first_diff(host, dev) == std::string::npos, "special buckets: device bytes differ from host");

  std::vector<T> y(n);
  D::decompress(d_wire.get(), n, d_y.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  d_y.download(y.data(), n);
  std::size_t wrong_nan = 0, wrong_const = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t b = i / B;
    if (gpu_test::is_nan(y[i]) != nonfinite[b]) ++wrong_nan;
    if ((b == 4 || b == 5) && !gpu_test::same_bits(y[i], x[i])) ++wrong_const;
  }
  CHECK_MSG(wrong_nan == 0, std::to_string(wrong_nan) + " values NaN where they should not be, or the reverse");
  CHECK_MSG(wrong_const == 0, std::to_string(wrong_const) + " values of constant buckets not reproduced exactly");

  // decompress_add: NaN buckets poison the sum, the others add.
  std::vector<T> y0(n, gpu_test::from_m<T>(M(2))), y1(n);
  d_y.upload(y0.data(), n);
  D::decompress_add(d_wire.get(), n, d_y.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  d_y.download(y1.data(), n);
  wrong_nan = 0;
  wrong_const = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t b = i / B;
    if (gpu_test::is_nan(y1[i]) != nonfinite[b]) ++wrong_nan;
    if ((b == 4 || b == 5) && !gpu_test::same_bits(y1[i], gpu_test::from_m<T>(M(2) + gpu_test::to_m<T>(x[i]))))
      ++wrong_const;
  }
  CHECK_MSG(wrong_nan == 0, "decompress_add: " + std::to_string(wrong_nan) + " values with the wrong NaN-ness");
  CHECK_MSG(wrong_const == 0, "decompress_add: " + std::to_string(wrong_const) + " constant values not exact");
}

/// A compressed buffer that starts at an odd address: same bytes, same decode.
void check_misaligned() {
  using Q = cgx::quant::maxmin<3, 1024, stochastic>;
  using D = cgx::quant::device<Q>;
  const std::vector<float> x = gpu_test::make_data(5000, 4);
  const std::size_t n = x.size(), bytes = D::compressed_bytes<float>(n);
  dev_buf<float> d_x(n), d_y(n), d_z(n);
  dev_buf<std::byte> d_a(bytes), d_b(bytes + 1);
  d_x.upload(x.data(), n);
  D::compress(d_x.get(), n, d_a.get(), gpu_test::test_rng());
  D::compress(d_x.get(), n, d_b.get() + 1, gpu_test::test_rng());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::byte> a(bytes), b(bytes + 1);
  d_a.download(a.data(), bytes);
  d_b.download(b.data(), bytes + 1);
  CHECK(std::memcmp(a.data(), b.data() + 1, bytes) == 0);
  D::decompress(d_a.get(), n, d_y.get());
  D::decompress(d_b.get() + 1, n, d_z.get());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> y(n), z(n);
  d_y.download(y.data(), n);
  d_z.download(z.data(), n);
  CHECK(std::memcmp(y.data(), z.data(), n * sizeof(float)) == 0);
}

/// device<none>: the wire is the values; decompress_add adds in fp32 for half types.
void check_none() {
  using D = cgx::quant::device<cgx::quant::none>;
  const std::size_t n = 1000;
  std::vector<__nv_bfloat16> x(n), y0(n), y(n), back(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = __float2bfloat16_rn(static_cast<float>(i) * 0.37f - 50.0f);
    y0[i] = __float2bfloat16_rn(static_cast<float>(i % 17) * 1.25f);
  }
  dev_buf<__nv_bfloat16> d_x(n), d_y(n);
  dev_buf<std::byte> d_wire(D::compressed_bytes<__nv_bfloat16>(n));
  d_x.upload(x.data(), n);
  D::compress(d_x.get(), n, d_wire.get());
  D::decompress(d_wire.get(), n, d_y.get());
  CUDA_OK(cudaDeviceSynchronize());
  d_y.download(back.data(), n);
  CHECK(std::memcmp(back.data(), x.data(), n * sizeof(x[0])) == 0);
  d_y.upload(y0.data(), n);
  D::decompress_add(d_wire.get(), n, d_y.get());
  CUDA_OK(cudaDeviceSynchronize());
  d_y.download(y.data(), n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!gpu_test::same_bits(y[i], __float2bfloat16_rn(__bfloat162float(y0[i]) + __bfloat162float(x[i])))) ++bad;
  CHECK_MSG(bad == 0, std::to_string(bad) + " sums differ");
}

}  // namespace

int main() {
  gpu_test::require_device("test_maxmin_types");
  check_types<__half>();
  check_types<__nv_bfloat16>();
  check_types<double>();
  check_special<float>();
  check_special<__half>();
  check_special<double>();
  check_misaligned();
  check_none();
  return gpu_test::finish("test_maxmin_types");
}
