// The measured choice between the compressed schedule and the native allreduce
// (plan_options::native_below_bytes = auto_threshold, the default; detail::path_choice):
// its schedule, that every rank takes the same path on every call, that the slowest rank
// decides, that it follows a change of which path is faster, and the ways to force a path.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>
#include <cgx/detail/path_choice.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using cgx::allreduce_plan;
using cgx::comm::mpi;
using SRA = cgx::comm::scatter_reduce_allgather;
using Q4 = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;

// Delays injected into comm::mpi's two paths, in milliseconds (0: none). Set by the test,
// the same on every rank unless the test says otherwise. They are large (60-200 ms) so
// that the slowed path loses even where the other is slow itself: sanitizer builds at
// -O0, and MPICH's busy-polling ranks oversubscribing two cores in CI.
std::atomic<int> native_delay_ms{0};
std::atomic<int> compressed_delay_ms{0};

// comm::mpi with a sleep before its native allreduce, or before each wait of the
// compressed schedule: a real transport on which one path is made slower at will.
struct slowed_mpi : mpi {
  using mpi::mpi;
  template <class T>
  void native_allreduce(T* buf, std::size_t n) {
    if (const int d = native_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    mpi::native_allreduce(buf, n);
  }
  void wait_all(std::span<request> reqs) {
    if (const int d = compressed_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    mpi::wait_all(reqs);
  }
};

// Every rank's sequence `v` equals rank 0's.
bool same_sequence_on_all_ranks(const std::vector<int>& v) {
  std::vector<int> root = v;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_INT, 0, MPI_COMM_WORLD);
  int same = root == v ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}
}  // namespace

TEST_CASE("path_choice's schedule: probe both, agree, keep the faster, re-check with a growing interval") {
  cgx::detail::path_choice c;
  const std::size_t bytes = 64 << 10;
  std::vector<bool> seen;
  int agreements = 0;
  // This "rank" measures native at 10 us and compressed at 5 us; the agreement is the
  // identity (one rank).
  auto agree = [&](std::span<std::int64_t>) { ++agreements; };
  auto call = [&](std::int64_t native_ns, std::int64_t compressed_ns) {
    const bool z = c.compress_next(bytes);
    seen.push_back(z);
    c.record(bytes, z, z ? compressed_ns : native_ns, agree);
  };
  for (int i = 0; i < 8; ++i) call(10000, 5000);
  CHECK(seen == std::vector<bool>{false, true, false, true, false, true, false, true});
  CHECK(agreements == 1);
  auto k = c.pick_for(bytes);
  CHECK(k.measured);
  CHECK(k.compressed);
  CHECK(k.native_s == doctest::Approx(10e-6));
  CHECK(k.compressed_s == doctest::Approx(5e-6));
  // 16 calls on the pick, then two on the other path and a decision.
  seen.clear();
  for (int i = 0; i < 18; ++i) call(10000, 5000);
  CHECK(std::count(seen.begin(), seen.end(), false) == 2);
  CHECK(seen[15]);
  CHECK(!seen[16]);
  CHECK(!seen[17]);
  CHECK(agreements == 2);
  CHECK(c.pick_for(bytes).decisions == 2);
  CHECK(c.pick_for(bytes).flips == 0);
  // The pick stood: the interval doubled to 32.
  seen.clear();
  for (int i = 0; i < 34; ++i) call(10000, 5000);
  CHECK(std::count(seen.begin(), seen.end(), false) == 2);
  CHECK(!seen[32]);
  CHECK(!seen[33]);
  // Now native is faster: the next re-check (interval 64) flips the pick, and the
  // interval returns to 16.
  seen.clear();
  for (int i = 0; i < 66; ++i) call(1000, 5000);
  CHECK(c.pick_for(bytes).flips == 1);
  CHECK_FALSE(c.pick_for(bytes).compressed);
  seen.clear();
  for (int i = 0; i < 18; ++i) call(1000, 5000);
  CHECK(std::count(seen.begin(), seen.end(), true) == 2);  // the re-check after 16 calls
  CHECK(seen[16]);
  CHECK(seen[17]);
  // Under 4 KiB: always native, nothing recorded; classes are independent.
  CHECK_FALSE(c.compress_next(4095));
  CHECK(c.pick_for(4095).measured);
  CHECK_FALSE(c.pick_for(128 << 10).measured);
  CHECK(c.pick_for(bytes + 1000).calls == c.pick_for(bytes).calls);  // one class: [64 KiB, 128 KiB)
}

