// The CUDA kernels' bodies run on the host (cgx/quant/kernel_bodies.hpp) write the bytes
// of the host quantizer and decode its values, bit for bit: float input. The other
// input types are in test_kernel_bodies_double.cpp and test_kernel_bodies_half.cpp.
#include "kernel_bodies_check.hpp"

TEST_CASE("kernel bodies: float, every width, rounding and bucket shape") { kb_test::check_all_buckets<float>(); }
