// Two threads calling one plan at the same time: the second caller gets
// cgx::error(errc::invalid_argument) at once, before any communication, and the first
// call runs to its correct result. Every kind of plan with a host call entry point.
//
// Each round, on every rank, two threads race into one call of the plan. The plans run
// over `gated`, a comm::mpi whose first collective of the round (the plan's collective
// argument check, made before any data moves) holds the call that got there until the
// other thread's call has returned: so the two calls overlap on every rank, whichever
// thread wins, and a plan that lets both in has both threads inside the transport at once
// (the hold then times out and the test fails, instead of hanging). The loser makes no
// MPI call, so MPI_THREAD_SERIALIZED (the test main's level) suffices.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using none = cgx::quant::none;
using SRA = cgx::comm::scatter_reduce_allgather;

// What the two threads of a round share.
struct round_gate {
  std::mutex m;
  std::condition_variable cv;
  bool armed = false;       // the next max_all holds until `returned`
  int returned = 0;         // calls of this round that have returned (or thrown)
  bool hold_timed_out = false;

  void arm() {
    std::lock_guard<std::mutex> l(m);
    armed = true;
    returned = 0;
  }
  void call_returned() {
    {
      std::lock_guard<std::mutex> l(m);
      ++returned;
    }
    cv.notify_all();
  }
  // The first collective of the round waits (at most 5 s) for the other call to return.
  void hold() {
    std::unique_lock<std::mutex> l(m);
    if (!armed) return;
    armed = false;
    if (!cv.wait_for(l, std::chrono::seconds(5), [&] { return returned >= 1; })) hold_timed_out = true;
  }
};

// comm::mpi, with round_gate::hold() before each max_all. No native allreduce: every
// call runs the plan's schedule.
class gated {
 public:
  using request = cgx::comm::mpi::request;
  gated(MPI_Comm c, round_gate* g) : x_(c), g_(g) {}
  int rank() const { return x_.rank(); }
  int size() const { return x_.size(); }
  request isend(const void* b, std::size_t n, int peer, int tag) { return x_.isend(b, n, peer, tag); }
  request irecv(void* b, std::size_t n, int peer, int tag) { return x_.irecv(b, n, peer, tag); }
  void wait_all(std::span<request> r) { x_.wait_all(r); }
  void max_all(std::span<std::int64_t> v) {
    g_->hold();
    x_.max_all(v);
  }

 private:
  cgx::comm::mpi x_;
  round_gate* g_;
};

enum class outcome { none, ran, refused, other_error };

// Runs `rounds` rounds of two threads calling `call()` at once; after each, `verify()`
// checks the winner's result on this rank (it makes no MPI call: with start(), the
// reduction may still run on the plan's thread until verify() waits for it). Checks that
// exactly one call ran and the other was refused with invalid_argument, on every rank,
// every round.
void race(round_gate& g, int rounds, const std::function<void()>& prepare, const std::function<void()>& call,
          const std::function<bool()>& verify) {
  int bad_rounds = 0, timeouts = 0, wrong_results = 0;
  std::string example;
  for (int round = 0; round < rounds; ++round) {
    prepare();
    g.arm();
    outcome out[2] = {outcome::none, outcome::none};
    std::string what[2];
    std::barrier start(2);
    auto body = [&](int t) {
      start.arrive_and_wait();
      try {
        call();
        out[t] = outcome::ran;
      } catch (const cgx::error& e) {
        out[t] = e.code() == cgx::errc::invalid_argument ? outcome::refused : outcome::other_error;
        what[t] = e.what();
      }
      g.call_returned();
    };
    std::thread a(body, 0), b(body, 1);
    a.join();
    b.join();
    const int ran = (out[0] == outcome::ran) + (out[1] == outcome::ran);
    const int refused = (out[0] == outcome::refused) + (out[1] == outcome::refused);
    bool ok = ran == 1 && refused == 1 && !g.hold_timed_out;
    if (ok) {
      const std::string& msg = out[0] == outcome::refused ? what[0] : what[1];
      ok = msg.find("two threads at once") != std::string::npos;
      if (!ok && example.empty()) example = msg;
    }
    timeouts += g.hold_timed_out ? 1 : 0;
    g.hold_timed_out = false;
    const bool right = verify();
    // Only the winner's call communicated: the ranks are still in step. Stop at the first
    // bad round on any rank (a plan without the guard has both threads in MPI).
    int mine[2] = {ok ? 0 : 1, right ? 0 : 1}, any[2] = {0, 0};
    MPI_Allreduce(mine, any, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    wrong_results += mine[1];
    if (any[0] != 0) {
      bad_rounds += mine[0];
      break;
    }
  }
  INFO("refusal message: " << example);
  CHECK(timeouts == 0);
  CHECK(bad_rounds == 0);
  CHECK(wrong_results == 0);
}

constexpr int rounds = 40;

// Integer-valued inputs: quant::none sums them exactly on every schedule.
std::vector<float> exact_sum(std::size_t n) {
  std::vector<float> s(n, 0.0f);
  for (int r = 0; r < world_size(); ++r) {
    const auto x = integer_inputs<float>(r, n);
    for (std::size_t i = 0; i < n; ++i) s[i] += x[i];
  }
  return s;
}

cgx::plan_options checked_schedule() { return checked(schedule_always()); }
}  // namespace

TEST_CASE("threads: allreduce_plan called from two threads at once") {
  round_gate g;
  const std::size_t n = 5000;
  cgx::allreduce_plan<float, none, SRA, gated> plan{gated{MPI_COMM_WORLD, &g}, n, checked_schedule()};
  std::vector<float> buf;
  const auto want = exact_sum(n);
  race(g, rounds, [&] { buf = integer_inputs<float>(world_rank(), n); }, [&] { plan(buf.data(), n); },
       [&] { return buf == want; });
}

