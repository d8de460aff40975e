// The code that docs/layerwise.md and docs/error_bounded.md quote: it runs here, and
// the ctests doc_snippet.* check that the pages quote it verbatim (the quickstart and the
// device snippet of the README are checked the same way). Each case checks what the
// page promises of its snippet: every rank ends with the same bits, uncompressed layers
// are summed exactly, the error-bounded sum is within its bound on every element.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;

// The same checksum on every rank (exact bits).
template <class T>
bool same_bits_everywhere(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;
  for (const T& x : v) {
    std::uint64_t b = 0;
    std::memcpy(&b, &x, sizeof(T));
    h = (h ^ b) * 1099511628211ull;
  }
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// A gradient of step `step` on this rank: integers in the one-dimensional layer (so its
// sum is exact), gradient-like values elsewhere.
void fill_gradient(float* g, std::size_t n, int step) {
  const int me = world_rank();
  for (std::size_t i = 0; i < n; ++i)
    g[i] = (i >= 4096 && i < 4224) ? static_cast<float>(static_cast<int>(i % 7) - 3 + me)
                                   : static_cast<float>(input_value(me, i, static_cast<std::uint64_t>(step)));
}
}  // namespace

TEST_CASE("docs/layerwise.md: the layer-wise snippet runs; uncompressed layers exact, same bits everywhere") {
  const int p = world_size();
  std::vector<float> storage(12416);
  float* grad = storage.data();
  // [snippet:layerwise]
  std::vector<cgx::layer> layers{{0, 4096}, {4096, 128, /*one_dimensional=*/true}, {4224, 8192}};
  cgx::layerwise_plan<float, cgx::comm::mpi> plan{cgx::comm::mpi{MPI_COMM_WORLD}, 12416, layers,
                                                  {.defaults = {.bits = 4}, .error_feedback = true}};
  cgx::adaptive_bits adapt(layers, plan.settings(), {.min_bits = 2, .max_bits = 8, .target_bits = 3.5});
  for (int step = 1; step <= 32; ++step) {
    fill_gradient(grad, 12416, step);  // your backward pass
    plan(grad, 12416);                 // collective, in place: the sum over all ranks
    adapt.observe(grad);               // the reduced gradient: the same on every rank
    if (step % 16 == 0) plan.set_settings(adapt.assign());  // the same assignment everywhere
  }
  // [snippet:layerwise]
  CHECK(same_bits_everywhere(storage));
  // The one-dimensional layer went uncompressed: its sum of integers is exact.
  for (std::size_t i = 4096; i < 4224; ++i) {
    float want = 0;
    for (int r = 0; r < p; ++r) want += static_cast<float>(static_cast<int>(i % 7) - 3 + r);
    REQUIRE(grad[i] == want);
  }
  for (float v : storage) REQUIRE(std::isfinite(v));
}

TEST_CASE("docs/error_bounded.md: the error-bounded snippet runs; every element within 1e-4") {
  const int p = world_size();
  const std::size_t n = 5000;
  std::vector<double> field(n);
  for (std::size_t i = 0; i < n; ++i) field[i] = std::sin(0.01 * static_cast<double>(i) + world_rank());
  // [snippet:error_bounded]
  using Q = cgx::quant::error_bounded<1024>;          // per bucket: 0..44 bits, plain or delta, or raw
  using R = cgx::comm::scatter_reduce_allgather;      // or cgx::comm::ring
  cgx::error_bounded_plan<double, Q, R, cgx::comm::mpi> plan{cgx::comm::mpi{MPI_COMM_WORLD}, n};
  plan(field.data(), n, 1e-4);   // every element of the sum within 1e-4 of the exact sum, on every rank
  const auto& stats = plan.last_stats();  // bytes sent, the uncompressed equivalent, the ratio
  // [snippet:error_bounded]
  for (std::size_t i = 0; i < n; ++i) {
    long double exact = 0;
    for (int r = 0; r < p; ++r) exact += std::sin(0.01 * static_cast<double>(i) + r);
    REQUIRE(std::fabs(static_cast<long double>(field[i]) - exact) <= 1e-4L);
  }
  CHECK(same_bits_everywhere(field));
  CHECK(stats.bound == 1e-4);
  // Below the plan's threshold (on one node: 16 MiB) the call is MPI_Allreduce, exact.
  CHECK(stats.native == (n * sizeof(double) < plan.native_below_bytes()));
}
