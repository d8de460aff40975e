// Non-blocking start()/wait(), and the native-allreduce fallback below the threshold:
// how a plan picks the static threshold (transports' single_node()) and that it uses it.
// The default measured choice: test_path_choice.cpp.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <cstring>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using cgx::allreduce_plan;
using cgx::comm::mpi;
using SRA = cgx::comm::scatter_reduce_allgather;
using Q4 = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;

// Whether every rank runs on the host of rank 0, by MPI_Get_processor_name: what
// single_node() must say, found without the MPI_Comm_split_type it uses.
bool same_host_as_rank0() {
  char name[MPI_MAX_PROCESSOR_NAME] = {}, root[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::memcpy(root, name, sizeof(name));
  MPI_Bcast(root, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
  int same = std::strcmp(name, root) == 0 ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}
}  // namespace

TEST_CASE("single_node(): MPI's shared-memory domain, or the caller's node grouping") {
  const int r = world_rank();
  const int p = world_size();
  // ctest starts every rank on this machine.
  REQUIRE(same_host_as_rank0());
  CHECK(mpi{MPI_COMM_WORLD}.single_node());
  CHECK(cgx::comm::shm{MPI_COMM_WORLD}.single_node());
  // Two ranks per emulated node: one node up to 2 ranks, two from 3.
  CHECK(mpi{MPI_COMM_WORLD, mpi::nodes{r / 2}}.single_node() == (p <= 2));
  CHECK(mpi{MPI_COMM_WORLD, mpi::nodes{7}}.single_node());
  // A grouping given on some ranks only: the others count as one more node.
  CHECK(mpi{MPI_COMM_WORLD, mpi::nodes{r == 0 ? 0 : -1}}.single_node() == (p == 1));
  // A sub-communicator asks about its own ranks.
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &half);
  CHECK(mpi{half}.single_node());
  MPI_Comm_free(&half);
}

