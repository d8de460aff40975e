// The rotated max-min codec (cgx::quant::rotated, issue 51) in allreduce plans over MPI:
// SRA, ring, tree and hierarchical schedules, float and double, counts with partial
// buckets. Every rank must end with the same bits; each global bucket's error must stay
// within the schedule's number of quantizations times the L2 bound of one rotated
// quantization (rotated.hpp); on spiky data the rotated codec must lose less than plain
// maxmin of the same width in the same schedule; ranks mixing rotated and plain plans
// are refused (plan signature); allgather_plan and reduce_scatter_plan run it too.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using cgx::comm::mpi;
using cgx::quant::maxmin;
using cgx::quant::nearest;
using cgx::quant::rotated;
using cgx::quant::stochastic;
using SRA = cgx::comm::scatter_reduce_allgather;
using ring = cgx::comm::ring;
using tree = cgx::comm::tree;
template <class I, class O>
using H = cgx::comm::hierarchical<I, O>;

/// Rank r's values: Gaussian with one outlier in 61, 30 times larger, and an offset.
template <class T>
std::vector<T> spiky(int r, std::size_t n, int call) {
  std::mt19937_64 g(static_cast<std::uint64_t>(1000 * r + 7 * call + 1));
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(d(g) * (i % 61 == 30 ? 30.0 : 1.0) + 0.1 * r);
  return x;
}

/// Transport for schedule R: nodes of two ranks for hierarchical (MPI's own split when
/// the ranks do not pair up), the world otherwise.
template <class R>
inline constexpr bool is_hierarchical = false;
template <class I, class O>
inline constexpr bool is_hierarchical<H<I, O>> = true;
template <class R>
mpi make_transport() {
  if constexpr (is_hierarchical<R>) {
    if (world_size() % 2 == 0) return mpi{MPI_COMM_WORLD, mpi::nodes{world_rank() / 2}};
  }
  return mpi{MPI_COMM_WORLD};
}

/// Runs allreduce_plan<T, Q, R> on `counts`; checks the same bits on every rank and, per
/// global bucket b of r_b values, ||result_b - sum_b||_2 <= q sqrt(2) sqrt(r_b) S_b / L
/// (1.1), q = R::quantizations(p), S_b = sum over ranks of ||x_{rank,b}||_2, L = 2^bits - 1,
/// twice that for stochastic rounding. One quantization of values z adds at most
/// sqrt(r) u_rot / 2 in L2 (rotated.hpp), and u_rot <= 2 max|F z| / L <= 2 sqrt(2) ||z|| / L;
/// the partial sums a schedule quantizes have norms at most S_b plus the (small) errors
/// already in them: the factor 1.1. Returns the squared error over every call.
template <class T, class Q, class R>
double run(const std::vector<std::size_t>& counts) {
  CAPTURE(R::name);
  CAPTURE(Q::bits);
  CAPTURE(Q::bucket_size);
  CAPTURE(sizeof(T));
  const int p = world_size();
  const int me = world_rank();
  std::size_t most = 0;
  for (auto n : counts) most = std::max(most, n);
  cgx::allreduce_plan<T, Q, R, mpi> plan{make_transport<R>(), most, schedule_always()};
  constexpr std::size_t B = Q::bucket_size;
  const double L = static_cast<double>((1u << Q::bits) - 1);
  const double k = std::is_same_v<typename Q::rounding, stochastic> ? 2.0 : 1.0;
  const int q = R::quantizations(p);
  double total = 0;
  int call = 0;
  for (const std::size_t n : counts) {
    CAPTURE(n);
    auto x = spiky<T>(me, n, call++);
    std::vector<double> xd(x.begin(), x.end()), sum(n);
    MPI_Allreduce(xd.data(), sum.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const std::size_t nb = (n + B - 1) / B;
    std::vector<double> norms(nb, 0.0), S(nb);
    for (std::size_t i = 0; i < n; ++i) norms[i / B] += xd[i] * xd[i];
    for (auto& v : norms) v = std::sqrt(v);
    MPI_Allreduce(norms.data(), S.data(), static_cast<int>(nb), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    plan(x.data(), n);
    CHECK(identical_on_all_ranks(x));
    std::size_t bad = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t first = b * B, r = std::min(B, n - first);
      double e2 = 0;
      for (std::size_t i = first; i < first + r; ++i) e2 += (x[i] - sum[i]) * (x[i] - sum[i]);
      total += e2;
      // + the float rounding of p additions of values up to S_b
      const double bound = q * k * std::sqrt(2.0) * std::sqrt(double(r)) * S[b] / L * 1.1 +
                           1e-5 * (p + 1) * S[b] * (sizeof(T) == 4 ? 1.0 : 1e-8);
      if (std::sqrt(e2) > bound) ++bad;
    }
    CHECK_MESSAGE(bad == 0, bad << " of " << nb << " buckets above the bound");
  }
  return total;
}
}  // namespace

