// error_bounded_plan: every element of the result within the bound asked for, on every
// rank, identical bits on every rank, for float and double, SRA and ring, over MPI and
// shared memory, bounds 1e-2 .. 1e-6 of the data range, on data with smooth regions,
// noise, constant regions and outliers; the compression ratio is reported. Bad input
// throws and leaves the buffer untouched. On a smooth field the codec's delta mode sends
// fewer bytes than its plain mode and gives the same bits.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "eb_data.hpp"
#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using Q = cgx::quant::error_bounded<1024>;
using SRA = cgx::comm::scatter_reduce_allgather;
using cgx::comm::mpi;
using cgx::comm::ring;
using cgx::comm::shm;

struct eb_case {
  std::size_t n;
  std::uint64_t salt;  // salt 1 with n < 3000: no outliers, a small data range
};
const eb_case cases[] = {{0, 0}, {1, 0}, {5, 2}, {1024, 0}, {2999, 1}, {4097, 3}, {20011, 0}};

template <class T, class R, class X>
void bound_holds() {
  const int p = world_size();
  const int me = world_rank();
  cgx::error_bounded_plan<T, Q, R, X> plan{X{MPI_COMM_WORLD}, 20011, schedule_always()};
  for (const eb_case& c : cases) {
    const std::size_t n = c.n;
    std::vector<std::vector<T>> x;
    double range_lo = 0, range_hi = 0;
    for (int r = 0; r < p; ++r) {
      x.push_back(eb_inputs<T>(r, n, c.salt));
      for (T v : x.back()) {
        range_lo = std::min(range_lo, static_cast<double>(v));
        range_hi = std::max(range_hi, static_cast<double>(v));
      }
    }
    const double range = range_hi > range_lo ? range_hi - range_lo : 1.0;  // (0 and 1 values: any bound)
    std::vector<long double> exact(n, 0.0L), mag(n, 0.0L);
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < n; ++i) {
        exact[i] += static_cast<long double>(x[static_cast<std::size_t>(r)][i]);
        mag[i] += std::fabs(static_cast<long double>(x[static_cast<std::size_t>(r)][i]));
      }
    for (double rel : {1e-2, 1e-3, 1e-4, 1e-5, 1e-6}) {
      CAPTURE(n);
      CAPTURE(rel);
      const double bound = rel * range;
      std::vector<T> v = x[static_cast<std::size_t>(me)];
      plan(v.data(), n, bound);
      // The stated residual: the double rounding of the p - 1 additions.
      std::size_t outside = 0;
      long double worst = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const long double err = std::fabs(static_cast<long double>(v[i]) - exact[i]);
        worst = std::max(worst, err);
        if (!(err <= bound + 4.0L * p * 0x1p-53L * (mag[i] + bound))) ++outside;
      }
      CHECK(outside == 0);
      CHECK(identical_on_all_ranks(v));
      if (p == 1) CHECK(v == x[0]);  // nothing is quantized on one rank
      const auto& st = plan.last_stats();
      CHECK(st.step_bound == doctest::Approx(p > 1 ? bound / p : bound));
      unsigned long long bytes[2] = {st.bytes_sent, st.raw_bytes}, total[2] = {0, 0};
      MPI_Allreduce(bytes, total, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      if (p > 1 && n >= 1024 && rel >= 1e-2) CHECK(total[0] * 2 < total[1]);  // at least 2x at loose bounds
      const std::string what = std::string(R::name) + (std::is_same_v<T, float> ? " float" : " double");
      if (n == 20011 && p > 1)
        MESSAGE(what << " p=" << p << " bound " << rel
                        << " x range: worst error / bound = " << static_cast<double>(worst / bound)
                        << ", compression ratio " << static_cast<double>(total[1]) / static_cast<double>(total[0]));
    }
  }
}
}  // namespace

TEST_CASE("error_bounded_plan: SRA over mpi, float and double") {
  bound_holds<float, SRA, mpi>();
  bound_holds<double, SRA, mpi>();
}
TEST_CASE("error_bounded_plan: ring over mpi, float and double") {
  bound_holds<float, ring, mpi>();
  bound_holds<double, ring, mpi>();
}
TEST_CASE("error_bounded_plan: SRA and ring over shm") {
  bound_holds<float, SRA, shm>();
  bound_holds<double, ring, shm>();
}