TEST_CASE("start()/wait() gives the bits of the blocking call, while the caller computes") {
  const int r = world_rank();
  const std::size_t n = 200000;
  allreduce_plan<float, Q4, SRA, mpi> blocking{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  allreduce_plan<float, Q4, cgx::comm::ring, mpi> ringp{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  allreduce_plan<float, Q4, SRA, mpi> overlapped{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  for (int call = 0; call < 3; ++call) {
    auto a = inputs<float>(r, n, 100 + static_cast<unsigned>(call));
    auto b = a;
    blocking(a.data(), n);
    overlapped.start(b.data(), n);
    CHECK(overlapped.in_flight());
    volatile double busy = 0;  // the "training step" that overlaps the reduction
    for (int i = 0; i < 200000; ++i) busy = busy + 1e-9 * i;
    overlapped.wait();
    CHECK(!overlapped.in_flight());
    CHECK(a == b);
    CHECK(identical_on_all_ranks(b));
  }
  auto c = inputs<float>(r, n, 7);
  ringp.start(c.data(), n);
  ringp.wait();
  CHECK(identical_on_all_ranks(c));
}

TEST_CASE("start(): bad input throws at once, buffer untouched; misuse is refused") {
  const int r = world_rank();
  const int p = world_size();
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 1000, checked(schedule_always())};
  auto v = inputs<float>(r, 1000, 1);
  const auto before = v;
  float* buf = (r == p - 1) ? nullptr : v.data();
  CHECK_THROWS_AS(plan.start(buf, 1000), cgx::error);
  CHECK(!plan.in_flight());
  CHECK(v == before);
  plan.start(v.data(), 1000);
  CHECK_THROWS_AS(plan.start(v.data(), 1000), cgx::error);
  CHECK_THROWS_AS(plan(v.data(), 1000), cgx::error);
  plan.wait();
  plan.wait();  // no-op
  CHECK(identical_on_all_ranks(v));
}

TEST_CASE("below native_below_bytes the plan uses MPI_Allreduce; above it, the compressed schedule") {
  const int r = world_rank();
  const int p = world_size();
  cgx::plan_options o;
  o.native_below_bytes = 64 << 10;
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 100000, o};
  auto small = inputs<float>(r, 1000, 5);  // 4000 bytes
  std::vector<float> want(small.size());
  MPI_Allreduce(small.data(), want.data(), static_cast<int>(small.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  plan(small.data(), small.size());
  CHECK(small == want);  // exact: no quantization
  auto large = inputs<float>(r, 100000, 6);  // 400 kB
  std::vector<float> exact(large.size());
  MPI_Allreduce(large.data(), exact.data(), static_cast<int>(large.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  plan(large.data(), large.size());
  if (p > 1) CHECK(large != exact);  // 4-bit quantization changed it
  CHECK(identical_on_all_ranks(large));
}

TEST_CASE("ranks with different thresholds are refused before any data moves") {
  const int r = world_rank();
  const int p = world_size();
  if (p == 1) return;
  cgx::plan_options o = checked();
  o.native_below_bytes = r == 0 ? 1000 : 2000;
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 100, o};
  auto v = inputs<float>(r, 100, 2);
  const auto before = v;
  CHECK_THROWS_AS(plan(v.data(), 100), cgx::error);
  CHECK(v == before);
}

TEST_CASE("static_threshold is picked at construction: 16 MiB on one node, 64 KiB across nodes; the default measures") {
  const int r = world_rank();
  const int p = world_size();
  using EB = cgx::error_bounded_plan<float, cgx::quant::error_bounded<1024>, SRA, mpi>;
  CHECK(cgx::plan_options{}.native_below_bytes == cgx::auto_threshold);
  {  // the default: measured per size class (tests/test_path_choice.cpp), no fixed threshold
    allreduce_plan<float, Q4, SRA, mpi> measured{mpi{MPI_COMM_WORLD}, 100};
    CHECK(measured.native_below_bytes() == cgx::auto_threshold);
    CHECK_FALSE(measured.path_for(64 << 10).measured);  // nothing called yet
    CHECK(measured.path_for(100).measured);             // under 4 KiB: native, nothing to measure
    CHECK_FALSE(measured.path_for(100).compressed);
  }
  cgx::plan_options st;
  st.native_below_bytes = cgx::static_threshold;
  CHECK(cgx::default_native_below_bytes == std::size_t{64} << 10);
  CHECK(cgx::default_native_below_bytes_one_node == std::size_t{16} << 20);
  REQUIRE(same_host_as_rank0());  // ctest starts every rank on this machine
  allreduce_plan<float, Q4, SRA, mpi> on_mpi{mpi{MPI_COMM_WORLD}, 100, st};
  CHECK(on_mpi.transport().single_node());
  CHECK(on_mpi.native_below_bytes() == cgx::default_native_below_bytes_one_node);
  CHECK(on_mpi.options().native_below_bytes == cgx::static_threshold);  // options() keeps what was asked
  allreduce_plan<float, Q4, SRA, cgx::comm::shm> on_shm{cgx::comm::shm{MPI_COMM_WORLD}, 100, st};
  CHECK(on_shm.transport().single_node());
  CHECK(on_shm.native_below_bytes() == cgx::default_native_below_bytes_one_node);
  EB eb{mpi{MPI_COMM_WORLD}, 100, st};  // the error-bounded plan: every call native on one node
  CHECK(eb.native_below_bytes() == cgx::error_bounded_native_below_bytes_one_node);
  // Two ranks per emulated node: several nodes from 3 ranks on.
  const std::size_t want = p <= 2 ? cgx::default_native_below_bytes_one_node : cgx::default_native_below_bytes;
  allreduce_plan<float, Q4, SRA, mpi> grouped{mpi{MPI_COMM_WORLD, mpi::nodes{r / 2}}, 100, st};
  CHECK(grouped.native_below_bytes() == want);
  EB eb_grouped{mpi{MPI_COMM_WORLD, mpi::nodes{r / 2}}, 100, st};
  CHECK(eb_grouped.native_below_bytes() ==
        (p <= 2 ? cgx::error_bounded_native_below_bytes_one_node : cgx::default_native_below_bytes));
}

TEST_CASE("an explicit threshold, and 0, are used as given") {
  const int r = world_rank();
  for (std::size_t given : {std::size_t{0}, std::size_t{1000}, std::size_t{1} << 30}) {
    CAPTURE(given);
    cgx::plan_options o;
    o.native_below_bytes = given;
    allreduce_plan<float, Q4, SRA, mpi> a{mpi{MPI_COMM_WORLD}, 100, o};
    CHECK(a.native_below_bytes() == given);
    allreduce_plan<float, Q4, SRA, mpi> b{mpi{MPI_COMM_WORLD, mpi::nodes{r / 2}}, 100, o};
    CHECK(b.native_below_bytes() == given);
    allreduce_plan<float, Q4, SRA, cgx::comm::shm> c{cgx::comm::shm{MPI_COMM_WORLD}, 100, o};
    CHECK(c.native_below_bytes() == given);
    cgx::error_bounded_plan<float, cgx::quant::error_bounded<1024>, SRA, mpi> d{mpi{MPI_COMM_WORLD}, 100, o};
    CHECK(d.native_below_bytes() == given);
  }
}

TEST_CASE("calls use static_threshold's pick: 1 MiB goes to MPI_Allreduce on one node, is compressed across nodes") {
  cgx::plan_options st;
  st.native_below_bytes = cgx::static_threshold;
  const int r = world_rank();
  const int p = world_size();
  const std::size_t n = (std::size_t{1} << 20) / sizeof(float);  // 1 MiB: between the two defaults
  const auto x = integer_inputs<float>(r, n);                      // MPI_Allreduce sums them exactly
  const auto exact = mpi_sum(x);
  REQUIRE(same_host_as_rank0());
  allreduce_plan<float, Q4, SRA, mpi> by_default{mpi{MPI_COMM_WORLD}, n, st};
  allreduce_plan<float, Q4, SRA, mpi> always{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  allreduce_plan<float, Q4, SRA, mpi> grouped{mpi{MPI_COMM_WORLD, mpi::nodes{r / 2}}, n, st};
  auto v = x;
  by_default(v.data(), n);
  CHECK(v == exact);  // MPI_Allreduce itself
  CHECK(by_default.calls() == 0);  // the counter of compressed calls did not move
  v = x;
  always(v.data(), n);
  if (p > 1) CHECK(v != exact);  // 4-bit quantization changed it
  CHECK(identical_on_all_ranks(v));
  v = x;
  grouped(v.data(), n);
  if (p > 2) CHECK(v != exact);  // two nodes: 64 KiB, so 1 MiB is compressed
  if (p <= 2) CHECK(v == exact);
  CHECK(grouped.calls() == (p > 2 ? 1u : 0u));
  // comm::shm falls back to MPI_Allreduce too (over the communicator it was made from).
  allreduce_plan<float, Q4, SRA, cgx::comm::shm> on_shm{cgx::comm::shm{MPI_COMM_WORLD}, n, st};
  v = x;
  on_shm(v.data(), n);
  CHECK(v == exact);
  CHECK(on_shm.calls() == 0);
  allreduce_plan<float, Q4, SRA, cgx::comm::shm> shm_always{cgx::comm::shm{MPI_COMM_WORLD}, n, schedule_always()};
  v = x;
  shm_always(v.data(), n);
  if (p > 1) CHECK(v != exact);
  CHECK(shm_always.calls() == 1);
  // The error-bounded plan reports the native path in its stats.
  cgx::error_bounded_plan<float, cgx::quant::error_bounded<1024>, SRA, mpi> eb{mpi{MPI_COMM_WORLD}, n, st};
  v = x;
  eb(v.data(), n, 0.5);
  CHECK(eb.last_stats().native);
  CHECK(v == exact);
}

TEST_CASE("a rank that asks for the default while another gives a value: refused, not a hang") {
  const int r = world_rank();
  const int p = world_size();
  if (p == 1) return;
  cgx::plan_options o = checked();
  if (r == p - 1) o.native_below_bytes = cgx::default_native_below_bytes;  // the others pick 16 MiB
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 100, o};
  auto v = inputs<float>(r, 100, 3);
  const auto before = v;
  CHECK(error_code_of([&] { plan(v.data(), 100); }) == cgx::errc::mismatch);
  CHECK(v == before);
}
