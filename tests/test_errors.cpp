// Bad input raises cgx::error (on every rank, for collective checks) before any data
// moves, and the caller's buffer is left untouched.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <vector>

#include "mpi_test_util.hpp"
#include "thrown_code.hpp"

namespace {
using cgx::allreduce_plan;
using cgx::comm::mpi;
using SRA = cgx::comm::scatter_reduce_allgather;
using Q4 = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;

int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

using cgx_test::thrown_code;

std::vector<float> ramp(std::size_t n, int r) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i % 17) + static_cast<float>(r);
  return v;
}
}  // namespace

TEST_CASE("counts that differ between ranks: cgx::error on every rank, buffers untouched") {
  const int r = world_rank();
  const int p = world_size();
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 5000, cgx_test::checked(cgx_test::schedule_always())};
  auto v = ramp(5000, r);
  const auto before = v;
  const std::size_t n = (p > 1 && r == p - 1) ? 4000 : 5000;
  if (p > 1) {
    CHECK(thrown_code([&] { plan(v.data(), n); }) == cgx::errc::mismatch);
    CHECK(v == before);
  }
  // The plan still works afterwards.
  plan(v.data(), 5000);
  if (p > 1) CHECK(v != before);
}

TEST_CASE("a null buffer with n > 0 on one rank: cgx::error everywhere, nothing moved") {
  const int r = world_rank();
  const int p = world_size();
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 100, cgx_test::checked()};
  auto v = ramp(100, r);
  const auto before = v;
  float* buf = (r == p - 1) ? nullptr : v.data();
  CHECK(thrown_code([&] { plan(buf, 100); }) == cgx::errc::invalid_argument);
  CHECK(v == before);
  // n = 0 with a null buffer is a valid empty call.
  plan(nullptr, 0);
}

TEST_CASE("checking::automatic is collective without NDEBUG, local with it (like assert)") {
  const int r = world_rank();
  const int p = world_size();
#ifdef NDEBUG
  CHECK(cgx::resolve(cgx::checking::automatic) == cgx::checking::local);
#else
  CHECK(cgx::resolve(cgx::checking::automatic) == cgx::checking::collective);
#endif
  CHECK(cgx::resolve(cgx::checking::local) == cgx::checking::local);
  CHECK(cgx::resolve(cgx::checking::collective) == cgx::checking::collective);
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 4000};
  CHECK(plan.options().check == cgx::checking::automatic);
  auto v = ramp(4000, r);
  const auto before = v;
  if (p > 1 && cgx::resolve(cgx::checking::automatic) == cgx::checking::collective) {
    CHECK(thrown_code([&] { plan(v.data(), r == 0 ? 3999 : 4000); }) == cgx::errc::mismatch);
    CHECK(v == before);
  }
  // Local checks happen at every level, on the rank that passed the bad argument.
  CHECK(thrown_code([&] { plan(nullptr, 10); }) == cgx::errc::invalid_argument);
}

TEST_CASE("a count above the plan's capacity") {
  const int r = world_rank();
  allreduce_plan<double, cgx::quant::none, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 10};
  std::vector<double> v(11, 1.0 * r);
  const auto before = v;
  CHECK(thrown_code([&] { plan(v.data(), 11); }) == cgx::errc::invalid_argument);
  CHECK(v == before);
}

TEST_CASE("checking::local still rejects a null buffer, without communicating") {
  cgx::plan_options o;
  o.check = cgx::checking::local;
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 100, o};
  CHECK(thrown_code([&] { plan(nullptr, 10); }) == cgx::errc::invalid_argument);
  CHECK(thrown_code([&] { plan(reinterpret_cast<float*>(8), 101); }) == cgx::errc::invalid_argument);
}

TEST_CASE("ranks calling plans with different quantizers: cgx::error on every rank") {
  const int r = world_rank();
  const int p = world_size();
  if (p == 1) return;
  auto v = ramp(3000, r);
  const auto before = v;
  if (r == 0) {
    allreduce_plan<float, cgx::quant::maxmin<8, 1024, cgx::quant::stochastic>, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 3000,
                                                                                            cgx_test::checked()};
    CHECK(thrown_code([&] { plan(v.data(), 3000); }) == cgx::errc::mismatch);
  } else {
    allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 3000, cgx_test::checked()};
    CHECK(thrown_code([&] { plan(v.data(), 3000); }) == cgx::errc::mismatch);
  }
  CHECK(v == before);
}

TEST_CASE("a caller workspace too small for this communicator's size") {
  const int p = world_size();
  using P = allreduce_plan<float, Q4, SRA, mpi>;
  // Sized as if the communicator had one rank fewer (or for 1 value at one rank).
  const std::size_t n = 100000;
  std::vector<std::byte> ws(p > 1 ? P::workspace_bytes(n, p - 1) : 1);
  CHECK(P::workspace_bytes(n, p) > ws.size());
  CHECK(thrown_code([&] { P plan(mpi{MPI_COMM_WORLD}, n, std::span<std::byte>(ws)); }) == cgx::errc::workspace);
}

TEST_CASE("an unusable communicator or option") {
  CHECK(thrown_code([] { mpi m{MPI_COMM_NULL}; }) == cgx::errc::communicator);
  cgx::plan_options o;
  o.threads = 0;
  CHECK(thrown_code([&] { allreduce_plan<float, Q4, SRA, mpi> plan(mpi{MPI_COMM_WORLD}, 10, o); }) ==
        cgx::errc::invalid_argument);
}
