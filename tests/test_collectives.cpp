// reduce_scatter_plan, allgather_plan and broadcast_plan over MPI and shared memory,
// with quant::none and maxmin, at counts including 0, 1 and counts not divisible by the
// rank count: reduce_scatter gives each rank its chunk of the allreduce, bit for bit;
// allgather and broadcast give every rank the same bits, exact with quant::none and
// within one quantization otherwise; bad input throws and leaves buffers untouched.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;
using cgx::comm::mpi;
using cgx::comm::shm;
using SRA = cgx::comm::scatter_reduce_allgather;
using none = cgx::quant::none;
using Q8n = cgx::quant::maxmin<8, 1024, cgx::quant::nearest>;
using Q4s = cgx::quant::maxmin<4, 128, cgx::quant::stochastic>;

const std::size_t counts[] = {0, 1, 3, 7, 1000, 1025, 4099, 20011};
constexpr std::size_t cap = 20011;

// Values within one quantization of `want`, bucket by bucket (exact for none).
template <class T, class Q>
std::size_t outside_one_quantization(const T* got, const T* want, std::size_t n) {
  std::size_t bad = 0;
  const std::size_t B = Q::bucket_size > 0 ? Q::bucket_size : 1;
  for (std::size_t b0 = 0; b0 < n; b0 += B) {
    const std::size_t b1 = std::min(n, b0 + B);
    const auto [lo, hi] = std::minmax_element(want + b0, want + b1);
    double tol = 0;
    if constexpr (!Q::lossless) {
      const double c = std::is_same_v<typename Q::rounding, cgx::quant::nearest> ? 0.5 : 1.0;
      const double mag = std::max(std::fabs(static_cast<double>(*lo)), std::fabs(static_cast<double>(*hi)));
      tol = c * (static_cast<double>(*hi) - static_cast<double>(*lo)) / ((1 << Q::bits) - 1) +
            8 * std::numeric_limits<T>::epsilon() * mag;
    }
    for (std::size_t i = b0; i < b1; ++i)
      if (!(std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])) <= tol)) ++bad;
  }
  return bad;
}

template <class T, class Q, class X>
void reduce_scatter_matches_allreduce() {
  const int p = world_size();
  const int me = world_rank();
  cgx::reduce_scatter_plan<T, Q, X> rs{X{MPI_COMM_WORLD}, cap, schedule_always()};
  cgx::allreduce_plan<T, Q, SRA, X> ar{X{MPI_COMM_WORLD}, cap, schedule_always()};
  std::size_t covered_total = 0;
  for (std::size_t n : counts) {
    CAPTURE(n);
    const auto x = Q::lossless ? integer_inputs<T>(me, n) : inputs<T>(me, n, n);
    auto a = x, b = x;
    rs(a.data(), n);
    ar(b.data(), n);
    const cgx::comm::chunk c = rs.my_chunk(n);
    CHECK(c.begin + c.count <= n);
    CHECK((c.count == 0 || std::memcmp(a.data() + c.begin, b.data() + c.begin, c.count * sizeof(T)) == 0));
    // Outside the chunk, the buffer is as it was.
    CHECK(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(c.begin), x.begin()));
    CHECK(std::equal(a.begin() + static_cast<std::ptrdiff_t>(c.begin + c.count), a.end(),
                     x.begin() + static_cast<std::ptrdiff_t>(c.begin + c.count)));
    if (Q::lossless) {
      const auto want = mpi_sum(x);
      CHECK(std::equal(a.begin() + static_cast<std::ptrdiff_t>(c.begin),
                       a.begin() + static_cast<std::ptrdiff_t>(c.begin + c.count),
                       want.begin() + static_cast<std::ptrdiff_t>(c.begin)));
    }
    // The chunks of all ranks tile [0, n) in rank order.
    std::size_t next = 0;
    for (int r = 0; r < p; ++r) {
      const auto cr = cgx::reduce_scatter_plan<T, Q, X>::chunk_of(n, p, r);
      CHECK(cr.begin == next);
      next = cr.begin + cr.count;
    }
    CHECK(next == n);
    covered_total += c.count;
  }
  CHECK(covered_total > 0);
}