TEST_CASE("the interval stops growing at 256 calls") {
  cgx::detail::path_choice c;
  const std::size_t bytes = 1 << 20;
  auto agree = [](std::span<std::int64_t>) {};
  int others = 0;
  for (int i = 0; i < 8 + 4000; ++i) {
    const bool z = c.compress_next(bytes);
    if (i >= 8 && !z) ++others;
    c.record(bytes, z, z ? 1000 : 2000, agree);
  }
  // Re-checks after 16, 32, 64, 128, then every 256 calls: 2 calls each.
  const int rechecks = others / 2;
  CHECK(rechecks >= 4 + (4000 - (16 + 32 + 64 + 128 + 8)) / 258);
  CHECK(rechecks <= 4 + (4000 - (16 + 32 + 64 + 128 + 8)) / 258 + 1);
}

TEST_CASE("a class whose measured neighbours answer it skips probing, and is re-checked after 16 calls") {
  cgx::detail::path_choice c;
  auto agree = [](std::span<std::int64_t>) {};
  // Each call's times: native and compressed, by class.
  auto run = [&](std::size_t bytes, int calls, std::int64_t native_ns, std::int64_t compressed_ns) {
    std::vector<bool> seen;
    for (int i = 0; i < calls; ++i) {
      const bool z = c.compress_next(bytes);
      seen.push_back(z);
      c.record(bytes, z, z ? compressed_ns : native_ns, agree);
    }
    return seen;
  };
  // 64 KiB: compressed wins by 5x.
  run(64 << 10, 8, 10000, 2000);
  REQUIRE(c.pick_for(64 << 10).compressed);
  CHECK_FALSE(c.pick_for(64 << 10).inferred);
  // A larger class takes compressed from its first call, without probing native.
  auto seen = run(1 << 20, 16, 100000, 20000);
  CHECK(std::count(seen.begin(), seen.end(), false) == 0);
  cgx::path_pick k = c.pick_for(1 << 20);
  CHECK(k.measured);
  CHECK(k.inferred);
  CHECK(k.compressed);
  CHECK(k.decisions == 0);
  // Its first re-check (calls 16 and 17 on native) measures it and confirms the pick.
  seen = run(1 << 20, 2, 100000, 20000);
  CHECK(seen == std::vector<bool>{false, false});
  k = c.pick_for(1 << 20);
  CHECK_FALSE(k.inferred);
  CHECK(k.compressed);
  CHECK(k.decisions == 1);
  CHECK(k.native_s == doctest::Approx(100e-6));
  // A smaller class is not answered by a compressed pick above it: it is probed.
  seen = run(16 << 10, 8, 3000, 2000);
  CHECK(seen == std::vector<bool>{false, true, false, true, false, true, false, true});
  CHECK_FALSE(c.pick_for(16 << 10).inferred);
  // 16 MiB is inferred compressed too, but there native is 3x faster: its first re-check
  // flips it to native, on its own measurement.
  seen = run(16 << 20, 18, 1000000, 3000000);
  CHECK(std::count(seen.begin(), seen.end(), false) == 2);
  k = c.pick_for(16 << 20);
  CHECK_FALSE(k.compressed);
  CHECK_FALSE(k.inferred);
  CHECK(k.flips == 1);
  // 4 MiB lies between a compressed pick below (1 MiB, by 5x) and a native one above
  // (16 MiB, by 3x): the neighbours contradict, so it is probed.
  seen = run(4 << 20, 2, 1, 1);
  CHECK(seen == std::vector<bool>{false, true});
  // Above the native pick nothing is inferred from it (native's lead there may be its
  // latency, which a larger call outgrows).
  seen = run(64 << 20, 2, 1, 1);
  CHECK(seen == std::vector<bool>{false, true});
  // A win by less than the margin carries nothing: 2 KiB classes are native anyway, so
  // take a fresh choice with 8 KiB picked compressed by 1.5x: 32 KiB is probed.
  cgx::detail::path_choice d;
  for (int i = 0; i < 8; ++i) {
    const bool z = d.compress_next(8 << 10);
    d.record(8 << 10, z, z ? 2000 : 3000, agree);
  }
  REQUIRE(d.pick_for(8 << 10).compressed);
  CHECK_FALSE(d.compress_next(32 << 10));
  // Native by the margin at 1 MiB answers 256 KiB from its first call.
  for (int i = 0; i < 8; ++i) {
    const bool z = d.compress_next(1 << 20);
    d.record(1 << 20, z, z ? 9000 : 3000, agree);
  }
  REQUIRE_FALSE(d.pick_for(1 << 20).compressed);
  CHECK_FALSE(d.compress_next(256 << 10));
  d.record(256 << 10, false, 100, agree);
  CHECK(d.pick_for(256 << 10).inferred);
  CHECK_FALSE(d.pick_for(256 << 10).compressed);
}

