// hierarchical<Intra, Inter> over emulated nodes of two ranks (node = rank / 2):
// 2 x 2 at four ranks, 3 x 2 at six, one node at two, one at one; three ranks make
// unequal nodes, which the plan must refuse with cgx::error on every rank. Then two
// nodes of p/2 ranks (the crossed exchange: 2 x 2 at four ranks, 2 x 3 at six with one
// group left to Inter), and the reducers' use of rng.position when nested.
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

// One call of `plan` on n values: the exact sum for a lossless Q, else the same bits on
// every rank within the bound of K quantizations.
template <class T, class Q, class Plan>
void check_call(Plan& plan, std::size_t n, int K, std::uint64_t salt) {
  const int r = world_rank();
  if constexpr (Q::lossless) {
    auto v = integer_inputs<T>(r, n);
    const auto want = mpi_sum(v);
    plan(v.data(), n);
    CHECK(v == want);
  } else {
    auto v = inputs<T>(r, n, salt);
    plan(v.data(), n);
    CHECK(identical_on_all_ranks(v));
    CHECK(outside_generic_bound<T, Q>(v, salt, K) == 0);
  }
}

template <class H, class T, class Q, class IntraR = SRA>
void run_matrix() {
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
    check_call<T, Q>(plan, n, K, 3 * n);
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

namespace {
// Two nodes of p/2 ranks each (node = rank / (p/2)): the groups of local ranks
// 0 .. 2*floor(p/4)-1 are crossed, a last odd one runs Inter.
template <class H, class T, class Q>
void run_two_nodes(const std::vector<std::size_t>& sizes) {
  const int r = world_rank();
  const int p = world_size();
  if (p % 2 != 0) return;
  const int L = p / 2;
  const auto two_nodes = [&] { return mpi{MPI_COMM_WORLD, mpi::nodes{r / L}}; };
  using S = typename H::template schedule<T, Q, mpi>;
  auto x = two_nodes();
  S s{x};
  CHECK(s.nodes() == 2);
  const int K = s.quantizations();
  allreduce_plan<T, Q, H, mpi> plan{two_nodes(), sizes.back(), schedule_always()};
  for (std::size_t n : sizes) {
    CAPTURE(n);
    // Crossed: large chunks, and a partner group (local ranks 0 .. L - 1 - L % 2).
    const bool large = cgx::comm::largest_chunk(n, L, cgx::comm::granule_of<Q>) * sizeof(T) >= S::cross_min_bytes;
    CHECK(s.crossed(n) == (large && r % L < L - L % 2));
    check_call<T, Q>(plan, n, K, 5 * n);
  }
}
}  // namespace

TEST_CASE("hierarchical on two nodes crosses its groups: one direction per pair at a time") {
  using HU = cgx::comm::hierarchical<cgx::comm::uncompressed, cgx::comm::ring>;
  using HS = cgx::comm::hierarchical<SRA, SRA>;
  using HT = cgx::comm::hierarchical<cgx::comm::uncompressed, cgx::comm::tree>;
  using HX = cgx::comm::hierarchical<cgx::comm::uncompressed, cgx::comm::uncompressed>;
  // The largest size is crossed in pieces (chunks of 2 MiB and more) on 2 x 2 and 2 x 3;
  // the others run Inter.
  const std::vector<std::size_t> sizes{0, 1, 1023, 4099, 65537, (std::size_t{3} << 20) + 4099};
  run_two_nodes<HU, float, cgx::quant::none>(sizes);
  run_two_nodes<HU, float, cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>>(sizes);
  run_two_nodes<HU, double, cgx::quant::maxmin<2, 256, cgx::quant::nearest>>(sizes);
  run_two_nodes<HS, float, cgx::quant::maxmin<8, 512, cgx::quant::stochastic>>(sizes);
  run_two_nodes<HT, float, cgx::quant::maxmin<4, 1024, cgx::quant::nearest>>(sizes);
  run_two_nodes<HX, double, cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>>(sizes);  // raw across nodes
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