TEST_CASE("error_bounded_plan: a large message through small shm rings") {
  // Payloads many times the 4 KiB ring, headers and payloads interleaved per pair.
  const int p = world_size();
  cgx::error_bounded_plan<double, Q, SRA, shm> plan{shm{MPI_COMM_WORLD, 4096}, 50000, schedule_always()};
  auto v = eb_inputs<double>(world_rank(), 50000, 3);
  std::vector<double> exact(v.size(), 0.0);
  for (int r = 0; r < p; ++r) {
    const auto xr = eb_inputs<double>(r, v.size(), 3);
    for (std::size_t i = 0; i < v.size(); ++i) exact[i] += xr[i];
  }
  plan(v.data(), v.size(), 1e-7);
  std::size_t outside = 0;
  for (std::size_t i = 0; i < v.size(); ++i) outside += std::fabs(v[i] - exact[i]) <= 1e-7 * (1 + 1e-9) ? 0 : 1;
  CHECK(outside == 0);
  CHECK(identical_on_all_ranks(v));
}

TEST_CASE("error_bounded_plan: bad input throws and leaves the buffer untouched") {
  const int p = world_size();
  const int me = world_rank();
  cgx::error_bounded_plan<float, Q, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 1000, checked(schedule_always())};
  std::vector<float> v(100, 1.5f);
  const auto before = v;
  CHECK(error_code_of([&] { plan(v.data(), 100, 0.0); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { plan(v.data(), 100, -1.0); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { plan(v.data(), 100, std::nan("")); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { plan(v.data(), 1001, 1e-3); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { plan(nullptr, 10, 1e-3); }) == cgx::errc::invalid_argument);
  if (p > 1) {
    CHECK(error_code_of([&] { plan(v.data(), 100, me == 0 ? 1e-3 : 2e-3); }) == cgx::errc::mismatch);
    CHECK(error_code_of([&] { plan(v.data(), me == 0 ? 99 : 100, 1e-3); }) == cgx::errc::mismatch);
  }
  CHECK(v == before);
  plan(v.data(), 100, 1e-3);  // still usable: constant buckets sum exactly
  CHECK(v == std::vector<float>(100, 1.5f * static_cast<float>(p)));
}

namespace {
// A smooth field (two sinusoids + 1e-3 noise), different on every rank.
std::vector<float> smooth_field(int r, std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i);
    x[i] = static_cast<float>(std::sin(0.002 * t + r) + 0.5 * std::sin(0.013 * t + 0.3 * r) +
                              1e-3 * (2 * eb_unit(i * 7 + static_cast<std::size_t>(r)) - 1));
  }
  return x;
}

template <class R>
void delta_vs_plain() {
  using QPlain = cgx::quant::error_bounded<1024, cgx::quant::eb_prediction::none>;
  const int p = world_size();
  const int me = world_rank();
  const std::size_t n = 40000;
  cgx::error_bounded_plan<float, Q, R, mpi> with_delta{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  cgx::error_bounded_plan<float, QPlain, R, mpi> plain{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  std::vector<long double> exact(n, 0.0L);
  double range = 0;
  for (int r = 0; r < p; ++r) {
    const auto xr = smooth_field(r, n);
    range = std::max(range, range_of(xr));
    for (std::size_t i = 0; i < n; ++i) exact[i] += xr[i];
  }
  for (double rel : {1e-2, 1e-3, 1e-4}) {
    CAPTURE(rel);
    const double bound = rel * range;
    auto a = smooth_field(me, n), b = a;
    with_delta(a.data(), n, bound);
    plain(b.data(), n, bound);
    CHECK(a == b);  // the modes carry the same grid indices: the same sums, the same bits
    CHECK(identical_on_all_ranks(a));
    std::size_t outside = 0;
    for (std::size_t i = 0; i < n; ++i)
      // Residual: the double rounding of p - 1 additions of values below 2 (under 1e-14 here).
      if (!(std::fabs(static_cast<long double>(a[i]) - exact[i]) <= bound + 1e-12L)) ++outside;
    CHECK(outside == 0);
    unsigned long long bytes[2] = {with_delta.last_stats().bytes_sent, plain.last_stats().bytes_sent}, total[2] = {0, 0};
    MPI_Allreduce(bytes, total, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (p > 1) {
      CHECK(total[0] * 3 < total[1] * 2);  // at least 1.5x fewer bytes on a smooth field
      MESSAGE(std::string(R::name) << " p=" << p << " bound " << rel << " x range, smooth field: delta mode sends "
                      << static_cast<double>(total[1]) / static_cast<double>(total[0]) << "x fewer bytes");
    }
  }
}
}  // namespace

TEST_CASE("error_bounded_plan: the delta mode on a smooth field, SRA and ring") {
  delta_vs_plain<SRA>();
  delta_vs_plain<ring>();
}
