// Device maxmin with stochastic rounding, fp32 input: as test_maxmin_nearest (bytes
// equal to the host's, including the Philox bits of every position, with a non-zero
// rng position/counter/stream), plus the unusual thread shapes: buckets of 8 values
// (one thread per bucket), 24 (3 positions in a logical warp of 4), 40 (5 in 8) and
// 16384 (2048 positions, more than a block caches: values are read twice).
#include "gpu_test.hpp"

int main() {
  gpu_test::require_device("test_maxmin_stochastic");
  using cgx::quant::stochastic;
  const std::vector<float> data = gpu_test::make_data(1 << 17, 2);
  gpu_test::check_all_bits<float, 32, stochastic>(data);
  gpu_test::check_all_bits<float, 1024, stochastic>(data);
  gpu_test::check_all_bits<float, 4096, stochastic>(data);
  gpu_test::check_config<float, 3, 8, stochastic>(data);
  gpu_test::check_config<float, 5, 24, stochastic>(data);
  gpu_test::check_config<float, 8, 40, stochastic>(data);
  gpu_test::check_config<float, 2, 16384, stochastic>(data);
  gpu_test::check_config<float, 7, 16384, stochastic>(data);
  return gpu_test::finish("test_maxmin_stochastic");
}
