// Issue 18 over MPI: a plan whose capacity makes a size overflow std::size_t (max_count =
// SIZE_MAX, 2^63 - 1) throws cgx::error(errc::invalid_argument) naming the plan and the
// count, where the old code wrapped to a small workspace that a legal call wrote past;
// one whose workspace the machine cannot hold (2^50 values) throws errc::workspace,
// where the old code let std::bad_alloc out. Every plan and reducer, at each rank count.
// And what a sum that overflows gives through each codec at 2+ ranks (README,
// "Guarantees"): +-Inf through quant::none and error_bounded_plan like MPI_Allreduce, NaN
// for the whole bucket through quant::maxmin.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using cgx::comm::mpi;
using SRA = cgx::comm::scatter_reduce_allgather;
using Q4 = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
using EB = cgx::quant::error_bounded<1024>;

constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
constexpr std::size_t huge_counts[] = {size_max, (std::size_t{1} << 63) - 1, std::size_t{1} << 62};

#if defined(__SANITIZE_ADDRESS__)
constexpr bool asan = true;  // ASan's operator new aborts instead of throwing std::bad_alloc
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool asan = true;
#else
constexpr bool asan = false;
#endif
#else
constexpr bool asan = false;
#endif

// The errc and message of what f throws (errc::transport and "" if it throws nothing:
// no test expects that code).
template <class F>
std::pair<cgx::errc, std::string> thrown(F&& f) {
  try {
    f();
  } catch (const cgx::error& e) {
    return {e.code(), e.what()};
  }
  FAIL("no cgx::error was thrown");
  return {cgx::errc::transport, ""};
}

// make(count) constructs a plan of `name` for count values (collective). `allocates`:
// the plan needs a workspace at this rank count (uncompressed on one rank needs none).
template <class Make>
void check_plan(const std::string& name, Make make, bool allocates = true) {
  for (std::size_t count : huge_counts) {
    CAPTURE(name);
    CAPTURE(count);
    const std::pair<cgx::errc, std::string> got = thrown([&] { make(count); });
    CHECK(got.first == cgx::errc::invalid_argument);
    CHECK(got.second.find(name) != std::string::npos);
    CHECK(got.second.find(std::to_string(count)) != std::string::npos);
  }
  if (!asan && allocates) {
    CAPTURE(name);
    CHECK(thrown([&] { make(std::size_t{1} << 50); }).first == cgx::errc::workspace);
  }
  make(1000);  // an ordinary count still builds
}

template <class R>
void check_allreduce(const std::string& reducer, bool allocates = true) {
  CAPTURE(reducer);
  using P = cgx::allreduce_plan<float, Q4, R, mpi>;
  check_plan("allreduce_plan", [](std::size_t n) { P plan{mpi{MPI_COMM_WORLD}, n}; }, allocates);
  for (std::size_t count : huge_counts) {
    CHECK(thrown([&] { (void)P::workspace_bytes(count, cgx_test::world_size()); }).first == cgx::errc::invalid_argument);
    std::vector<std::byte> ws(64);
    CHECK(thrown([&] { P plan(mpi{MPI_COMM_WORLD}, count, std::span<std::byte>(ws)); }).first ==
          cgx::errc::invalid_argument);
  }
}
}  // namespace

TEST_CASE("allreduce_plan, every reducer: sizes that overflow and workspaces that cannot be allocated") {
  check_allreduce<SRA>("sra");
  check_allreduce<cgx::comm::ring>("ring");
  check_allreduce<cgx::comm::tree>("tree");
  check_allreduce<cgx::comm::uncompressed>("uncompressed", cgx_test::world_size() > 1);  // no workspace on one rank
  check_allreduce<cgx::comm::hierarchical<SRA, cgx::comm::ring>>("hierarchical");
  using N = cgx::allreduce_plan<double, cgx::quant::none, SRA, mpi>;
  check_plan("allreduce_plan", [](std::size_t n) { N plan{mpi{MPI_COMM_WORLD}, n}; });
}

TEST_CASE("error_bounded_plan, layerwise_plan, reduce_scatter, allgather, broadcast: the same") {
  check_plan("error_bounded_plan", [](std::size_t n) { cgx::error_bounded_plan<float, EB, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, n}; });
  check_plan("error_bounded_plan",
             [](std::size_t n) { cgx::error_bounded_plan<double, EB, cgx::comm::ring, mpi> plan{mpi{MPI_COMM_WORLD}, n}; });
  check_plan("layerwise_plan", [](std::size_t n) {
    cgx::layerwise_plan<float, mpi> plan{mpi{MPI_COMM_WORLD}, n, {cgx::layer{0, n / 2}, cgx::layer{n / 2, n - n / 2}}};
  });
  check_plan("reduce_scatter_plan", [](std::size_t n) { cgx::reduce_scatter_plan<float, Q4, mpi> plan{mpi{MPI_COMM_WORLD}, n}; });
  check_plan("allgather_plan", [](std::size_t n) { cgx::allgather_plan<float, Q4, mpi> plan{mpi{MPI_COMM_WORLD}, n}; });
  check_plan("broadcast_plan", [](std::size_t n) { cgx::broadcast_plan<float, Q4, mpi> plan{mpi{MPI_COMM_WORLD}, n}; });
}

TEST_CASE("a sum that overflows: +-Inf through none and error_bounded_plan, NaN for the bucket through maxmin") {
  const int p = cgx_test::world_size();
  if (p < 2) return;  // one rank: nothing is added
  constexpr float big = std::numeric_limits<float>::max();
  constexpr float inf = std::numeric_limits<float>::infinity();
  const std::size_t n = 4096;
  // Bucket 0 overflows upwards, bucket 1 downwards, buckets 2-3 stay finite.
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = i < 1024 ? big * (0.75f + 0.0625f * static_cast<float>(i % 3)) : i < 2048 ? -big * 0.8f : 0.5f + static_cast<float>(i % 5);
  std::vector<float> want = x;
  MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  REQUIRE(want[0] == inf);
  REQUIRE(want[1500] == -inf);

  cgx::allreduce_plan<float, cgx::quant::none, SRA, mpi> none{mpi{MPI_COMM_WORLD}, n, cgx_test::schedule_always()};
  std::vector<float> a = x;
  none(a.data(), n);
  for (std::size_t i = 0; i < 2048; ++i) CHECK(a[i] == want[i]);

  cgx::error_bounded_plan<float, EB, SRA, mpi> eb{mpi{MPI_COMM_WORLD}, n, cgx_test::schedule_always()};
  std::vector<float> b = x;
  eb(b.data(), n, 1e-3);
  for (std::size_t i = 0; i < 2048; ++i) CHECK(b[i] == want[i]);
  for (std::size_t i = 2048; i < n; ++i) CHECK(std::fabs(b[i] - want[i]) <= 1e-3);

  cgx::allreduce_plan<float, cgx::quant::maxmin<4, 1024, cgx::quant::nearest>, SRA, mpi> mm{mpi{MPI_COMM_WORLD}, n,
                                                                                             cgx_test::schedule_always()};
  std::vector<float> c = x;
  mm(c.data(), n);
  for (std::size_t i = 0; i < 2048; ++i) CHECK(std::isnan(c[i]));
  for (std::size_t i = 2048; i < n; ++i) CHECK(std::isfinite(c[i]));
}
