// Issue 32, item 4: several plans driven from several threads of each rank at once, under
// MPI_THREAD_MULTIPLE (this test's main asks for it), beside the caller's own
// MPI_Allreduce on another communicator: what the PyTorch hook's background thread does
// next to user code. Three threads per rank each drive their own plans (own
// communicators, sizes, quantizers, reducers, transports; one a layerwise_plan) through
// `rounds` calls while the main thread runs MPI_Allreduce on a communicator of its own.
// Every result must equal, bit for bit, what the same plans give when the threads' work
// runs one thread after the other (fresh plans, same seeds: the bits depend on the plan's
// call counter, not on timing), and every rank must hold the same bits. A crossed message
// would fail a header check (errc::mismatch) and a deadlock the wait limit (errc::timeout),
// either of which fails the test.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using SRA = cgx::comm::scatter_reduce_allgather;
using mpi = cgx::comm::mpi;
using shm = cgx::comm::shm;

constexpr int rounds = 12;

// FNV-1a over the bytes of a result.
template <class T>
std::uint64_t hash_of(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

cgx::plan_options opts() {
  cgx::plan_options o = schedule_always();
  o.timeout_ms = 60000;  // a deadlock ends as errc::timeout, failing the test, not the job
  return o;
}

// What one thread does: its plans over communicators it is given, `rounds` calls each;
// returns the hash of every result, in call order. Throws what a plan throws.
using work = std::function<std::vector<std::uint64_t>(MPI_Comm a, MPI_Comm b)>;

std::vector<work> works() {
  const int r = world_rank();
  std::vector<work> w;
  // 4-bit SRA over comm::mpi, float.
  w.push_back([r](MPI_Comm a, MPI_Comm) {
    std::vector<std::uint64_t> out;
    cgx::allreduce_plan<float, cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>, SRA, mpi> plan{mpi{a}, 100003, opts()};
    for (int i = 0; i < rounds; ++i) {
      auto v = inputs<float>(r, 100003 - 17 * static_cast<std::size_t>(i), 100 + static_cast<std::uint64_t>(i));
      plan(v.data(), v.size());
      out.push_back(hash_of(v));
    }
    return out;
  });
  // 8-bit ring over comm::shm, double; then a layer-wise plan (2-bit default layers) over comm::mpi.
  w.push_back([r](MPI_Comm a, MPI_Comm b) {
    std::vector<std::uint64_t> out;
    cgx::allreduce_plan<double, cgx::quant::maxmin<8, 512, cgx::quant::nearest>, cgx::comm::ring, shm> plan{shm{a}, 70001,
                                                                                                          opts()};
    const std::vector<cgx::layer> layers = {{0, 30000, false}, {30000, 300, true}, {30300, 19700, false}};
    cgx::layerwise_options lo;
    lo.defaults.bits = 2;
    lo.timeout_ms = 60000;
    cgx::layerwise_plan<float, mpi> lw{mpi{b}, 50000, layers, lo};
    for (int i = 0; i < rounds; ++i) {
      auto v = inputs<double>(r, 70001, 200 + static_cast<std::uint64_t>(i));
      plan(v.data(), v.size());
      out.push_back(hash_of(v));
      auto x = inputs<float>(r, 50000, 300 + static_cast<std::uint64_t>(i));
      lw(x.data(), x.size());
      out.push_back(hash_of(x));
    }
    return out;
  });
  // Uncompressed tree and 2-bit SRA over comm::mpi on one communicator, one after the other.
  w.push_back([r](MPI_Comm a, MPI_Comm) {
    std::vector<std::uint64_t> out;
    cgx::allreduce_plan<float, cgx::quant::none, cgx::comm::tree, mpi> exact{mpi{a}, 20000, opts()};
    cgx::allreduce_plan<float, cgx::quant::maxmin<2, 256, cgx::quant::stochastic>, SRA, mpi> low{mpi{a}, 33333, opts()};
    for (int i = 0; i < rounds; ++i) {
      auto e = integer_inputs<float>(r + i, 20000);
      exact(e.data(), e.size());
      out.push_back(hash_of(e));
      auto v = inputs<float>(r, 33333, 400 + static_cast<std::uint64_t>(i));
      low(v.data(), v.size());
      out.push_back(hash_of(v));
    }
    return out;
  });
  return w;
}

struct comms {
  std::vector<MPI_Comm> a, b;
  MPI_Comm user = MPI_COMM_NULL;
  explicit comms(std::size_t k) : a(k), b(k) {
    for (std::size_t t = 0; t < k; ++t) {
      MPI_Comm_dup(MPI_COMM_WORLD, &a[t]);
      MPI_Comm_dup(MPI_COMM_WORLD, &b[t]);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &user);
  }
  ~comms() {
    for (auto& c : a) MPI_Comm_free(&c);
    for (auto& c : b) MPI_Comm_free(&c);
    MPI_Comm_free(&user);
  }
};
}  // namespace

TEST_CASE("threads: several plans per rank from several threads, beside the caller's MPI_Allreduce") {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  REQUIRE_MESSAGE(provided == MPI_THREAD_MULTIPLE, "this MPI gave thread level " << provided);
  const auto w = works();
  const int r = world_rank(), p = world_size();

  // One thread after the other: the reference bits.
  std::vector<std::vector<std::uint64_t>> serial(w.size());
  {
    comms c(w.size());
    for (std::size_t t = 0; t < w.size(); ++t) serial[t] = w[t](c.a[t], c.b[t]);
  }

  // All at once, with the caller's own MPI_Allreduce running on the main thread.
  std::vector<std::vector<std::uint64_t>> threaded(w.size());
  std::vector<std::string> errors(w.size());
  long long user_sum = 0;
  int user_rounds = 0;
  {
    comms c(w.size());
    std::atomic<int> running{static_cast<int>(w.size())};
    std::vector<std::thread> th;
    for (std::size_t t = 0; t < w.size(); ++t)
      th.emplace_back([&, t] {
        try {
          threaded[t] = w[t](c.a[t], c.b[t]);
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
        running.fetch_sub(1);
      });
    // The caller's reductions: a fixed number (every rank must make the same calls), at
    // least some of them while the threads run.
    for (; user_rounds < 200; ++user_rounds) {
      long long x = r + user_rounds, s = 0;
      MPI_Allreduce(&x, &s, 1, MPI_LONG_LONG, MPI_SUM, c.user);
      user_sum += s;
    }
    for (auto& t : th) t.join();
  }
  for (std::size_t t = 0; t < w.size(); ++t) {
    INFO("thread " << t << ": " << errors[t]);
    CHECK(errors[t].empty());
    CHECK(threaded[t] == serial[t]);
  }
  // The caller's own reductions were exact: sum over rounds i of (p(p-1)/2 + p i).
  long long want = 0;
  for (int i = 0; i < user_rounds; ++i) want += static_cast<long long>(p) * (p - 1) / 2 + static_cast<long long>(p) * i;
  CHECK(user_sum == want);
  // Every rank holds the same bits.
  std::vector<std::uint64_t> flat;
  for (const auto& s : threaded) flat.insert(flat.end(), s.begin(), s.end());
  CHECK(identical_on_all_ranks(flat));
}
