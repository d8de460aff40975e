// Device maxmin with nearest rounding, fp32 input: the compressed bytes equal the host's
// bit for bit for Bits 1..8 and buckets of 32, 1024 and 4096 values (a logical warp,
// a block of 128 threads, a block of 256 threads with 2 positions per thread), counts
// with and without a partial last bucket, n = 0; decompress and decompress_add equal
// the host's values (up to FMA contraction, see gpu_test.hpp).
#include "gpu_test.hpp"

int main() {
  gpu_test::require_device("test_maxmin_nearest");
  using cgx::quant::nearest;
  const std::vector<float> data = gpu_test::make_data(1 << 17, 1);
  gpu_test::check_all_bits<float, 32, nearest>(data);
  gpu_test::check_all_bits<float, 1024, nearest>(data);
  gpu_test::check_all_bits<float, 4096, nearest>(data);
  return gpu_test::finish("test_maxmin_nearest");
}
