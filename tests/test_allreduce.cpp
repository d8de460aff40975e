// allreduce_plan with the SRA reducer over MPI, at whatever rank count the test runs
// with (registered for 1, 2, 3 and 4). Expected values are computed from size().
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "mpi_test_util.hpp"

namespace {

using cgx::allreduce_plan;
using cgx::comm::mpi;
using SRA = cgx::comm::scatter_reduce_allgather;
using cgx::quant::maxmin;
using cgx::quant::nearest;
using cgx::quant::stochastic;

using cgx_test::identical_on_all_ranks;
using cgx_test::schedule_always;
using cgx_test::inputs;
using cgx_test::mix;
using cgx_test::world_rank;
using cgx_test::world_size;

const std::size_t counts[] = {0, 1, 2, 3, 7, 1000, 1023, 1024, 1025, (std::size_t{1} << 20) + 3};

template <class T>
void passthrough_equals_mpi_allreduce() {
  const int r = world_rank();
  allreduce_plan<T, cgx::quant::none, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, counts[9], schedule_always()};
  for (std::size_t n : counts) {
    CAPTURE(n);
    auto x = cgx_test::integer_inputs<T>(r, n);
    const auto y = cgx_test::mpi_sum(x);
    plan(x.data(), n);
    CHECK(x == y);
  }
}

}  // namespace

TEST_CASE("passthrough allreduce equals MPI_Allreduce exactly on integer-valued data") {
  passthrough_equals_mpi_allreduce<float>();
  passthrough_equals_mpi_allreduce<double>();
}

namespace {

// Checks every element of `got` (the allreduce of inputs<T>(r, n, salt) over all
// ranks) against the SRA bound documented in scatter_reduce_allgather.hpp.
template <class T, class Q>
std::size_t elements_outside_sra_bound(const std::vector<T>& got, std::uint64_t salt) {
  const int p = world_size();
  const std::size_t n = got.size();
  constexpr std::size_t B = Q::bucket_size;
  const double L = (1 << Q::bits) - 1;
  const double c = std::is_same_v<typename Q::rounding, nearest> ? 0.5 : 1.0;
  using sched = typename SRA::template schedule<T, Q, mpi>;
  std::vector<std::vector<T>> x(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) x[static_cast<std::size_t>(r)] = inputs<T>(r, n, salt);
  std::size_t bad = 0;
  for (std::size_t b0 = 0; b0 < n; b0 += B) {
    const std::size_t b1 = std::min(n, b0 + B);
    int owner = 0;
    while (owner + 1 < p && sched::chunk_of(n, p, owner).begin + sched::chunk_of(n, p, owner).count <= b0) ++owner;
    double first = 0, mag = 0;
    for (int r = 0; r < p; ++r) {
      const auto& xr = x[static_cast<std::size_t>(r)];
      const auto [lo, hi] = std::minmax_element(xr.begin() + static_cast<std::ptrdiff_t>(b0), xr.begin() + static_cast<std::ptrdiff_t>(b1));
      if (r != owner) first += c * (static_cast<double>(*hi) - static_cast<double>(*lo)) / L;
      mag += std::max(std::fabs(static_cast<double>(*lo)), std::fabs(static_cast<double>(*hi)));
    }
    double smin = std::numeric_limits<double>::max(), smax = -smin;
    std::vector<double> exact(b1 - b0, 0.0);
    for (std::size_t i = b0; i < b1; ++i) {
      for (int r = 0; r < p; ++r) exact[i - b0] += static_cast<double>(x[static_cast<std::size_t>(r)][i]);
      smin = std::min(smin, exact[i - b0]);
      smax = std::max(smax, exact[i - b0]);
    }
    const double us = p > 1 ? (smax - smin + 2 * first) / L : 0.0;
    const double slack = 8 * p * std::numeric_limits<T>::epsilon() * mag;
    const double bound = first + (p > 1 ? c * us : 0.0) + slack;
    for (std::size_t i = b0; i < b1; ++i)
      if (!(std::fabs(static_cast<double>(got[i]) - exact[i - b0]) <= bound)) ++bad;
  }
  return bad;
}

template <class T, class Q>
void sra_bits_and_bound() {
  const int r = world_rank();
  const std::size_t sizes[] = {1, 7, 1000, 1025, 5000, (std::size_t{1} << 16) + 3};
  allreduce_plan<T, Q, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, sizes[5], schedule_always()};
  for (std::size_t n : sizes) {
    CAPTURE(n);
    auto v = inputs<T>(r, n, n);
    plan(v.data(), n);
    CHECK(identical_on_all_ranks(v));
    CHECK(elements_outside_sra_bound<T, Q>(v, n) == 0);
  }
}

}  // namespace

TEST_CASE("SRA: every rank holds identical bits and every element is within the documented bound") {
  sra_bits_and_bound<float, maxmin<4, 1024, stochastic>>();
  sra_bits_and_bound<float, maxmin<4, 1024, nearest>>();
  sra_bits_and_bound<float, maxmin<2, 512, stochastic>>();
  sra_bits_and_bound<float, maxmin<8, 128, nearest>>();
  sra_bits_and_bound<double, maxmin<8, 1024, stochastic>>();
  sra_bits_and_bound<double, maxmin<3, 256, nearest>>();
}

