// Soak: many reductions of random size through random plans, every result checked.
//
// Registered at 1, 2, 3 and 4 ranks; each run makes `calls_per_run` reductions (10^4
// over the four). The random choices come from one generator seeded identically on
// every rank (and per rank count), so all ranks make the same calls in the same order:
//   - the plan: allreduce_plan with scatter_reduce_allgather, ring, tree (over comm::mpi
//     and comm::shm) or hierarchical<SRA, ring> (comm::mpi, two ranks per emulated
//     node); reduce_scatter_plan, allgather_plan, broadcast_plan (random root);
//     error_bounded_plan (SRA or ring, random bound); layerwise_plan (one to three
//     layers, each with random bits 0..8 and bucket);
//   - the quantizer: quant::none or maxmin at 1..8 bits (buckets 128..1024, nearest or
//     stochastic rounding);
//   - the count: 0, 1, bucket - 1, bucket, bucket + 1, or log-uniform up to 2^18 values
//     (1 MiB of floats); the inputs are a random window of a per-rank pool.
// Checks: quant::none is exact (integer-valued inputs); maxmin results are within the
// bound of reducer_checks.hpp for the schedule's number of quantizations; the error-
// bounded plan is within its bound; all ranks end with the same bits (a hash compared
// across ranks) wherever the collective promises it; and every call returns.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "reducer_checks.hpp"

