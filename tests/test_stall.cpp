// Issue 32, item 3: a peer stopped with SIGSTOP inside a call for longer than the wait
// limit. The others throw errc::timeout naming it; after SIGCONT the stopped rank throws
// too (its data may all have arrived while it was stopped: it must not return as if the
// call had succeeded); a fresh plan then works and is exact (quant::none on integers).
// Over comm::mpi and comm::shm; runs under Open MPI and MPICH (scripts/test stages 1, 4).
//
// How: the last rank calls at once and waits for the others; rank 0 stops it (SIGSTOP)
// 200 ms later, while it waits inside the call, and the others call 300 ms after the
// barrier, so they wait for it; past their limit (1.5 s) they throw; rank 0 then continues
// it (SIGCONT). Needs every rank on one node (kill(2) by pid): the tests run so.
//
// Item 2 too: the default wait limit is finite (10 minutes, or CGX_TIMEOUT_MS), and a
// deadlock in the caller's code (ranks in calls of different plans, each waiting for the
// other) ends in errc::timeout on every rank with default options instead of hanging.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using SRA = cgx::comm::scatter_reduce_allgather;
using Q4 = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;

constexpr std::uint32_t limit_ms = 1500;

bool one_node() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> root(name, name + MPI_MAX_PROCESSOR_NAME);
  MPI_Bcast(root.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
  int same = std::strcmp(root.data(), name) == 0 ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

template <class X>
void stalled_peer() {
  const int r = world_rank(), p = world_size();
  const int stalled = p - 1;
  std::vector<int> pids(static_cast<std::size_t>(p));
  const int me = static_cast<int>(getpid());
  MPI_Allgather(&me, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);

  const std::size_t n = 200000;
  cgx::plan_options o = schedule_always();
  o.check = cgx::checking::local;
  // The stopped rank has no limit of its own: when it continues it must hear its peers'
  // reports (its own limit, measured from before the stop, would end its wait anyway).
  o.timeout_ms = r == stalled ? 0 : limit_ms;
  std::optional<cgx::errc> code;
  std::string what;
  double waited = 0;
  {
    cgx::allreduce_plan<float, Q4, SRA, X> plan{X{MPI_COMM_WORLD}, n, o};
    auto v = inputs<float>(r, n);
    MPI_Barrier(MPI_COMM_WORLD);
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::thread stopper;
    if (r == 0)
      stopper = std::thread([&] {  // stops the last rank while it waits inside its call
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        kill(pids[static_cast<std::size_t>(stalled)], SIGSTOP);
      });
    if (r != stalled) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    try {
      plan(v.data(), n);
    } catch (const cgx::error& e) {
      code = e.code();
      what = e.what();
    }
    waited = std::chrono::duration<double>(clock::now() - t0).count();
    if (r == 0) {
      stopper.join();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the stop lasts past every peer's limit
      kill(pids[static_cast<std::size_t>(stalled)], SIGCONT);
    }
  }
  std::vector<int> codes(static_cast<std::size_t>(p));
  const int mine = code ? static_cast<int>(*code) : -1;
  MPI_Allgather(&mine, 1, MPI_INT, codes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  INFO("rank " << r << ": " << what);
  if (r != stalled) {
    // Its own limit, or a peer's report of it: either way errc::timeout naming the stopped rank.
    CHECK(mine == static_cast<int>(cgx::errc::timeout));
    CHECK(what.find("rank " + std::to_string(stalled)) != std::string::npos);
    CHECK(waited < 20.0);
  } else {
    // Continued: it throws (the peers' reports: errc::timeout), never returns a result of
    // the call its peers gave up, even where all its data had arrived (comm::shm's rings).
    CHECK((mine == static_cast<int>(cgx::errc::timeout) || mine == static_cast<int>(cgx::errc::peer_failed)));
  }

  // A fresh plan works and is exact.
  cgx::allreduce_plan<float, cgx::quant::none, SRA, X> fresh{X{MPI_COMM_WORLD}, 50000, schedule_always()};
  auto w = integer_inputs<float>(r, 50000);
  const auto want = mpi_sum(w);
  fresh(w.data(), w.size());
  CHECK(std::memcmp(w.data(), want.data(), w.size() * sizeof(float)) == 0);
}
}  // namespace

TEST_CASE("a peer stopped inside a call (SIGSTOP) past the wait limit, comm::mpi") {
  if (world_size() < 2 || !one_node()) return;
  stalled_peer<cgx::comm::mpi>();
}

TEST_CASE("a peer stopped inside a call (SIGSTOP) past the wait limit, comm::shm") {
  if (world_size() < 2 || !one_node()) return;
  stalled_peer<cgx::comm::shm>();
}

TEST_CASE("the default wait limit: 10 minutes, CGX_TIMEOUT_MS replaces it, a bad value is an error") {
  unsetenv("CGX_TIMEOUT_MS");
  CHECK(cgx::plan_options{}.timeout_ms == 600000);
  CHECK(cgx::layerwise_options{}.timeout_ms == 600000);
  setenv("CGX_TIMEOUT_MS", "0", 1);
  CHECK(cgx::plan_options{}.timeout_ms == 0);  // no limit, as asked
  setenv("CGX_TIMEOUT_MS", "2500", 1);
  CHECK(cgx::plan_options{}.timeout_ms == 2500);
  CHECK(cgx::layerwise_options{}.timeout_ms == 2500);
  for (const char* bad : {"ten", "-5", "99999999999", "12ms"}) {
    setenv("CGX_TIMEOUT_MS", bad, 1);
    INFO(bad);
    CHECK(cgx_test::error_code_of([] { (void)cgx::plan_options{}; }) == cgx::errc::invalid_argument);
  }
  unsetenv("CGX_TIMEOUT_MS");
}

// Ranks in calls of different plans (a deadlock in the caller's code): without a limit
// every rank would wait for ever; with the default one (here 2 s from CGX_TIMEOUT_MS, as a
// job would set it; the options are otherwise the defaults) every rank throws errc::timeout.
template <class X>
void crossed_calls() {
  const int r = world_rank(), p = world_size();
  setenv("CGX_TIMEOUT_MS", "2000", 1);
  cgx::plan_options o;  // the default limit
  unsetenv("CGX_TIMEOUT_MS");
  REQUIRE(o.timeout_ms == 2000);
  o.native_below_bytes = 0;  // (a call below it is MPI's own allreduce, which waits as MPI does)
  const std::size_t n = 30000;
  cgx::allreduce_plan<float, Q4, SRA, X> a{X{MPI_COMM_WORLD}, n, o};
  cgx::allreduce_plan<float, Q4, SRA, X> b{X{MPI_COMM_WORLD}, n, o};
  auto v = inputs<float>(r, n);
  const double t0 = MPI_Wtime();
  const auto code = error_code_of([&] {
    if (r == p - 1)
      b(v.data(), n);  // the others call a
    else
      a(v.data(), n);
  });
  const double waited = MPI_Wtime() - t0;
  std::vector<int> codes(static_cast<std::size_t>(p));
  const int mine = code ? static_cast<int>(*code) : -1;
  MPI_Allgather(&mine, 1, MPI_INT, codes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int q = 0; q < p; ++q) {
    INFO("rank " << q);
    CHECK(codes[static_cast<std::size_t>(q)] == static_cast<int>(cgx::errc::timeout));
  }
  CHECK(waited < 20.0);
}

TEST_CASE("a deadlock in the caller's code ends in errc::timeout on every rank by default (comm::mpi)") {
  if (world_size() < 2) return;
  crossed_calls<cgx::comm::mpi>();
}

TEST_CASE("a deadlock in the caller's code ends in errc::timeout on every rank by default (comm::shm)") {
  if (world_size() < 2) return;
  crossed_calls<cgx::comm::shm>();
}
