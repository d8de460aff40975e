// test_kernel_bodies: __nv_bfloat16 input, through the CUDA toolkit's host-callable
// conversions (cuda_bf16.h). Built only where CMake found the toolkit's headers.
#include "kernel_bodies_check.hpp"

#include <cgx/quant/device_types.hpp>

TEST_CASE("kernel bodies: __nv_bfloat16, every width, rounding and bucket shape") {
  kb_test::check_all_buckets<__nv_bfloat16>();
}