TEST_CASE("SRA with stochastic rounding is unbiased over repeated calls") {
  // K calls on the same input (the plan's call counter changes the random bits). Each
  // element's result is exact + e, E[e] = 0 (to 2^-16 of a unit per quantization), and
  // Var[e] <= sum of u^2/4 over its quantizations (p - 1 contributions and the sum).
  // Tolerance per element: 6 standard deviations of the mean of K results, plus the
  // generator's bias bound.
  using Q = maxmin<2, 256, stochastic>;
  const int p = world_size();
  const int r = world_rank();
  const std::size_t n = 2048;
  const int K = 300;
  allreduce_plan<float, Q, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  std::vector<double> mean(n, 0.0);
  const auto x = inputs<float>(r, n, 42);
  std::vector<float> v;
  for (int k = 0; k < K; ++k) {
    v = x;
    plan(v.data(), n);
    for (std::size_t i = 0; i < n; ++i) mean[i] += v[i];
  }
  std::vector<std::vector<float>> all(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q) all[static_cast<std::size_t>(q)] = inputs<float>(q, n, 42);
  const double L = 3;
  std::size_t bad = 0;
  double worst_sigmas = 0;
  for (std::size_t b0 = 0; b0 < n; b0 += 256) {
    double var = 0, units = 0, smin = 1e300, smax = -1e300;
    for (int q = 0; q < p; ++q) {
      const auto& xq = all[static_cast<std::size_t>(q)];
      const auto [lo, hi] = std::minmax_element(xq.begin() + static_cast<std::ptrdiff_t>(b0), xq.begin() + static_cast<std::ptrdiff_t>(b0 + 256));
      const double u = (static_cast<double>(*hi) - *lo) / L;
      var += u * u / 4;
      units += u;
    }
    for (std::size_t i = b0; i < b0 + 256; ++i) {
      double s = 0;
      for (int q = 0; q < p; ++q) s += all[static_cast<std::size_t>(q)][i];
      smin = std::min(smin, s);
      smax = std::max(smax, s);
    }
    const double us = (smax - smin + 2 * units) / L;
    if (p > 1) {
      var += us * us / 4;
      units += us;
    } else {
      var = 0;  // one rank: nothing is quantized, the result is the input
    }
    const double sd_mean = std::sqrt(var / K);
    const double tol = 6 * sd_mean + units / 65536 + 1e-6;
    for (std::size_t i = b0; i < b0 + 256; ++i) {
      double exact = 0;
      for (int q = 0; q < p; ++q) exact += all[static_cast<std::size_t>(q)][i];
      const double dev = std::fabs(mean[i] / K - exact);
      if (dev > tol) ++bad;
      if (sd_mean > 0) worst_sigmas = std::max(worst_sigmas, dev / sd_mean);
    }
  }
  CAPTURE(worst_sigmas);
  CHECK(bad == 0);
  // Not vacuous: at p > 1 a single call is off by much more than the tolerance of the mean.
  if (p > 1) {
    double single = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double exact = 0;
      for (int q = 0; q < p; ++q) exact += all[static_cast<std::size_t>(q)][i];
      single = std::max(single, std::fabs(static_cast<double>(v[i]) - exact));
    }
    CHECK(single > 0.05);
  }
}

TEST_CASE("SRA reproduces constant buckets exactly") {
  const int r = world_rank();
  const int p = world_size();
  const std::size_t n = 5 * 1024 + 100;
  allreduce_plan<float, maxmin<3, 1024, stochastic>, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>(i / 1024) * 3 - 4 + r);
  plan(v.data(), n);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(p * (static_cast<int>(i / 1024) * 3 - 4) + p * (p - 1) / 2);
    wrong += v[i] == want ? 0 : 1;
  }
  CHECK(wrong == 0);
}

TEST_CASE("a plan over a caller's sub-communicator") {
  const int r = world_rank();
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &half);
  int hp;
  MPI_Comm_size(half, &hp);
  {
    allreduce_plan<double, cgx::quant::none, SRA, mpi> plan{mpi{half}, 100, schedule_always()};
    CHECK(plan.transport().size() == hp);
    std::vector<double> v(100, 1.0 + r % 2);
    plan(v.data(), v.size());
    for (double d : v) CHECK(d == hp * (1.0 + r % 2));
  }
  MPI_Comm_free(&half);
}

TEST_CASE("a plan is reused across calls of different counts; threads do not change bits") {
  const int r = world_rank();
  using Q = maxmin<4, 512, stochastic>;
  const std::size_t big = 40000;
  cgx::plan_options one = schedule_always(), three = schedule_always();
  three.threads = 3;
  allreduce_plan<float, Q, SRA, mpi> a{mpi{MPI_COMM_WORLD}, big, one};
  allreduce_plan<float, Q, SRA, mpi> b{mpi{MPI_COMM_WORLD}, big, three};
  for (std::size_t n : {big, std::size_t{513}, std::size_t{0}, std::size_t{20000}}) {
    CAPTURE(n);
    auto va = inputs<float>(r, n, 9);
    auto vb = va;
    a(va.data(), n);
    b(vb.data(), n);
    CHECK(va == vb);
    CHECK(identical_on_all_ranks(va));
    CHECK(elements_outside_sra_bound<float, Q>(va, 9) == 0);
  }
  CHECK(a.calls() == 4);
}

TEST_CASE("caller-provided workspace") {
  const int r = world_rank();
  const int p = world_size();
  using P = allreduce_plan<float, maxmin<8, 1024, nearest>, SRA, mpi>;
  const std::size_t n = 3000;
  std::vector<std::byte> ws(P::workspace_bytes(n, p));
  P plan{mpi{MPI_COMM_WORLD}, n, std::span<std::byte>(ws), schedule_always()};
  CHECK(plan.workspace_size() == ws.size());
  auto v = inputs<float>(r, n, 1);
  plan(v.data(), n);
  CHECK(identical_on_all_ranks(v));
  CHECK(elements_outside_sra_bound<float, maxmin<8, 1024, nearest>>(v, 1) == 0);
}
