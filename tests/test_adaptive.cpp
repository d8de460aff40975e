// adaptive_bits: synthetic layers of known sensitivity get bits in the order of their
// sensitivity, within [min_bits, max_bits], and the count-weighted average respects
// the target; the assignment is the same on every rank when computed from the reduced
// gradient; a plan accepts it between calls.
#include <doctest/doctest.h>

#include <cgx/adaptive.hpp>
#include <cgx/cgx.hpp>

#include <cmath>
#include <vector>

#include "mpi_test_util.hpp"

namespace {

using cgx::layer;
using cgx::layer_setting;

// Layer l has count counts[l] and values of magnitude scales[l] (its known sensitivity).
struct synthetic {
  std::vector<layer> layers;
  std::vector<double> scales;
  std::vector<float> grad;
};

synthetic make_synthetic(std::uint64_t salt) {
  const std::size_t counts[] = {4096, 20000, 2048, 30000, 1500, 8000, 64, 12000};
  const double scales[] = {1e-3, 2e-3, 5e-1, 1e-3, 8e-1, 3e-2, 1.0, 2e-2};
  synthetic s;
  std::size_t off = 0;
  for (std::size_t l = 0; l < 8; ++l) {
    s.layers.push_back({off, counts[l], l == 6});
    s.scales.push_back(scales[l]);
    off += counts[l];
  }
  s.grad.resize(off);
  for (std::size_t l = 0; l < 8; ++l)
    for (std::size_t i = 0; i < counts[l]; ++i) {
      const double u = static_cast<double>(cgx_test::mix(salt * 977 + s.layers[l].offset + i) >> 11) * 0x1p-53;
      s.grad[s.layers[l].offset + i] = static_cast<float>((2 * u - 1) * scales[l]);
    }
  return s;
}

}  // namespace

TEST_CASE("adaptive: bits follow sensitivity, stay in range and respect the average-bits target") {
  const synthetic syn = make_synthetic(1);
  const auto init = cgx::default_settings(syn.layers);
  for (double target : {2.0, 2.5, 3.0, 4.0, 5.5, 8.0}) {
    CAPTURE(target);
    cgx::adaptive_bits ad(syn.layers, init, {.min_bits = 2, .max_bits = 8, .target_bits = target, .clusters = 3});
    ad.observe(syn.grad.data());
    const auto s = ad.assign();
    REQUIRE(s.size() == syn.layers.size());
    CHECK(ad.average_bits(s) <= target + 1e-9);
    for (std::size_t l = 0; l < s.size(); ++l) {
      CAPTURE(l);
      if (init[l].bits == 0) {
        CHECK(s[l].bits == 0);  // the one-dimensional layer stays uncompressed
        continue;
      }
      CHECK(s[l].bits >= 2);
      CHECK(s[l].bits <= 8);
      // Sensitivity measured ~ the known scale (uniform values: top 1% RMS ~ scale).
      CHECK(ad.sensitivity()[l] == doctest::Approx(syn.scales[l]).epsilon(0.05));
      for (std::size_t m = 0; m < s.size(); ++m)
        if (init[m].bits != 0 && syn.scales[l] < syn.scales[m] / 4) CHECK(s[l].bits <= s[m].bits);
    }
    if (target >= 8.0)
      for (std::size_t l = 0; l < s.size(); ++l) CHECK((init[l].bits == 0 || s[l].bits == 8));
    if (target <= 2.0)
      for (std::size_t l = 0; l < s.size(); ++l) CHECK((init[l].bits == 0 || s[l].bits == 2));
  }
}