namespace {
using namespace cgx_test;
using cgx::comm::mpi;
using cgx::comm::shm;
using SRA = cgx::comm::scatter_reduce_allgather;
using cgx::comm::ring;
using cgx::comm::tree;
using H = cgx::comm::hierarchical<SRA, ring>;
using none = cgx::quant::none;
template <int B, std::size_t S>
using mm_s = cgx::quant::maxmin<B, S, cgx::quant::stochastic>;
template <int B, std::size_t S>
using mm_n = cgx::quant::maxmin<B, S, cgx::quant::nearest>;

constexpr int calls_per_run = 2500;           // x 4 rank counts = 10^4
constexpr std::size_t max_n = std::size_t{1} << 18;
constexpr std::size_t pool_n = max_n * 2;
constexpr std::size_t shm_ring = std::size_t{1} << 16;

// Per-rank input pools, the same on every rank: real-valued and integer-valued.
struct pools {
  std::vector<std::vector<float>> real, integer;
  explicit pools(int p) {
    for (int r = 0; r < p; ++r) {
      real.push_back(inputs<float>(r, pool_n, 0x50a6));
      integer.push_back(integer_inputs<float>(r, pool_n));
    }
  }
};

// What one call needs: the pools, the window, the rank count, the generator.
struct call_ctx {
  const pools& in;
  std::size_t n, off;
  int p, me;
  std::mt19937_64& rng;
  std::string what;  // the call, for the report
};

// A hash of the bytes of v, equal on every rank iff (almost surely) the bytes are.
template <class T>
bool same_on_all_ranks(const T* v, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(v);
  for (std::size_t i = 0; i < n * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
  long long x[2] = {static_cast<long long>(h >> 1), -static_cast<long long>(h >> 1)};
  MPI_Allreduce(MPI_IN_PLACE, x, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return x[0] == -x[1];
}

template <class Q>
constexpr double rounding_c() {
  return std::is_same_v<typename Q::rounding, cgx::quant::nearest> ? 0.5 : 1.0;
}

template <class Q>
std::string q_name() {
  if constexpr (Q::lossless) return "none";
  else
    return "maxmin<" + std::to_string(Q::bits) + "," + std::to_string(Q::bucket_size) + "," +
           (rounding_c<Q>() == 0.5 ? "nearest" : "stochastic") + ">";
}

template <class X>
std::string x_name() {
  return std::is_same_v<X, shm> ? "shm" : "mpi";
}

template <class X>
X make_transport() {
  if constexpr (std::is_same_v<X, shm>) return shm{MPI_COMM_WORLD, shm_ring};
  else return mpi{MPI_COMM_WORLD};
}

// One kind of call; returns the number of wrong values on this rank.
struct runner {
  virtual ~runner() = default;
  virtual std::size_t bucket() const = 0;
  virtual std::size_t run(call_ctx& c) = 0;
};

template <class Q, class R, class X>
struct allreduce_runner final : runner {
  cgx::allreduce_plan<float, Q, R, X> plan;
  std::vector<float> buf;
  static X transport() {
    if constexpr (std::is_same_v<R, H>) {
      const int p = world_size();
      return mpi{MPI_COMM_WORLD, mpi::nodes{p == 3 ? 0 : world_rank() / 2}};  // equal nodes only
    } else {
      return make_transport<X>();
    }
  }
  allreduce_runner() : plan(transport(), max_n, schedule_always()) {}
  std::size_t bucket() const override { return Q::bucket_size; }
  std::size_t run(call_ctx& c) override {
    c.what = std::string("allreduce_plan<") + R::name + ", " + q_name<Q>() + ", " + x_name<X>() + ">";
    const auto& src = Q::lossless ? c.in.integer : c.in.real;
    buf.assign(src[static_cast<std::size_t>(c.me)].begin() + static_cast<std::ptrdiff_t>(c.off),
               src[static_cast<std::size_t>(c.me)].begin() + static_cast<std::ptrdiff_t>(c.off + c.n));
    plan(buf.data(), c.n);
    std::size_t bad = same_on_all_ranks(buf.data(), c.n) ? 0 : 1;
    auto x = [&](int r, std::size_t i) { return src[static_cast<std::size_t>(r)][c.off + i]; };
    if constexpr (Q::lossless) {
      for (std::size_t i = 0; i < c.n; ++i) {
        float s = 0;
        for (int r = 0; r < c.p; ++r) s += x(r, i);
        bad += buf[i] != s;
      }
    } else {
      bad += outside_bound_in(buf.data(), 0, c.n, c.p, Q::bucket_size, Q::bits, rounding_c<Q>(),
                              R::quantizations(c.p), x);
    }
    return bad;
  }
};

// The exact sum of integer-valued inputs, or the bound of K quantizations of [lo, hi).
template <class Q>
std::size_t check_range(const float* got, std::size_t lo, std::size_t hi, int p, int K,
                        const std::function<float(int, std::size_t)>& x) {
  if constexpr (Q::lossless) {
    std::size_t bad = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      float s = 0;
      for (int r = 0; r < p; ++r) s += x(r, i);
      bad += got[i] != s;
    }
    return bad;
  } else {
    return outside_bound_in(got, lo, hi, p, Q::bucket_size, Q::bits, rounding_c<Q>(), K, x);
  }
}

template <class Q, class X>
struct reduce_scatter_runner final : runner {
  cgx::reduce_scatter_plan<float, Q, X> plan{make_transport<X>(), max_n, schedule_always()};
  std::vector<float> buf;
  std::size_t bucket() const override { return Q::bucket_size; }
  std::size_t run(call_ctx& c) override {
    c.what = "reduce_scatter_plan<" + q_name<Q>() + ", " + x_name<X>() + ">";
    const auto& src = Q::lossless ? c.in.integer : c.in.real;
    const auto& mine = src[static_cast<std::size_t>(c.me)];
    buf.assign(mine.begin() + static_cast<std::ptrdiff_t>(c.off), mine.begin() + static_cast<std::ptrdiff_t>(c.off + c.n));
    plan(buf.data(), c.n);
    const auto ch = plan.my_chunk(c.n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < c.n; ++i)  // outside the chunk: untouched
      if ((i < ch.begin || i >= ch.begin + ch.count) && buf[i] != mine[c.off + i]) ++bad;
    return bad + check_range<Q>(buf.data(), ch.begin, ch.begin + ch.count, c.p, SRA::quantizations(c.p),
                                [&](int r, std::size_t i) { return src[static_cast<std::size_t>(r)][c.off + i]; });
  }
};

template <class Q, class X>
struct allgather_runner final : runner {
  cgx::allgather_plan<float, Q, X> plan{make_transport<X>(), max_n, schedule_always()};
  std::vector<float> in, out;
  std::size_t bucket() const override { return Q::bucket_size; }
  std::size_t run(call_ctx& c) override {
    c.what = "allgather_plan<" + q_name<Q>() + ", " + x_name<X>() + ">";
    const std::size_t count = c.n;  // every rank's block: p blocks in all
    const auto& src = Q::lossless ? c.in.integer : c.in.real;
    const auto& mine = src[static_cast<std::size_t>(c.me)];
    in.assign(mine.begin() + static_cast<std::ptrdiff_t>(c.off), mine.begin() + static_cast<std::ptrdiff_t>(c.off + count));
    out.assign(count * static_cast<std::size_t>(c.p), -1.0f);
    plan(in.data(), count, out.data());
    std::size_t bad = same_on_all_ranks(out.data(), out.size()) ? 0 : 1;
    for (int r = 0; r < c.p; ++r) {
      const float* got = out.data() + static_cast<std::size_t>(r) * count;
      const int K = c.p > 1 ? 1 : 0;  // one quantization; none on one rank
      bad += check_range<Q>(got, 0, count, 1, K,
                            [&](int, std::size_t i) { return src[static_cast<std::size_t>(r)][c.off + i]; });
    }
    return bad;
  }
};

template <class Q, class X>
struct broadcast_runner final : runner {
  cgx::broadcast_plan<float, Q, X> plan{make_transport<X>(), max_n, schedule_always()};
  std::vector<float> buf;
  std::size_t bucket() const override { return Q::bucket_size; }
  std::size_t run(call_ctx& c) override {
    const int root = static_cast<int>(c.rng() % static_cast<std::uint64_t>(c.p));
    c.what = "broadcast_plan<" + q_name<Q>() + ", " + x_name<X>() + "> root " + std::to_string(root);
    const auto& src = Q::lossless ? c.in.integer : c.in.real;
    const auto& mine = src[static_cast<std::size_t>(c.me)];
    buf.assign(mine.begin() + static_cast<std::ptrdiff_t>(c.off), mine.begin() + static_cast<std::ptrdiff_t>(c.off + c.n));
    plan(buf.data(), c.n, root);
    std::size_t bad = same_on_all_ranks(buf.data(), c.n) ? 0 : 1;
    return bad + check_range<Q>(buf.data(), 0, c.n, 1, c.p > 1 ? 1 : 0,
                                [&](int, std::size_t i) { return src[static_cast<std::size_t>(root)][c.off + i]; });
  }
};

template <class R, class X>
struct error_bounded_runner final : runner {
  cgx::error_bounded_plan<double, cgx::quant::error_bounded<1024>, R, X> plan{make_transport<X>(), max_n,
                                                                              schedule_always()};
  std::vector<double> buf;
  std::size_t bucket() const override { return 1024; }
  std::size_t run(call_ctx& c) override {
    static constexpr double bounds[] = {1e-1, 1e-3, 1e-6};
    const double bound = bounds[c.rng() % 3];
    c.what = std::string("error_bounded_plan<") + R::name + ", " + x_name<X>() + "> bound " + std::to_string(bound);
    const auto& mine = c.in.real[static_cast<std::size_t>(c.me)];
    buf.assign(mine.begin() + static_cast<std::ptrdiff_t>(c.off), mine.begin() + static_cast<std::ptrdiff_t>(c.off + c.n));
    plan(buf.data(), c.n, bound);
    std::size_t bad = same_on_all_ranks(buf.data(), c.n) ? 0 : 1;
    for (std::size_t i = 0; i < c.n; ++i) {
      double exact = 0;
      for (int r = 0; r < c.p; ++r) exact += static_cast<double>(c.in.real[static_cast<std::size_t>(r)][c.off + i]);
      // error_bounded_plan.hpp: within the bound, up to the double rounding of the sum.
      bad += !(std::fabs(buf[i] - exact) <= bound + 1e-12 * (1 + std::fabs(exact)));
    }
    return bad;
  }
};

// Layer-wise: a plan per call (its buffer size is fixed at construction).
template <class X>
struct layerwise_runner final : runner {
  std::size_t bucket() const override { return 1024; }
  std::size_t run(call_ctx& c) override {
    const std::size_t n = c.n;
    std::vector<cgx::layer> layers;
    std::vector<cgx::layer_setting> settings;
    const int nl = n < 3 ? 1 : 1 + static_cast<int>(c.rng() % 3);
    std::size_t at = 0;
    for (int l = 0; l < nl; ++l) {
      const std::size_t len = l == nl - 1 ? n - at : (n - at) / 2 + c.rng() % ((n - at) / 4 + 1);
      layers.push_back({at, len, false});
      settings.push_back({static_cast<int>(c.rng() % 9), cgx::layerwise_buckets[c.rng() % 3]});
      at += len;
    }
    c.what = "layerwise_plan<" + x_name<X>() + "> " + std::to_string(nl) + " layers, bits";
    for (const auto& s : settings) c.what += " " + std::to_string(s.bits) + "/" + std::to_string(s.bucket);
    cgx::layerwise_options o;
    o.check = cgx::checking::collective;
    cgx::layerwise_plan<float, X> plan{make_transport<X>(), n, layers, o};
    plan.set_settings(settings);
    const auto& mine = c.in.real[static_cast<std::size_t>(c.me)];
    std::vector<float> buf(mine.begin() + static_cast<std::ptrdiff_t>(c.off),
                           mine.begin() + static_cast<std::ptrdiff_t>(c.off + n));
    plan(buf.data(), n);
    std::size_t bad = same_on_all_ranks(buf.data(), n) ? 0 : 1;
    auto x = [&](int r, std::size_t i) { return c.in.real[static_cast<std::size_t>(r)][c.off + i]; };
    for (std::size_t l = 0; l < layers.size(); ++l)  // SRA: two quantizations of the layer's setting
      bad += outside_bound_in(buf.data(), layers[l].offset, layers[l].offset + layers[l].count, c.p, settings[l].bucket,
                              settings[l].bits, 1.0, SRA::quantizations(c.p), x);
    return bad;
  }
};

using factory = std::function<std::unique_ptr<runner>()>;

template <class R, class X, class... Qs>
void add_allreduce(std::vector<factory>& f) {
  (f.push_back([] { return std::make_unique<allreduce_runner<Qs, R, X>>(); }), ...);
}

template <class X, class... Qs>
void add_collectives(std::vector<factory>& f) {
  (f.push_back([] { return std::make_unique<reduce_scatter_runner<Qs, X>>(); }), ...);
  (f.push_back([] { return std::make_unique<allgather_runner<Qs, X>>(); }), ...);
  (f.push_back([] { return std::make_unique<broadcast_runner<Qs, X>>(); }), ...);
}

template <class X>
void add_all_for(std::vector<factory>& f) {
  add_allreduce<SRA, X, none, mm_s<1, 1024>, mm_s<2, 256>, mm_n<3, 1024>, mm_s<4, 1024>, mm_n<5, 512>,
                mm_s<6, 1024>, mm_n<7, 128>, mm_n<8, 1024>>(f);
  add_allreduce<ring, X, none, mm_s<2, 256>, mm_s<4, 1024>, mm_n<8, 1024>>(f);
  add_allreduce<tree, X, none, mm_s<2, 256>, mm_s<4, 1024>, mm_n<8, 1024>>(f);
  add_collectives<X, none, mm_s<4, 1024>, mm_n<8, 512>>(f);
  f.push_back([] { return std::make_unique<error_bounded_runner<SRA, X>>(); });
  f.push_back([] { return std::make_unique<error_bounded_runner<ring, X>>(); });
  f.push_back([] { return std::make_unique<layerwise_runner<X>>(); });
}
}  // namespace

TEST_CASE("soak: random reductions through random plans, every result checked") {
  const int p = world_size(), me = world_rank();
  std::vector<factory> kinds;
  add_all_for<mpi>(kinds);
  add_all_for<shm>(kinds);
  add_allreduce<H, mpi, none, mm_s<4, 1024>, mm_n<8, 1024>>(kinds);
  std::vector<std::unique_ptr<runner>> made(kinds.size());
  const pools in(p);
  std::mt19937_64 rng(0x50a6 + static_cast<std::uint64_t>(p));  // the same on every rank
  std::size_t wrong = 0, calls = 0, layerwise_calls = 0;
  std::string first_failure;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < calls_per_run; ++k) {
    const std::size_t kind = rng() % kinds.size();
    if (!made[kind]) made[kind] = kinds[kind]();  // collective: every rank makes the same, in the same order
    runner& run = *made[kind];
    // The count: a bucket edge case one time in five, else log-uniform in [2, max_n].
    std::size_t n = 0;
    const std::size_t B = run.bucket() == 0 ? 1024 : run.bucket();  // quant::none has no buckets
    const std::size_t edge[] = {0, 1, B - 1, B, B + 1};
    if (rng() % 5 == 0) {
      n = edge[rng() % 5];
    } else {
      const double u = static_cast<double>(rng() >> 11) * 0x1p-53;
      n = static_cast<std::size_t>(std::exp2(1.0 + u * 17.0));
    }
    if (dynamic_cast<layerwise_runner<mpi>*>(&run) || dynamic_cast<layerwise_runner<shm>*>(&run)) {
      n = std::clamp<std::size_t>(n, 1, 1 << 16);  // a plan per call: keep them small
      ++layerwise_calls;
    }
    call_ctx c{in, n, static_cast<std::size_t>(rng() % (pool_n - n + 1)), p, me, rng, {}};
    const std::size_t bad = run.run(c);
    ++calls;
    if (bad != 0) {
      wrong += bad;
      if (first_failure.empty())
        first_failure = "call " + std::to_string(k) + ": " + c.what + ", n " + std::to_string(n) + ": " +
                        std::to_string(bad) + " wrong";
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsigned long long tot[2] = {wrong, calls}, all[2] = {0, 0};
  MPI_Allreduce(tot, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0)
    std::printf("soak at %d ranks: %zu reductions (%zu layer-wise), %zu plan kinds, %.1f s\n", p, calls,
                layerwise_calls, kinds.size(), secs);
  INFO(first_failure);
  CHECK(wrong == 0);
  CHECK(all[0] == 0);
  CHECK(all[1] == static_cast<unsigned long long>(calls_per_run) * static_cast<unsigned long long>(p));
}
