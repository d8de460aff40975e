// Issue 17, item 4: several plans made from one communicator (MPI_COMM_WORLD), one after
// the other and overlapped (start()/wait()), without cross-talk: exact sums with
// quant::none on integer inputs, and with a compressed quantizer the same bits as the
// same plans run alone. The transport contract is in concepts.hpp, the tags in
// detail/tags.hpp.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using cgx::comm::mpi;
using cgx::comm::shm;
using SRA = cgx::comm::scatter_reduce_allgather;
using ring = cgx::comm::ring;
using tree = cgx::comm::tree;
using none = cgx::quant::none;
using Q4s = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
constexpr std::size_t n = 20011;

// Overlapped plans make no collective check (it would need MPI from two threads).
cgx::plan_options local() {
  cgx::plan_options o = schedule_always();
  o.check = cgx::checking::local;
  return o;
}
}  // namespace

TEST_CASE("plans from one communicator, one after the other: exact with none, same bits as alone with maxmin") {
  const int r = world_rank();
  {
    cgx::allreduce_plan<float, none, SRA, mpi> a{mpi{MPI_COMM_WORLD}, n, schedule_always()};
    cgx::allreduce_plan<float, none, ring, mpi> b{mpi{MPI_COMM_WORLD}, n, schedule_always()};
    cgx::allreduce_plan<float, none, tree, mpi> c{mpi{MPI_COMM_WORLD}, n, schedule_always()};
    cgx::reduce_scatter_plan<float, none, mpi> d{mpi{MPI_COMM_WORLD}, n, schedule_always()};
    for (int call = 0; call < 3; ++call) {
      auto u = integer_inputs<float>(r + call, n), v = u, w = u, x = u;
      const auto want = mpi_sum(u);
      a(u.data(), n);
      b(v.data(), n);
      c(w.data(), n);
      d(x.data(), n);
      CHECK(u == want);
      CHECK(v == want);
      CHECK(w == want);
      const auto ch = d.chunk_of(n, world_size(), r);
      CHECK(std::equal(x.begin() + static_cast<std::ptrdiff_t>(ch.begin),
                       x.begin() + static_cast<std::ptrdiff_t>(ch.begin + ch.count),
                       want.begin() + static_cast<std::ptrdiff_t>(ch.begin)));
    }
  }
  // Compressed: interleaved calls give each plan the bits it gives alone.
  std::vector<std::vector<float>> alone_a, alone_b, mixed_a, mixed_b;
  {
    cgx::allreduce_plan<float, Q4s, SRA, mpi> a{mpi{MPI_COMM_WORLD}, n, schedule_always()};
    for (int call = 0; call < 3; ++call) {
      auto u = inputs<float>(r, n, 10 + static_cast<std::uint64_t>(call));
      a(u.data(), n);
      alone_a.push_back(u);
    }
  }
  {
    cgx::allreduce_plan<float, Q4s, ring, mpi> b{mpi{MPI_COMM_WORLD}, n, schedule_always()};
    for (int call = 0; call < 3; ++call) {
      auto u = inputs<float>(r, n, 20 + static_cast<std::uint64_t>(call));
      b(u.data(), n);
      alone_b.push_back(u);
    }
  }
  cgx::allreduce_plan<float, Q4s, SRA, mpi> a{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  cgx::allreduce_plan<float, Q4s, ring, mpi> b{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  for (int call = 0; call < 3; ++call) {
    auto u = inputs<float>(r, n, 10 + static_cast<std::uint64_t>(call));
    auto v = inputs<float>(r, n, 20 + static_cast<std::uint64_t>(call));
    b(v.data(), n);
    a(u.data(), n);
    mixed_a.push_back(u);
    mixed_b.push_back(v);
  }
  CHECK(mixed_a == alone_a);
  CHECK(mixed_b == alone_b);
}

TEST_CASE("plans from one communicator, overlapped: two over comm::shm at once, and comm::mpi with comm::shm") {
  const int r = world_rank();
  // Two shared-memory plans in flight at once (no MPI after construction).
  {
    cgx::allreduce_plan<float, none, SRA, shm> a{shm{MPI_COMM_WORLD}, n, local()};
    cgx::allreduce_plan<float, none, ring, shm> b{shm{MPI_COMM_WORLD}, n, local()};
    for (int call = 0; call < 3; ++call) {
      auto u = integer_inputs<float>(r + call, n), v = integer_inputs<float>(r + 7 + call, n);
      const auto want_u = mpi_sum(u), want_v = mpi_sum(v);
      a.start(u.data(), n);
      b.start(v.data(), n);
      b.wait();
      a.wait();
      CHECK(u == want_u);
      CHECK(v == want_v);
    }
  }
  // An MPI plan in flight on its worker thread while a shared-memory plan runs on this
  // one (this thread makes no MPI call until wait(): MPI_THREAD_SERIALIZED suffices).
  {
    cgx::allreduce_plan<float, Q4s, SRA, mpi> a{mpi{MPI_COMM_WORLD}, n, local()};
    cgx::allreduce_plan<float, none, ring, shm> b{shm{MPI_COMM_WORLD}, n, local()};
    cgx::allreduce_plan<float, Q4s, SRA, mpi> alone{mpi{MPI_COMM_WORLD}, n, local()};
    for (int call = 0; call < 3; ++call) {
      auto u = inputs<float>(r, n, 30 + static_cast<std::uint64_t>(call)), ref = u;
      auto v = integer_inputs<float>(r + call, n);
      const auto want_v = mpi_sum(v);
      alone(ref.data(), n);
      a.start(u.data(), n);
      b(v.data(), n);
      a.wait();
      CHECK(u == ref);
      CHECK(v == want_v);
    }
  }
}