TEST_CASE("by default every rank takes the same path on every call and ends with the same bits") {
  const int r = world_rank();
  const std::size_t sizes[] = {1000, 4096, 16384, 65536, 262144};
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 262144};
  std::vector<int> paths;
  for (int round = 0; round < 12; ++round) {
    for (const std::size_t n : sizes) {
      auto v = inputs<float>(r, n, static_cast<std::uint64_t>(round));
      plan(v.data(), n);
      paths.push_back(plan.last_native() ? 0 : 1);
      CHECK(identical_on_all_ranks(v));
      if (plan.last_native()) CHECK(v == mpi_sum(inputs<float>(r, n, static_cast<std::uint64_t>(round))));
    }
  }
  CHECK(same_sequence_on_all_ranks(paths));
  // Each class of 16 KiB and more was probed on both paths, then decided.
  for (const std::size_t n : sizes) {
    const cgx::path_pick k = plan.path_for(n * sizeof(float));
    CHECK(k.measured);
    if (n * sizeof(float) >= 4096) {
      CHECK(k.calls == 12);
      CHECK(k.decisions >= 1);
      CHECK(k.native_s > 0);
      CHECK(k.compressed_s > 0);
    }
  }
}

TEST_CASE("the measured choice picks the path that is faster, on the slowest rank's times") {
  const int r = world_rank();
  const int p = world_size();
  const std::size_t n = 64 << 10;  // 256 KiB
  SUBCASE("native slowed on every rank: compressed wins") {
    native_delay_ms = 200;
  }
  SUBCASE("native slowed on the last rank only: every rank picks compressed") {
    native_delay_ms = r == p - 1 ? 200 : 0;
  }
  SUBCASE("the compressed schedule slowed: native wins") {
    if (p == 1) return;  // one rank: the schedule makes no wait
    compressed_delay_ms = 60;
  }
  allreduce_plan<float, Q4, SRA, slowed_mpi> plan{slowed_mpi{MPI_COMM_WORLD}, n};
  std::vector<float> v(n);
  for (int i = 0; i < 8; ++i) {
    v = inputs<float>(r, n, 7);
    plan(v.data(), n);
  }
  const cgx::path_pick k = plan.path_for(n * sizeof(float));
  const bool want_compressed = compressed_delay_ms.load() == 0;
  native_delay_ms = 0;
  compressed_delay_ms = 0;
  REQUIRE(k.measured);
  CHECK(k.compressed == want_compressed);
  v = inputs<float>(r, n, 8);
  plan(v.data(), n);
  CHECK(plan.last_native() == !want_compressed);
  CHECK(identical_on_all_ranks(v));
}

TEST_CASE("an inferred pick is taken by every rank: a larger class follows a clear compressed win") {
  const int r = world_rank();
  const int p = world_size();
  if (p == 1) return;
  const std::size_t small = 16 << 10, large = 256 << 10;
  allreduce_plan<float, Q4, SRA, slowed_mpi> plan{slowed_mpi{MPI_COMM_WORLD}, large};
  native_delay_ms = 200;  // native loses by far more than the margin
  std::vector<float> v;
  for (int i = 0; i < 8; ++i) {
    v = inputs<float>(r, small, 4);
    plan(v.data(), small);
  }
  native_delay_ms = 0;
  REQUIRE(plan.path_for(small * sizeof(float)).compressed);
  std::vector<int> paths;
  for (int i = 0; i < 4; ++i) {
    v = inputs<float>(r, large, 5);
    plan(v.data(), large);
    paths.push_back(plan.last_native() ? 0 : 1);
    CHECK(identical_on_all_ranks(v));
  }
  CHECK(paths == std::vector<int>{1, 1, 1, 1});
  CHECK(same_sequence_on_all_ranks(paths));
  const cgx::path_pick k = plan.path_for(large * sizeof(float));
  CHECK(k.inferred);
  CHECK(k.compressed);
}