TEST_CASE("adaptive: the budget is spent where it lowers the objective most") {
  const synthetic syn = make_synthetic(2);
  const auto init = cgx::default_settings(syn.layers);
  cgx::adaptive_bits ad(syn.layers, init, {.target_bits = 3.0, .clusters = 3});
  ad.observe(syn.grad.data());
  const auto s = ad.assign();
  // The three sensitivity groups (1e-3..2e-3, 2e-2..3e-2, 0.5..0.8) are the three clusters.
  const auto cl = ad.clusters();
  REQUIRE(cl.size() == 7);  // adapted layers: all but the one-dimensional one
  CHECK(cl[0] == cl[1]);
  CHECK(cl[0] == cl[3]);
  CHECK(cl[2] == cl[4]);
  CHECK(cl[5] == cl[6]);  // adapted layers 5 and 6 are layers 5 and 7
  CHECK(cl[0] != cl[2]);
  CHECK(cl[0] != cl[5]);
  CHECK(cl[2] != cl[5]);
  // Uniform bits at the same (or a larger) budget are worse.
  std::vector<layer_setting> uniform = s;
  for (std::size_t l = 0; l < s.size(); ++l)
    if (init[l].bits != 0) uniform[l].bits = 3;
  CHECK(ad.average_bits(uniform) >= ad.average_bits(s) - 1e-9);
  CHECK(ad.objective(s) < ad.objective(uniform));
  // The least sensitive (and largest) cluster gets the fewest bits, the most sensitive the most.
  CHECK(s[0].bits == 2);
  CHECK(s[4].bits > s[5].bits);
  CHECK(s[2].bits == s[4].bits);
}

TEST_CASE("adaptive: decayed statistics; bad options") {
  const synthetic a = make_synthetic(3);
  const auto init = cgx::default_settings(a.layers);
  cgx::adaptive_bits ad(a.layers, init, {.decay = 0.5});
  ad.observe(a.grad.data());
  const double s0 = ad.sensitivity()[0];
  std::vector<float> doubled = a.grad;
  for (float& v : doubled) v *= 2;
  ad.observe(doubled.data());
  CHECK(ad.sensitivity()[0] == doctest::Approx(1.5 * s0));  // 0.5 s0 + 0.5 (2 s0)
  CHECK_THROWS_AS(cgx::adaptive_bits(a.layers, init, {.min_bits = 0}), cgx::error);
  CHECK_THROWS_AS(cgx::adaptive_bits(a.layers, init, {.min_bits = 5, .max_bits = 4}), cgx::error);
  CHECK_THROWS_AS(cgx::adaptive_bits(a.layers, init, {.bucket = 100}), cgx::error);
  CHECK_THROWS_AS(cgx::adaptive_bits(a.layers, {}, {}), cgx::error);
  CHECK_THROWS_AS(cgx::adaptive_bits(a.layers, init, {.target_bits = std::nan("")}), cgx::error);
}

TEST_CASE("adaptive: the same assignment on every rank from the reduced gradient; the plan takes it") {
  const int r = cgx_test::world_rank();
  synthetic syn = make_synthetic(4);
  // Each rank holds a different gradient; the reduced one is the same everywhere.
  for (std::size_t i = 0; i < syn.grad.size(); ++i) syn.grad[i] *= static_cast<float>(1 + 0.1 * r);
  using cgx::comm::mpi;
  cgx::layerwise_plan<float, mpi> plan{mpi{MPI_COMM_WORLD}, syn.grad.size(), syn.layers,
                                       {.check = cgx::checking::collective}};
  cgx::adaptive_bits ad(syn.layers, plan.settings(), {.target_bits = 3.5});
  std::vector<cgx::layer_setting> last;
  for (int step = 0; step < 3; ++step) {
    auto g = syn.grad;
    plan(g.data(), g.size());
    ad.observe(g.data());
    const auto s = ad.assign();
    last = s;
    std::vector<int> bits;
    for (const auto& x : s) bits.push_back(x.bits);
    std::vector<int> lo = bits, hi = bits;
    MPI_Allreduce(MPI_IN_PLACE, lo.data(), static_cast<int>(lo.size()), MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, hi.data(), static_cast<int>(hi.size()), MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi);
    plan.set_settings(s);  // collective checking in the next call verifies agreement
  }
  // The plan runs with the assignment it was given (the collective check of the call
  // passes only if every rank set the same), and every rank ends with the same bits.
  REQUIRE(plan.settings().size() == last.size());
  CHECK(plan.settings() == last);
  auto g = syn.grad;
  plan(g.data(), g.size());
  CHECK(cgx_test::identical_on_all_ranks(g));
}
