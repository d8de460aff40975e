// test_kernel_bodies: __half and __nv_bfloat16 input, through the CUDA toolkit's
// host-callable conversions (cuda_fp16.h, cuda_bf16.h). Built only where CMake found
// the toolkit's headers (CGX_TEST_CUDA_TYPES); the float and double cases run without.
#include "kernel_bodies_check.hpp"

#include <cgx/quant/device_types.hpp>

TEST_CASE("kernel bodies: __half, every width, rounding and bucket shape") { kb_test::check_all_buckets<__half>(); }

TEST_CASE("kernel bodies: __nv_bfloat16, every width, rounding and bucket shape") {
  kb_test::check_all_buckets<__nv_bfloat16>();
}
