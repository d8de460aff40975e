// test_kernel_bodies: __half input, through the CUDA toolkit's host-callable conversions
// (cuda_fp16.h). Built only where CMake found the toolkit's headers; the float and
// double cases run without. __nv_bfloat16: test_kernel_bodies_bf16.cpp.
#include "kernel_bodies_check.hpp"

#include <cgx/quant/device_types.hpp>

TEST_CASE("kernel bodies: __half, every width, rounding and bucket shape") { kb_test::check_all_buckets<__half>(); }