TEST_CASE("threads: allreduce_plan::start from two threads at once, then wait") {
  round_gate g;
  const std::size_t n = 5000;
  cgx::allreduce_plan<float, none, SRA, gated> plan{gated{MPI_COMM_WORLD, &g}, n, checked_schedule()};
  std::vector<float> buf;
  const auto want = exact_sum(n);
  race(g, rounds, [&] { buf = integer_inputs<float>(world_rank(), n); }, [&] { plan.start(buf.data(), n); },
       [&] {
         // start() while in flight and a blocking call while in flight are refused too.
         bool ok = plan.in_flight();
         ok = ok && error_code_of([&] { plan.start(buf.data(), n); }) == cgx::errc::invalid_argument;
         ok = ok && error_code_of([&] { plan(buf.data(), n); }) == cgx::errc::invalid_argument;
         plan.wait();
         return ok && !plan.in_flight() && buf == want;
       });
}

TEST_CASE("threads: allreduce_plan::wait from two threads at once") {
  // No gate here: both threads call wait() on a started reduction; one joins it (and
  // may find it finished), the other is refused or finds nothing in flight. Neither
  // hangs, and the result is right.
  round_gate g;
  const std::size_t n = 5000;
  cgx::allreduce_plan<float, none, SRA, gated> plan{gated{MPI_COMM_WORLD, &g}, n, checked_schedule()};
  const auto want = exact_sum(n);
  int wrong = 0;
  for (int round = 0; round < 10; ++round) {
    auto buf = integer_inputs<float>(world_rank(), n);
    plan.start(buf.data(), n);
    std::barrier start(2);
    std::atomic<int> other_errors{0};
    auto body = [&] {
      start.arrive_and_wait();
      try {
        plan.wait();
      } catch (const cgx::error& e) {
        if (e.code() != cgx::errc::invalid_argument) ++other_errors;
      }
    };
    std::thread a(body), b(body);
    a.join();
    b.join();
    plan.wait();  // no-op unless both threads were refused (impossible) or wait threw
    if (other_errors != 0 || plan.in_flight() || buf != want) ++wrong;
  }
  CHECK(wrong == 0);
}

TEST_CASE("threads: reduce_scatter, allgather and broadcast plans called from two threads at once") {
  round_gate g;
  const std::size_t n = 3000;
  const int p = world_size(), me = world_rank();
  const auto want = exact_sum(n);
  std::vector<float> buf;
  {
    cgx::reduce_scatter_plan<float, none, gated> rs{gated{MPI_COMM_WORLD, &g}, n, checked_schedule()};
    race(g, rounds, [&] { buf = integer_inputs<float>(me, n); }, [&] { rs(buf.data(), n); },
         [&] {
           const auto c = rs.my_chunk(n);
           bool ok = true;
           for (std::size_t i = c.begin; i < c.begin + c.count; ++i) ok = ok && buf[i] == want[i];
           return ok;
         });
  }
  {
    cgx::allgather_plan<float, none, gated> ag{gated{MPI_COMM_WORLD, &g}, n, checked_schedule()};
    std::vector<float> out;
    race(g, rounds,
         [&] {
           buf = integer_inputs<float>(me, n);
           out.assign(n * static_cast<std::size_t>(p), 0.0f);
         },
         [&] { ag(buf.data(), n, out.data()); },
         [&] {
           bool ok = true;
           for (int r = 0; r < p; ++r) {
             const auto x = integer_inputs<float>(r, n);
             ok = ok && std::equal(x.begin(), x.end(), out.begin() + static_cast<std::ptrdiff_t>(r * n));
           }
           return ok;
         });
  }
  {
    cgx::broadcast_plan<float, none, gated> bc{gated{MPI_COMM_WORLD, &g}, n, checked_schedule()};
    const int root = p - 1;
    race(g, rounds, [&] { buf = integer_inputs<float>(me, n); }, [&] { bc(buf.data(), n, root); },
         [&] { return buf == integer_inputs<float>(root, n); });
  }
}

TEST_CASE("threads: error_bounded_plan and layerwise_plan called from two threads at once") {
  round_gate g;
  const std::size_t n = 4000;
  const int me = world_rank();
  std::vector<double> buf;
  {
    using Q = cgx::quant::error_bounded<1024>;
    cgx::error_bounded_plan<double, Q, SRA, gated> eb{gated{MPI_COMM_WORLD, &g}, n, checked_schedule()};
    std::vector<double> exact(n, 0.0);
    for (int r = 0; r < world_size(); ++r) {
      const auto x = inputs<double>(r, n);
      for (std::size_t i = 0; i < n; ++i) exact[i] += x[i];
    }
    const double bound = 1e-3;
    race(g, rounds, [&] { buf = inputs<double>(me, n); }, [&] { eb(buf.data(), n, bound); },
         [&] {
           bool ok = true;
           for (std::size_t i = 0; i < n; ++i) ok = ok && std::abs(buf[i] - exact[i]) <= bound * (1 + 1e-9);
           return ok;
         });
  }
  {
    const std::vector<cgx::layer> layers{{0, 1000, false}, {1000, 3000, false}};
    cgx::layerwise_options o;
    o.check = cgx::checking::collective;
    cgx::layerwise_plan<float, gated> lw{gated{MPI_COMM_WORLD, &g}, n, layers, o};
    lw.set_settings({{0, 1024}, {0, 1024}});  // uncompressed: the exact sum
    const auto want = exact_sum(n);
    std::vector<float> fbuf;
    race(g, rounds, [&] { fbuf = integer_inputs<float>(me, n); }, [&] { lw(fbuf.data(), n); },
         [&] { return fbuf == want; });
  }
}