TEST_CASE("rotated allreduce over MPI: SRA, ring, tree, hierarchical; the same bits on every rank, within the bound") {
  const std::vector<std::size_t> counts{1, 1000, 12345};
  using R8 = rotated<maxmin<8, 128, nearest>>;
  using R4 = rotated<maxmin<4, 1024, stochastic>>;
  using R2 = rotated<maxmin<2, 128, nearest>>;
  run<float, R8, SRA>(counts);
  run<float, R4, SRA>(counts);
  run<float, R2, ring>(counts);
  run<float, R8, ring>(counts);
  run<float, R8, tree>(counts);
  run<double, R4, tree>(counts);
  run<float, R8, H<SRA, ring>>(counts);
  run<float, R4, H<tree, SRA>>(counts);
}

TEST_CASE("rotated allreduce over MPI: on spiky data the rotated codec loses less than plain maxmin") {
  if (world_size() == 1) return;  // nothing is quantized on one rank
  const std::vector<std::size_t> counts{100000};
  const double plain2 = run<float, maxmin<2, 128, nearest>, SRA>(counts);
  const double rot2 = run<float, rotated<maxmin<2, 128, nearest>>, SRA>(counts);
  const double plain4 = run<float, maxmin<4, 1024, stochastic>, ring>(counts);
  const double rot4 = run<float, rotated<maxmin<4, 1024, stochastic>>, ring>(counts);
  if (world_rank() == 0)
    MESSAGE("squared error plain / rotated: 2-bit SRA " << plain2 / rot2 << ", 4-bit ring " << plain4 / rot4);
  CHECK(rot2 < 0.5 * plain2);
  CHECK(rot4 < 0.5 * plain4);
}

// Rank 0 builds a plan with codec Q0, the others with Q1: every rank's first call throws
// errc::mismatch and leaves its buffer as it was.
template <class Q0, class Q1>
void refused_when_mixed() {
  const int r = world_rank();
  if (world_size() == 1) return;
  auto v = spiky<float>(r, 3000, 0);
  const auto before = v;
  const auto code = [&](auto&& plan) { return error_code_of([&] { plan(v.data(), 3000); }); };
  if (r == 0) {
    cgx::allreduce_plan<float, Q0, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 3000, checked()};
    CHECK(code(plan) == cgx::errc::mismatch);
  } else {
    cgx::allreduce_plan<float, Q1, SRA, mpi> plan{mpi{MPI_COMM_WORLD}, 3000, checked()};
    CHECK(code(plan) == cgx::errc::mismatch);
  }
  CHECK(v == before);
}

TEST_CASE("ranks mixing the rotated codec and plain maxmin of the same width: cgx::error on every rank") {
  refused_when_mixed<rotated<maxmin<4, 1024, stochastic>>, maxmin<4, 1024, stochastic>>();
}

TEST_CASE("ranks with rotated codecs of different seeds: cgx::error on every rank") {
  refused_when_mixed<rotated<maxmin<4, 1024, stochastic>, 12345>, rotated<maxmin<4, 1024, stochastic>>>();
}

TEST_CASE("rotated codec in allgather_plan and reduce_scatter_plan: the codec's own bits, the same on every rank") {
  // Nearest rounding: the encoding does not depend on the random key, so every rank can
  // compute what rank q's block must decode to: decompress(compress(x_q)) (on one rank
  // the plan copies).
  using R = rotated<maxmin<3, 256, nearest>>;
  const int p = world_size();
  const int me = world_rank();
  const std::size_t block = 1000;
  cgx::allgather_plan<float, R, mpi> ag{mpi{MPI_COMM_WORLD}, block, schedule_always()};
  const auto in = spiky<float>(me, block, 5);
  std::vector<float> out(block * static_cast<std::size_t>(p));
  ag(in.data(), block, out.data());
  std::vector<std::byte> w(R::compressed_bytes<float>(block));
  std::vector<float> want(block);
  std::size_t bad = 0;
  for (int q = 0; q < p; ++q) {
    const auto xq = spiky<float>(q, block, 5);
    R::compress(xq.data(), block, w.data());
    R::decompress(w.data(), block, want.data());
    if (p == 1) want = xq;  // one rank: nothing is compressed
    bad += std::memcmp(want.data(), out.data() + static_cast<std::size_t>(q) * block, block * sizeof(float)) != 0;
  }
  CHECK(bad == 0);
  CHECK(identical_on_all_ranks(out));
  // reduce_scatter: each rank's chunk is what the allreduce leaves there.
  const std::size_t n = 12345;
  cgx::reduce_scatter_plan<float, R, mpi> rs{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  cgx::allreduce_plan<float, R, SRA, mpi> ar{mpi{MPI_COMM_WORLD}, n, schedule_always()};
  auto a = spiky<float>(me, n, 6), b = a;
  rs(a.data(), n);
  ar(b.data(), n);
  const auto ch = rs.chunk_of(n, p, me);
  CHECK(std::memcmp(a.data() + ch.begin, b.data() + ch.begin, ch.count * sizeof(float)) == 0);
}
