// test_kernel_bodies: double input (fp64 metadata and arithmetic).
#include "kernel_bodies_check.hpp"

TEST_CASE("kernel bodies: double, every width, rounding and bucket shape") { kb_test::check_all_buckets<double>(); }