template <class T, class Q, class X>
void allgather_blocks() {
  const int p = world_size();
  const int me = world_rank();
  cgx::allgather_plan<T, Q, X> ag{X{MPI_COMM_WORLD}, cap, schedule_always()};
  for (std::size_t count : counts) {
    CAPTURE(count);
    const auto mine = inputs<T>(me, count, count + 5);
    std::vector<T> out(count * static_cast<std::size_t>(p), T(-1));
    ag(mine.data(), count, out.data());
    CHECK(identical_on_all_ranks(out));
    std::size_t bad = 0;
    for (int r = 0; r < p; ++r) {
      const auto xr = inputs<T>(r, count, count + 5);
      bad += outside_one_quantization<T, Q>(out.data() + static_cast<std::size_t>(r) * count, xr.data(), count);
    }
    CHECK(bad == 0);
    if (count > 0 && (Q::lossless || p == 1))
      CHECK(std::memcmp(out.data() + static_cast<std::size_t>(me) * count, mine.data(), count * sizeof(T)) == 0);
    // In place: the block already sits at out + rank * count.
    std::vector<T> in_place(count * static_cast<std::size_t>(p), T(-2));
    std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me) * count));
    ag(in_place.data() + static_cast<std::size_t>(me) * count, count, in_place.data());
    if (Q::lossless || std::is_same_v<typename Q::rounding, cgx::quant::nearest>) CHECK(in_place == out);
    CHECK(identical_on_all_ranks(in_place));
  }
}

template <class T, class Q, class X>
void broadcast_from_every_root() {
  const int p = world_size();
  const int me = world_rank();
  cgx::broadcast_plan<T, Q, X> bc{X{MPI_COMM_WORLD}, cap, schedule_always()};
  for (std::size_t n : counts)
    for (int root = 0; root < p; ++root) {
      CAPTURE(n);
      CAPTURE(root);
      const auto want = inputs<T>(root, n, n + 9);
      auto v = me == root ? want : inputs<T>(me + 100, n, 1);
      bc(v.data(), n, root);
      CHECK(identical_on_all_ranks(v));
      CHECK(outside_one_quantization<T, Q>(v.data(), want.data(), n) == 0);
      if (Q::lossless || p == 1) CHECK(v == want);
    }
}

template <class X>
void all_collectives() {
  reduce_scatter_matches_allreduce<float, none, X>();
  reduce_scatter_matches_allreduce<double, none, X>();
  reduce_scatter_matches_allreduce<float, Q8n, X>();
  reduce_scatter_matches_allreduce<float, Q4s, X>();
  reduce_scatter_matches_allreduce<double, Q4s, X>();
  allgather_blocks<float, none, X>();
  allgather_blocks<double, Q8n, X>();
  allgather_blocks<float, Q4s, X>();
  broadcast_from_every_root<double, none, X>();
  broadcast_from_every_root<float, Q8n, X>();
  broadcast_from_every_root<double, Q4s, X>();
}
}  // namespace

TEST_CASE("reduce_scatter, allgather, broadcast over mpi") { all_collectives<mpi>(); }
TEST_CASE("reduce_scatter, allgather, broadcast over shm") { all_collectives<shm>(); }

TEST_CASE("collectives: bad input throws on every rank and leaves buffers untouched") {
  const int p = world_size();
  const int me = world_rank();
  const auto opts = checked(schedule_always());
  // Sized for 101 values per rank, so that no call below could touch memory outside them.
  std::vector<float> v(101, 2.0f), out(101 * static_cast<std::size_t>(p), 3.0f);
  const auto v0 = v, out0 = out;
  cgx::reduce_scatter_plan<float, Q8n, mpi> rs{mpi{MPI_COMM_WORLD}, 100, opts};
  cgx::allgather_plan<float, Q8n, mpi> ag{mpi{MPI_COMM_WORLD}, 100, opts};
  cgx::broadcast_plan<float, Q8n, mpi> bc{mpi{MPI_COMM_WORLD}, 100, opts};
  CHECK(error_code_of([&] { rs(nullptr, 10); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { rs(v.data(), 101); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { ag(nullptr, 10, out.data()); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { ag(v.data(), 10, nullptr); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { ag(v.data(), 101, out.data()); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { bc(nullptr, 10, 0); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { bc(v.data(), 10, p); }) == cgx::errc::invalid_argument);
  CHECK(error_code_of([&] { bc(v.data(), 10, -1); }) == cgx::errc::invalid_argument);
  // One rank's bad argument makes every rank throw.
  CHECK(error_code_of([&] { bc(v.data(), me == p - 1 ? 101 : 10, 0); }) == cgx::errc::invalid_argument);
  if (p > 1) {
    CHECK(error_code_of([&] { rs(v.data(), me == 0 ? 99 : 100); }) == cgx::errc::mismatch);
    CHECK(error_code_of([&] { ag(v.data(), me == 0 ? 9 : 10, out.data()); }) == cgx::errc::mismatch);
    CHECK(error_code_of([&] { bc(v.data(), 10, me == 0 ? 0 : 1); }) == cgx::errc::mismatch);
  }
  CHECK(v == v0);
  CHECK(out == out0);
  std::vector<std::byte> small(1);
  CHECK(error_code_of([&] {
          cgx::allgather_plan<float, Q8n, mpi> bad{mpi{MPI_COMM_WORLD}, 100, std::span<std::byte>(small), opts};
        }) == cgx::errc::workspace);
}
