// The correctness matrix of the reducers over the MPI transport: every reducer x
// quantizer (passthrough, 8, 4, 2 bits) x counts including 0, 1, primes and
// non-multiples of the bucket, at whatever rank count the test runs with. Checks:
// identical bits on every rank, a per-element error bound that holds for any schedule
// given its number of quantizations, passthrough == MPI_Allreduce on integer data.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "mpi_test_util.hpp"
#include "reducer_checks.hpp"

namespace {

using namespace cgx_test;
using cgx::allreduce_plan;
using cgx::comm::mpi;

const std::size_t counts[] = {0, 1, 2, 3, 7, 13, 1000, 1023, 1024, 1025, 4099, 65537};

template <class T, class Q, class R, class X>
void lossy_matrix() {
  const int r = world_rank();
  allreduce_plan<T, Q, R, X> plan{X{MPI_COMM_WORLD}, 65537, schedule_always()};
  for (std::size_t n : counts) {
    CAPTURE(n);
    auto v = inputs<T>(r, n, n + 1);
    plan(v.data(), n);
    CHECK(identical_on_all_ranks(v));
    CHECK(outside_generic_bound<T, Q>(v, n + 1, R::quantizations(world_size())) == 0);
  }
}

template <class T, class R, class X>
void passthrough_exact() {
  const int r = world_rank();
  allreduce_plan<T, cgx::quant::none, R, X> plan{X{MPI_COMM_WORLD}, 65537, schedule_always()};
  for (std::size_t n : counts) {
    CAPTURE(n);
    auto v = integer_inputs<T>(r, n);
    const auto want = mpi_sum(v);
    plan(v.data(), n);
    CHECK(v == want);
  }
}

template <class R, class X>
void matrix_for() {
  passthrough_exact<float, R, X>();
  passthrough_exact<double, R, X>();
  lossy_matrix<float, cgx::quant::maxmin<8, 1024, cgx::quant::nearest>, R, X>();
  lossy_matrix<float, cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>, R, X>();
  lossy_matrix<float, cgx::quant::maxmin<2, 128, cgx::quant::stochastic>, R, X>();
  lossy_matrix<double, cgx::quant::maxmin<4, 512, cgx::quant::nearest>, R, X>();
}

using cgx::comm::ring;
using cgx::comm::shm;
using cgx::comm::tree;
using SRA = cgx::comm::scatter_reduce_allgather;

}  // namespace

TEST_CASE("reducer matrix: scatter_reduce_allgather over mpi") { matrix_for<SRA, mpi>(); }
TEST_CASE("reducer matrix: ring over mpi") { matrix_for<ring, mpi>(); }
TEST_CASE("reducer matrix: tree over mpi") { matrix_for<tree, mpi>(); }
TEST_CASE("reducer matrix: scatter_reduce_allgather over shm") { matrix_for<SRA, shm>(); }
TEST_CASE("reducer matrix: ring over shm") { matrix_for<ring, shm>(); }
TEST_CASE("reducer matrix: tree over shm") { matrix_for<tree, shm>(); }

TEST_CASE("quantizations per element of each schedule") {
  CHECK(cgx::comm::scatter_reduce_allgather::quantizations(1) == 0);
  CHECK(cgx::comm::scatter_reduce_allgather::quantizations(4) == 2);
  CHECK(cgx::comm::ring::quantizations(4) == 4);
  CHECK(cgx::comm::tree::quantizations(4) == 3);  // 2 halving steps + the sum
  CHECK(cgx::comm::tree::quantizations(3) == 3);  // fold + 1 halving step + the sum
  CHECK(cgx::comm::tree::quantizations(8) == 4);
  CHECK(cgx::comm::tree::quantizations(6) == 4);
}

namespace {
// SRA's pipelined run() (chunks cut into pieces above 2 MiB per chunk) must give the
// bits of the unpipelined scatter_reduce() + allgather(): same buckets, same random
// positions, same summation order.
template <class Q, class X>
void pipelined_equals_unpipelined() {
  const int r = world_rank();
  const int p = world_size();
  using S = SRA::schedule<float, Q, X>;
  X x{MPI_COMM_WORLD};
  S sched{x};
  // 12 MiB + a partial bucket: chunks of 3..12 MiB, so 3..8 pieces.
  const std::size_t n = (std::size_t{3} << 20) + 1234;
  if (p > 1) CHECK(S::pieces(n, p) > 1);
  std::vector<std::byte> ws(S::workspace_bytes(n, p));
  cgx::quant::rng_state rng;
  rng.seed = 77;
  rng.counter = 5;
  auto a = inputs<float>(r, n, 99);
  auto b = a;
  sched.run(a.data(), n, x, ws.data(), rng, {});
  sched.scatter_reduce(b.data(), n, x, ws.data(), rng, {});
  sched.allgather(b.data(), n, x, ws.data(), {});
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
  CHECK(identical_on_all_ranks(a));
  CHECK(outside_generic_bound<float, Q>(a, 99, SRA::quantizations(p)) == 0);
}
}  // namespace

TEST_CASE("scatter_reduce_allgather: the pipelined run() has the bits of the unpipelined phases") {
  pipelined_equals_unpipelined<cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>, mpi>();
  pipelined_equals_unpipelined<cgx::quant::maxmin<2, 128, cgx::quant::nearest>, mpi>();
  pipelined_equals_unpipelined<cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>, shm>();
}

namespace {
// comm::mpi behind the transport concept only, with or without the optional
// progress() hook (which counts its calls).
template <bool WithProgress>
struct forwarding {
  using request = mpi::request;
  mpi inner;
  int calls = 0;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  request isend(const void* b, std::size_t bytes, int peer, int tag) { return inner.isend(b, bytes, peer, tag); }
  request irecv(void* b, std::size_t bytes, int peer, int tag) { return inner.irecv(b, bytes, peer, tag); }
  void wait_all(std::span<request> q) { inner.wait_all(q); }
  void max_all(std::span<std::int64_t> v) { inner.max_all(v); }
  void progress()
    requires WithProgress
  {
    ++calls;
    inner.progress();
  }
};
static_assert(cgx::transport<forwarding<false>> && cgx::transport<forwarding<true>>);
}  // namespace

TEST_CASE("scatter_reduce_allgather: calls the transport's progress() between pieces, and it changes no bits") {
  using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
  const int p = world_size();
  const std::size_t n = (std::size_t{3} << 20) + 1234;  // several pieces per chunk
  forwarding<true> with{mpi{MPI_COMM_WORLD}};
  forwarding<false> without{mpi{MPI_COMM_WORLD}};
  SRA::schedule<float, Q, forwarding<true>> s1{with};
  SRA::schedule<float, Q, forwarding<false>> s2{without};
  std::vector<std::byte> ws(std::max(decltype(s1)::workspace_bytes(n, p), decltype(s2)::workspace_bytes(n, p)));
  cgx::quant::rng_state rng;
  rng.seed = 5;
  auto a = inputs<float>(world_rank(), n, 17);
  auto b = a;
  s1.run(a.data(), n, with, ws.data(), rng, {});
  s2.run(b.data(), n, without, ws.data(), rng, {});
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
  if (p > 1) CHECK(with.calls >= decltype(s1)::pieces(n, p) * (p - 1));  // one per piece sent
  else CHECK(with.calls == 0);
}
