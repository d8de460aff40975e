// The device quantizer under nvcc's fast-math flags (tests/gpu/CMakeLists.txt compiles
// this file with --use_fast_math, which implies -ftz=true -prec-div=false -prec-sqrt=false -fmad=true):
// the device arithmetic of wire_format.hpp is exact by construction (inline PTX without
// .ftz, correctly rounded division, no contraction), so
//  - the first-use self-test (normal, wide and subnormal buckets) passes, and
//    cgx::quant::device_self_test() does not throw;
//  - compress writes the host's bytes, and decompress / decompress_add give the host's
//    values bit for bit (strict: the fused decoding is not accepted), on data with
//    subnormal ranges (make_data's region at 16384), wide and constant buckets, for
//    float, double, __half and __nv_bfloat16.
#include "gpu_test.hpp"

#include <cstdio>

namespace {

using cgx::quant::nearest;
using cgx::quant::stochastic;

/// Subnormal-only input (float): every bucket's range is subnormal, so every bucket is
/// rescaled and every value is one that -ftz=true would flush.
std::vector<float> subnormal_data(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::ldexp(static_cast<float>((i * 37) % 101) - 30.0f, -140);
  return x;
}

}  // namespace

int main() {
  gpu_test::require_device("test_maxmin_fastmath");
  gpu_test::strict_decode = true;
  try {
    cgx::quant::device_self_test();
    CHECK(true);
  } catch (const cgx::error& e) {
    CHECK_MSG(false, std::string("device_self_test threw: ") + e.what());
  }
  const std::vector<float> data = gpu_test::make_data(1 << 15, 11);
  const std::vector<float> sub = subnormal_data(1 << 13);
  gpu_test::check_all_bits<float, 1024, stochastic>(data);
  gpu_test::check_config<float, 4, 1024, nearest>(data);
  gpu_test::check_config<float, 8, 32, stochastic>(sub);
  gpu_test::check_config<float, 3, 4096, nearest>(sub);
  gpu_test::check_config<double, 5, 1024, stochastic>(data);
  gpu_test::check_config<__half, 4, 1024, stochastic>(data);
  gpu_test::check_config<__nv_bfloat16, 4, 1024, stochastic>(data);
  gpu_test::check_config<__nv_bfloat16, 8, 64, nearest>(sub);
  return gpu_test::finish("test_maxmin_fastmath");
}
