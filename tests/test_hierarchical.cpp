// hierarchical<Intra, Inter> over emulated nodes of two ranks (node = rank / 2):
// 2 x 2 at four ranks, one node at two, one at one; three ranks make unequal nodes,
// which the plan must refuse with cgx::error on every rank. Then the reducers' use of
// rng.position when nested.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "reducer_checks.hpp"

namespace {
using namespace cgx_test;
using cgx::allreduce_plan;
using cgx::comm::mpi;
using SRA = cgx::comm::scatter_reduce_allgather;

mpi two_per_node() { return mpi{MPI_COMM_WORLD, mpi::nodes{world_rank() / 2}}; }

template <class H, class T, class Q, class IntraR = SRA>
void run_matrix() {
  const int r = world_rank();
  const int p = world_size();
  if (p == 3) {
    bool threw = false;
    try {
      allreduce_plan<T, Q, H, mpi> plan{two_per_node(), 100};
    } catch (const cgx::error& e) {
      threw = e.code() == cgx::errc::communicator;
    }
    CHECK(threw);
    return;
  }
  allreduce_plan<T, Q, H, mpi> plan{two_per_node(), 70000, schedule_always()};
  const int K = IntraR::quantizations(std::min(p, 2)) +
                cgx::comm::ring::quantizations(p / 2 > 0 ? (p + 1) / 2 : 1);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1023}, std::size_t{1025},
                        std::size_t{4099}, std::size_t{65537}}) {
    CAPTURE(n);
    if constexpr (Q::lossless) {
      auto v = integer_inputs<T>(r, n);
      const auto want = mpi_sum(v);
      plan(v.data(), n);
      CHECK(v == want);
    } else {
      auto v = inputs<T>(r, n, 3 * n);
      plan(v.data(), n);
      CHECK(identical_on_all_ranks(v));
      CHECK(outside_generic_bound<T, Q>(v, 3 * n, K) == 0);
    }
  }
}

using H = cgx::comm::hierarchical<SRA, cgx::comm::ring>;
}  // namespace

TEST_CASE("hierarchical<SRA, ring> over emulated nodes of two ranks") {
  run_matrix<H, float, cgx::quant::none>();
  run_matrix<H, double, cgx::quant::none>();
  run_matrix<H, float, cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>>();
  run_matrix<H, float, cgx::quant::maxmin<8, 512, cgx::quant::nearest>>();
  run_matrix<H, double, cgx::quant::maxmin<2, 256, cgx::quant::stochastic>>();
}

TEST_CASE("hierarchical<uncompressed, ring>: exact inside the node, compressed across nodes") {
  using HU = cgx::comm::hierarchical<cgx::comm::uncompressed, cgx::comm::ring>;
  run_matrix<HU, float, cgx::quant::none, cgx::comm::uncompressed>();
  run_matrix<HU, double, cgx::quant::none, cgx::comm::uncompressed>();
  run_matrix<HU, float, cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>, cgx::comm::uncompressed>();
  run_matrix<HU, double, cgx::quant::maxmin<2, 256, cgx::quant::nearest>, cgx::comm::uncompressed>();
}

TEST_CASE("uncompressed reducer: the exact sum in rank order, on every rank") {
  const int r = world_rank();
  using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;  // ignored: nothing is quantized
  allreduce_plan<double, Q, cgx::comm::uncompressed, mpi> plan{mpi{MPI_COMM_WORLD}, 70000, schedule_always()};
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{4099}, std::size_t{65537}}) {
    CAPTURE(n);
    auto v = integer_inputs<double>(r, n);
    const auto want = mpi_sum(v);
    plan(v.data(), n);
    CHECK(v == want);
    auto w = inputs<double>(r, n, n);
    plan(w.data(), n);
    CHECK(identical_on_all_ranks(w));
  }
}

TEST_CASE("hierarchical<tree, SRA> on MPI's own node split (one node here)") {
  const int r = world_rank();
  using HT = cgx::comm::hierarchical<cgx::comm::tree, SRA>;
  using Q = cgx::quant::maxmin<4, 1024, cgx::quant::nearest>;
  allreduce_plan<float, Q, HT, mpi> plan{mpi{MPI_COMM_WORLD}, 5000, schedule_always()};
  auto v = inputs<float>(r, 5000, 8);
  plan(v.data(), v.size());
  CHECK(identical_on_all_ranks(v));
  CHECK(outside_generic_bound<float, Q>(v, 8, cgx::comm::tree::quantizations(world_size())) == 0);
}

TEST_CASE("reducers honour rng.position: a nested call draws its own random numbers") {
  // hierarchical hands each inter-node group a position offset by its chunk's start;
  // a reducer that ignored it would round every group's chunk with the same numbers.
  const int r = world_rank();
  const int p = world_size();
  if (p < 2) return;
  using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
  auto check = [&]<class R>(R) {
    const std::string name = R::name;
    CAPTURE(name);
    mpi x{MPI_COMM_WORLD};
    typename R::template schedule<float, Q, mpi> s{x};
    const std::size_t n = 8192;
    std::vector<std::byte> ws(R::template schedule<float, Q, mpi>::workspace_bytes(n, p));
    cgx::quant::rng_state rng;
    auto a = inputs<float>(r, n, 11), b = a, c = a;
    s.run(a.data(), n, x, ws.data(), rng, {});
    s.run(b.data(), n, x, ws.data(), rng, {});
    rng.position = 4096;
    s.run(c.data(), n, x, ws.data(), rng, {});
    CHECK(a == b);  // same position, same bits
    CHECK(a != c);  // another position, other random numbers
    CHECK(identical_on_all_ranks(c));
  };
  check(cgx::comm::ring{});
  check(SRA{});
  check(cgx::comm::tree{});
}