TEST_CASE("the choice follows a change: the pick flips at the next re-check") {
  const int r = world_rank();
  const int p = world_size();
  if (p == 1) return;
  const std::size_t n = 16 << 10;
  allreduce_plan<float, Q4, SRA, slowed_mpi> plan{slowed_mpi{MPI_COMM_WORLD}, n};
  std::vector<float> v(n);
  native_delay_ms = 200;
  for (int i = 0; i < 8 + 4; ++i) {
    v = inputs<float>(r, n, 1);
    plan(v.data(), n);
  }
  CHECK(plan.path_for(n * sizeof(float)).compressed);
  // The load moves: the compressed schedule becomes the slow one.
  native_delay_ms = 0;
  compressed_delay_ms = 60;
  for (int i = 0; i < 16; ++i) {
    v = inputs<float>(r, n, 2);
    plan(v.data(), n);
  }
  compressed_delay_ms = 0;
  const cgx::path_pick k = plan.path_for(n * sizeof(float));
  CHECK_FALSE(k.compressed);
  CHECK(k.flips == 1);
  CHECK(k.decisions == 2);
  v = inputs<float>(r, n, 3);
  plan(v.data(), n);
  CHECK(plan.last_native());
}

TEST_CASE("either path can be forced: 0 always compresses, always_native never does") {
  const int r = world_rank();
  const int p = world_size();
  const std::size_t n = 64 << 10;
  const auto x = integer_inputs<float>(r, n);
  const auto exact = mpi_sum(x);
  cgx::plan_options never;
  never.native_below_bytes = cgx::always_native;
  allreduce_plan<float, Q4, SRA, mpi> native_only{mpi{MPI_COMM_WORLD}, n, never};
  allreduce_plan<float, Q4, SRA, mpi> compressed_only{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  for (int i = 0; i < 8; ++i) {
    auto v = x;
    native_only(v.data(), n);
    CHECK(native_only.last_native());
    CHECK(v == exact);
    v = x;
    compressed_only(v.data(), n);
    CHECK_FALSE(compressed_only.last_native());
    if (p > 1) CHECK(v != exact);
  }
  CHECK(native_only.calls() == 0);
  CHECK(compressed_only.calls() == 8);
  CHECK(native_only.path_for(n * 4).measured);
  CHECK_FALSE(native_only.path_for(n * 4).compressed);
  CHECK(compressed_only.path_for(n * 4).compressed);
}

TEST_CASE("the error-bounded plan measures too, and reports the path in its stats") {
  const int r = world_rank();
  const std::size_t n = 64 << 10;
  cgx::error_bounded_plan<double, cgx::quant::error_bounded<1024>, SRA, mpi> eb{mpi{MPI_COMM_WORLD}, n};
  CHECK(eb.native_below_bytes() == cgx::auto_threshold);
  std::vector<int> paths;
  for (int i = 0; i < 10; ++i) {
    auto v = inputs<double>(r, n, static_cast<std::uint64_t>(i));
    eb(v.data(), n, 1e-3);
    paths.push_back(eb.last_stats().native ? 0 : 1);
    CHECK(identical_on_all_ranks(v));
  }
  // The probing order: native, compressed, native, ...
  CHECK(paths[0] == 0);
  CHECK(paths[1] == 1);
  CHECK(same_sequence_on_all_ranks(paths));
  CHECK(eb.path_for(n * sizeof(double)).measured);
}

TEST_CASE("start()/wait() use the same choice") {
  const int r = world_rank();
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) return;
  const std::size_t n = 8 << 10;
  allreduce_plan<float, Q4, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, n};
  std::vector<int> paths;
  for (int i = 0; i < 10; ++i) {
    auto v = inputs<float>(r, n, static_cast<std::uint64_t>(i));
    plan.start(v.data(), n);
    plan.wait();
    paths.push_back(plan.last_native() ? 0 : 1);
    CHECK(identical_on_all_ranks(v));
  }
  CHECK(same_sequence_on_all_ranks(paths));
  CHECK(plan.path_for(n * sizeof(float)).measured);
}
