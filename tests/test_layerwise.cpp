// layerwise_plan over MPI, at whatever rank count the test runs with (1..4): mixed
// bits, uncompressed small and one-dimensional layers, the cut into chunks, identical
// bits on all ranks, settings changes, error feedback and bad input. Expected values
// are computed from size(). At the end, the layer-wise cases of issue 17's "same bits"
// checksums (checksums.hpp): here, where the plan's codecs are compiled anyway.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "checksums.hpp"
#include "mpi_test_util.hpp"
#include "reducer_checks.hpp"

namespace {

using cgx::layer;
using cgx::layer_setting;
using cgx::comm::mpi;
using cgx_test::identical_on_all_ranks;
using cgx_test::inputs;
using cgx_test::world_rank;
using cgx_test::world_size;

// A small network's fused gradient: weights of various sizes, biases, a gap (not a
// layer: left alone) and layers listed out of offset order.
std::vector<layer> model_layers() {
  return {
      {0, 5000, false},      // weights: compressed
      {5000, 100, true},     // bias: uncompressed (one-dimensional)
      {5100, 700, false},    // small weights: uncompressed (< 1024)
      {9000, 3001, false},   // weights with a partial last bucket
      {5800, 3000, false},   // listed after a later layer
      {12001, 1, true},      // a single value
      {12100, 2500, false},  // after a gap [12002, 12100)
  };
}
constexpr std::size_t model_size = 14600;

bool in_some_layer(const std::vector<layer>& ls, std::size_t i) {
  return std::any_of(ls.begin(), ls.end(), [&](const layer& l) { return i >= l.offset && i < l.offset + l.count; });
}

// The values of the layers are the same bits on every rank (gaps hold each rank's own input).
template <class T>
bool layers_identical(std::vector<T> x, const std::vector<layer>& ls) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!in_some_layer(ls, i)) x[i] = T(0);
  return identical_on_all_ranks(x);
}

}  // namespace

TEST_CASE("default settings follow CGX: small and one-dimensional layers uncompressed") {
  const auto ls = model_layers();
  const auto s = cgx::default_settings(ls, {.bits = 3, .bucket = 512, .min_compressed = 1024});
  REQUIRE(s.size() == ls.size());
  for (std::size_t i = 0; i < ls.size(); ++i) {
    CAPTURE(i);
    const bool raw = ls[i].one_dimensional || ls[i].count < 1024;
    CHECK(s[i].bits == (raw ? 0 : 3));
  }
}

TEST_CASE("the cut: chunks at bucket and layer boundaries, bytes add up to the layers' sizes") {
  const auto ls = model_layers();
  std::vector<layer_setting> s = cgx::default_settings(ls);
  s[0] = {2, 128};
  s[3] = {7, 512};
  s[6] = {1, 1024};
  for (int p = 1; p <= 7; ++p) {
    CAPTURE(p);
    cgx::layerwise_layout lay(model_size, ls);
    lay.cut(s, p, &cgx::setting_bytes<float>);
    std::size_t bytes = 0, values = 0;
    std::vector<std::size_t> covered(ls.size(), 0);
    for (int r = 0; r < p; ++r) {
      std::size_t off = 0;
      for (const auto& pc : lay.pieces(r)) {
        const layer& l = ls[pc.layer];
        CHECK(pc.begin >= l.offset);
        CHECK(pc.begin + pc.count <= l.offset + l.count);
        if (s[pc.layer].bits != 0) {
          CHECK((pc.begin - l.offset) % s[pc.layer].bucket == 0);  // starts on a bucket boundary
          const bool ends_layer = pc.begin + pc.count == l.offset + l.count;
          CHECK((ends_layer || pc.count % s[pc.layer].bucket == 0));
        }
        CHECK(pc.offset == off);
        off += pc.bytes;
        covered[pc.layer] += pc.count;
      }
      CHECK(off == lay.chunk_bytes(r));
      bytes += lay.chunk_bytes(r);
      values += lay.chunk_count(r);
      CHECK(lay.slot_bytes() >= lay.chunk_bytes(r));
    }
    std::size_t want_bytes = 0, want_values = 0;
    for (std::size_t i = 0; i < ls.size(); ++i) {
      CHECK(covered[i] == ls[i].count);
      want_bytes += cgx::setting_bytes<float>(s[i], ls[i].count);
      want_values += ls[i].count;
    }
    CHECK(bytes == want_bytes);  // pieces cut at bucket boundaries cost what the whole layer does
    CHECK(values == want_values);
  }
}

TEST_CASE("all layers uncompressed: the exact sum, MPI_Allreduce's on integer data; gaps untouched") {
  const int r = world_rank();
  const auto ls = model_layers();
  for (int pass = 0; pass < 2; ++pass) {
    cgx::layerwise_plan<double, mpi> plan{mpi{MPI_COMM_WORLD}, model_size, ls,
                                          {.defaults = {.bits = 0}, .check = cgx::checking::collective}};
    auto x = cgx_test::integer_inputs<double>(r, model_size);
    const auto before = x;
    const auto want = cgx_test::mpi_sum(x);
    plan(x.data(), x.size());
    std::size_t wrong = 0, touched_gap = 0;
    for (std::size_t i = 0; i < model_size; ++i) {
      if (in_some_layer(ls, i))
        wrong += x[i] != want[i];
      else
        touched_gap += x[i] != before[i];
    }
    CHECK(wrong == 0);
    CHECK(touched_gap == 0);
  }
}

namespace {

// Per-bucket units of every rank's input and of the exact sum, for the SRA bound with
// nearest rounding: |got - sum| <= sum_r u_r / 2 + u_s / 2 (+ slack for fp rounding),
// with u_s bounded by (range of the exact sum + sum_r u_r) / (2^b - 1).
template <class T>
std::size_t outside_bound(const std::vector<T>& got, const std::vector<layer>& ls,
                          const std::vector<layer_setting>& s, std::uint64_t salt) {
  const int p = world_size();
  std::vector<std::vector<T>> in(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q) in[static_cast<std::size_t>(q)] = inputs<T>(q, got.size(), salt);
  std::size_t bad = 0;
  for (std::size_t li = 0; li < ls.size(); ++li) {
    const layer& l = ls[li];
    const std::size_t B = s[li].bits == 0 ? std::max<std::size_t>(l.count, 1) : s[li].bucket;
    const double levels = s[li].bits == 0 ? 0.0 : std::ldexp(1.0, s[li].bits) - 1.0;
    for (std::size_t b0 = 0; b0 < l.count; b0 += B) {
      const std::size_t b1 = std::min(l.count, b0 + B);
      double us = 0, smin = 1e300, smax = -1e300, mag = 0;
      std::vector<double> exact(b1 - b0, 0.0);
      for (int q = 0; q < p; ++q) {
        const auto& v = in[static_cast<std::size_t>(q)];
        double mn = 1e300, mx = -1e300;
        for (std::size_t i = b0; i < b1; ++i) {
          mn = std::min(mn, double(v[l.offset + i]));
          mx = std::max(mx, double(v[l.offset + i]));
          exact[i - b0] += double(v[l.offset + i]);
          mag = std::max(mag, std::abs(double(v[l.offset + i])));
        }
        if (levels > 0) us += (mx - mn) / levels;
      }
      for (double e : exact) smin = std::min(smin, e), smax = std::max(smax, e);
      const double u_sum = levels > 0 ? (smax - smin + us) / levels : 0.0;
      const double slack = 64 * p * std::numeric_limits<T>::epsilon() * (mag * p + 1);
      const double bound = us / 2 + u_sum / 2 + slack;
      for (std::size_t i = b0; i < b1; ++i) bad += std::abs(double(got[l.offset + i]) - exact[i - b0]) > bound;
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("mixed bits: within the SRA bound of each layer's setting, identical on all ranks, bytes as set") {
  const int r = world_rank(), p = world_size();
  const auto ls = model_layers();
  auto s = cgx::default_settings(ls);
  s[0] = {2, 128};
  s[3] = {8, 512};
  s[4] = {4, 1024};
  s[6] = {1, 512};
  cgx::layerwise_plan<float, mpi, cgx::quant::nearest> plan{mpi{MPI_COMM_WORLD}, model_size, ls,
                                                            {.check = cgx::checking::collective}};
  plan.set_settings(s);
  auto x = inputs<float>(r, model_size, 11);
  plan(x.data(), x.size());
  CHECK(outside_bound(x, ls, s, 11) == 0);
  CHECK(layers_identical(x, ls));

  // Every rank sends its part once and its chunk's sum p - 1 times: over all ranks,
  // 2 (p - 1) times the compressed size of the layers.
  long long sent = static_cast<long long>(plan.bytes_sent()), total = 0;
  MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  std::size_t layers_bytes = 0;
  for (std::size_t i = 0; i < ls.size(); ++i) layers_bytes += cgx::setting_bytes<float>(s[i], ls[i].count);
  total = static_cast<long long>(2 * static_cast<std::size_t>(p - 1) * layers_bytes);
  CHECK(sent == total);
}

TEST_CASE("buckets of 64 and 2048 (torch_cgx's sizes): within the SRA bound, identical on all ranks; 100 refused") {
  const int r = world_rank();
  const auto ls = model_layers();
  auto s = cgx::default_settings(ls);
  s[0] = {3, 64};
  s[3] = {4, 2048};
  s[4] = {2, 64};
  s[6] = {8, 2048};
  cgx::layerwise_plan<float, mpi, cgx::quant::nearest> plan{mpi{MPI_COMM_WORLD}, model_size, ls,
                                                            {.check = cgx::checking::collective}};
  plan.set_settings(s);
  auto x = inputs<float>(r, model_size, 13);
  plan(x.data(), x.size());
  CHECK(outside_bound(x, ls, s, 13) == 0);
  CHECK(layers_identical(x, ls));
  // a bucket of 64 carries its min and unit for every 64 values: more metadata than 2048's
  CHECK(cgx::setting_bytes<float>({4, 64}, 4096) > cgx::setting_bytes<float>({4, 2048}, 4096));
  s[0] = {3, 100};
  CHECK_THROWS_WITH_AS(plan.set_settings(s), doctest::Contains("bucket 100"), cgx::error);
}

TEST_CASE("stochastic rounding: identical on all ranks, uncompressed layers exact, compressed ones within bound, over repeated calls") {
  const int r = world_rank();
  const auto ls = model_layers();
  cgx::layerwise_plan<float, mpi> plan{mpi{MPI_COMM_WORLD}, model_size, ls, {.defaults = {.bits = 3, .bucket = 512}}};
  std::vector<std::vector<float>> all;  // every rank's inputs, for the bound
  for (int q = 0; q < world_size(); ++q) all.push_back(cgx_test::integer_inputs<float>(q, model_size));
  for (int call = 0; call < 3; ++call) {
    auto x = cgx_test::integer_inputs<float>(r, model_size);
    const auto want = cgx_test::mpi_sum(x);
    plan(x.data(), x.size());
    CHECK(layers_identical(x, ls));
    std::size_t wrong = 0, outside = 0;
    for (std::size_t i = 0; i < ls.size(); ++i) {
      const auto& st = plan.settings()[i];
      if (st.bits == 0) {
        for (std::size_t k = ls[i].offset; k < ls[i].offset + ls[i].count; ++k) wrong += x[k] != want[k];
      } else {
        // Compressed layers: within the bound of two stochastic quantizations per value
        // (SRA: each contribution, then the owner's sum), buckets counted from the layer.
        outside += cgx_test::outside_bound_in(x.data(), ls[i].offset, ls[i].offset + ls[i].count, world_size(), st.bucket,
                                              st.bits, 1.0, 2, [&](int q, std::size_t k) { return all[static_cast<std::size_t>(q)][k]; });
      }
    }
    CHECK(wrong == 0);
    CHECK(outside == 0);
  }
  CHECK(plan.calls() == 3);
}

TEST_CASE("settings change between calls without reallocating; fewer bits, larger error") {
  const int r = world_rank(), p = world_size();
  const std::vector<layer> ls{{0, 40000, false}};
  cgx::layerwise_plan<float, mpi, cgx::quant::nearest> plan{mpi{MPI_COMM_WORLD}, 40000, ls, {.defaults = {.bits = 8}}};
  const std::size_t ws = plan.workspace_size();
  // Sized for the uncompressed worst case: a raw chunk of the layer fits in it.
  if (p > 1) CHECK(ws >= 40000 / static_cast<std::size_t>(p) * sizeof(float));
  double err[9] = {};
  for (int bits : {8, 4, 2, 0}) {
    plan.set_bits(0, bits);
    CHECK(plan.workspace_size() == ws);  // sized for the uncompressed worst case
    auto x = inputs<float>(r, 40000, 5);
    const auto want = cgx_test::mpi_sum(inputs<double>(r, 40000, 5));
    plan(x.data(), x.size());
    for (std::size_t i = 0; i < x.size(); ++i) err[bits] = std::max(err[bits], std::abs(double(x[i]) - want[i]));
  }
  if (p > 1) {
    CHECK(err[8] < err[4]);
    CHECK(err[4] < err[2]);
  }
  CHECK(err[0] < 1e-4);  // float rounding of the sum only
}

TEST_CASE("error feedback: the mean over calls converges to the sum; reset; memory") {
  const int r = world_rank(), p = world_size();
  const std::vector<layer> ls{{0, 8192, false}, {8192, 50, true}};
  const std::size_t n = 8242;
  const int calls = 24;
  auto mean_error = [&](bool ef) {
    cgx::layerwise_plan<double, mpi, cgx::quant::nearest> plan{
        mpi{MPI_COMM_WORLD}, n, ls, {.defaults = {.bits = 2, .bucket = 512}, .error_feedback = ef}};
    CHECK(plan.feedback().memory_bytes() == (ef ? n * sizeof(double) : 0));
    const auto x0 = inputs<double>(r, n, 9);
    const auto want = cgx_test::mpi_sum(x0);
    std::vector<double> acc(n, 0.0);
    for (int c = 0; c < calls; ++c) {
      auto x = x0;
      plan(x.data(), n);
      for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
    }
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(acc[i] / calls - want[i]));
    if (ef) {
      bool nonzero = false;
      for (double e : plan.feedback().residual()) nonzero = nonzero || e != 0.0;
      CHECK(nonzero == (p > 1));
      plan.reset_error_feedback();
      for (double e : plan.feedback().residual()) REQUIRE(e == 0.0);
    }
    return worst;
  };
  const double without = mean_error(false), with = mean_error(true);
  CAPTURE(without);
  CAPTURE(with);
  if (p > 1) {
    // Nearest rounding repeats the same error every call; with error feedback the
    // errors telescope: the mean is off by at most (|last residuals|) / calls.
    CHECK(with < 0.25 * without);
  } else {
    CHECK(with < 1e-12);  // one rank: nothing is quantized
    CHECK(without < 1e-12);
  }
}

TEST_CASE("reduce_scatter: rank r's layer of the sum within its phase-1 bound, half the bytes; mixed calls refused") {
  // A buffer of p equal layers, one per rank (what cgx_torch's backend builds for torch's
  // reduce_scatter_tensor): rank r's chunk is layer r, its values the exact sum to within
  // the others' quantization errors, u_q / 2 each (nearest rounding), not re-quantized.
  const int r = world_rank(), p = world_size();
  const std::size_t m = 3000, n = m * static_cast<std::size_t>(p);
  std::vector<layer> ls;
  for (int q = 0; q < p; ++q) ls.push_back({static_cast<std::size_t>(q) * m, m, false});
  cgx::layerwise_plan<float, mpi, cgx::quant::nearest> plan{
      mpi{MPI_COMM_WORLD}, n, ls, {.defaults = {.bits = 4, .bucket = 512}, .check = cgx::checking::collective}};
  const auto pcs = plan.layout().pieces(r);
  REQUIRE(pcs.size() == 1);
  CHECK(pcs[0].begin == static_cast<std::size_t>(r) * m);
  CHECK(pcs[0].count == m);
  auto x = inputs<float>(r, n, 21);
  plan.reduce_scatter(x.data(), n);
  std::vector<std::vector<float>> in;
  for (int q = 0; q < p; ++q) in.push_back(inputs<float>(q, n, 21));
  std::size_t bad = 0;
  const std::size_t lo = static_cast<std::size_t>(r) * m;
  for (std::size_t b0 = 0; b0 < m; b0 += 512) {
    const std::size_t b1 = std::min(m, b0 + 512);
    double others = 0, mag = 0;
    for (int q = 0; q < p; ++q) {
      double mn = 1e300, mx = -1e300;
      for (std::size_t i = lo + b0; i < lo + b1; ++i) {
        mn = std::min(mn, double(in[static_cast<std::size_t>(q)][i]));
        mx = std::max(mx, double(in[static_cast<std::size_t>(q)][i]));
        mag = std::max(mag, std::abs(double(in[static_cast<std::size_t>(q)][i])));
      }
      if (q != r) others += (mx - mn) / 15.0;
    }
    const double bound = others / 2 + 64 * p * std::numeric_limits<float>::epsilon() * (mag * p + 1);
    for (std::size_t i = lo + b0; i < lo + b1; ++i) {
      double exact = 0;
      for (int q = 0; q < p; ++q) exact += double(in[static_cast<std::size_t>(q)][i]);
      bad += std::abs(double(x[i]) - exact) > bound;
    }
  }
  CHECK(bad == 0);
  // every rank sends its part of every other chunk once: (p - 1) times the layers' bytes in all
  long long sent = static_cast<long long>(plan.reduce_scatter_bytes_sent());
  MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  std::size_t layer_bytes = 0;
  for (const auto& st : plan.settings()) layer_bytes += cgx::setting_bytes<float>(st, m);
  CHECK(sent == static_cast<long long>(static_cast<std::size_t>(p - 1) * layer_bytes));
  if (p > 1)  // operator() sends the same and, in its allgather, its own chunk to every peer
    CHECK(plan.bytes_sent() == plan.reduce_scatter_bytes_sent() + static_cast<std::size_t>(p - 1) * plan.layout().chunk_bytes(r));
  if (p > 1) {
    // rank 0 in operator(), the others in reduce_scatter: every rank throws, none hangs
    cgx::layerwise_plan<float, mpi, cgx::quant::nearest> mixed{
        mpi{MPI_COMM_WORLD}, n, ls, {.defaults = {.bits = 4, .bucket = 512}, .check = cgx::checking::collective}};
    auto y = inputs<float>(r, n, 22);
    const auto y0 = y;
    if (r == 0)
      CHECK_THROWS_AS(mixed(y.data(), n), cgx::error);
    else
      CHECK_THROWS_AS(mixed.reduce_scatter(y.data(), n), cgx::error);
    CHECK(y == y0);  // refused before any data moved
  }
}

TEST_CASE("a plan resumed from another's calls(), settings and residuals reduces with its bits") {
  // What a checkpoint carries (cgx_torch's CGXState): after 3 calls of plan a, a new
  // plan b takes a's call counter (the key of stochastic rounding's bits), settings and
  // error-feedback residuals; the next 3 calls of both give the same bits. Without them
  // b's calls differ (at more than one rank, where anything is quantized).
  const int r = world_rank(), p = world_size();
  const auto ls = model_layers();
  const std::vector<std::vector<float>> xs{inputs<float>(r, model_size, 31), inputs<float>(r, model_size, 32),
                                           inputs<float>(r, model_size, 33), inputs<float>(r, model_size, 34)};
  auto run3 = [&](auto& plan) {
    std::vector<std::vector<float>> out;
    for (int c = 1; c < 4; ++c) {
      auto x = xs[static_cast<std::size_t>(c)];
      plan(x.data(), model_size);
      out.push_back(x);
    }
    return out;
  };
  for (const bool ef : {false, true}) {
    CAPTURE(ef);
    const cgx::layerwise_options o{.defaults = {.bits = ef ? 2 : 3}, .error_feedback = ef};
    cgx::layerwise_plan<float, mpi> a{mpi{MPI_COMM_WORLD}, model_size, ls, o};
    for (int c = 0; c < 3; ++c) {
      auto x = xs[0];
      a(x.data(), model_size);
    }
    auto s = a.settings();
    s[0].bits = 5;  // a changed setting (the adaptive assignment's kind) travels too
    a.set_settings(s);
    cgx::layerwise_plan<float, mpi> b{mpi{MPI_COMM_WORLD}, model_size, ls, o}, fresh{mpi{MPI_COMM_WORLD}, model_size, ls, o};
    b.set_settings(a.settings());
    b.set_calls(a.calls());
    if (ef) b.set_feedback(a.feedback().residual());
    CHECK(b.calls() == 3);
    fresh.set_settings(a.settings());
    const auto want = run3(a), got = run3(b), other = run3(fresh);
    CHECK(got == want);
    if (p > 1) CHECK(other != want);
  }
  // refused: residuals for a plan without error feedback, a wrong count, a value not finite
  cgx::layerwise_plan<float, mpi> plain{mpi{MPI_COMM_WORLD}, model_size, ls};
  const std::vector<float> zeros(model_size, 0.0f);
  CHECK_THROWS_AS(plain.set_feedback(zeros), cgx::error);
  cgx::layerwise_plan<float, mpi> with{mpi{MPI_COMM_WORLD}, model_size, ls, {.error_feedback = true}};
  CHECK_THROWS_AS(with.set_feedback(std::span<const float>(zeros).first(10)), cgx::error);
  auto bad = zeros;
  bad[7] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(with.set_feedback(bad), cgx::error);
  for (float e : with.feedback().residual()) REQUIRE(e == 0.0f);
}

TEST_CASE("error_feedback<T> over a compile-time quantizer: decoded values average to the input") {
  // 2 bits, nearest rounding: its error (range / 6) contracts the residual, the clamp of
  // error_feedback.hpp never acts and the errors telescope exactly. x ends decoded.
  using Q = cgx::quant::maxmin<2, 128, cgx::quant::nearest>;
  const std::size_t n = 1000;
  const auto x0 = inputs<float>(0, n, 3);
  cgx::error_feedback<float> ef(n);
  CHECK(ef.memory_bytes() == n * sizeof(float));
  std::vector<std::byte> wire(Q::compressed_bytes<float>(n));
  std::vector<double> acc(n, 0.0);
  std::vector<float> dec(n);
  const int calls = 50;
  double first_err = 0;
  for (int c = 0; c < calls; ++c) {
    auto x = x0;
    ef.compress<Q>(x.data(), 0, n, wire.data());
    Q::decompress<float>(wire.data(), n, dec.data());
    REQUIRE(x == dec);
    for (std::size_t i = 0; i < n; ++i) {
      acc[i] += dec[i];
      if (c == 0) first_err = std::max(first_err, std::abs(double(dec[i]) - x0[i]));
    }
  }
  double worst = 0, res = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(acc[i] / calls - x0[i]));
  for (float e : ef.residual()) res = std::max(res, double(std::abs(e)));
  CHECK(worst <= res / calls + 1e-5);  // telescoping: sum of decodes = calls * x - last residual
  CHECK(worst < first_err / 10);
  ef.reset();
  for (float e : ef.residual()) CHECK(e == 0.0f);
}

TEST_CASE("error feedback with the default plan at 1, 2, 4, 8 bits: same bits, the mean converges, a NaN is not kept") {
  const int r = world_rank(), p = world_size();
  const std::vector<layer> ls{{0, 8192, false}, {8192, 50, true}};
  const std::size_t n = 8242;
  const int calls = 24;
  const auto x0 = inputs<float>(r, n, 11);
  const auto want = cgx_test::mpi_sum(inputs<double>(r, n, 11));
  for (int bits : {1, 2, 4, 8}) {
    CAPTURE(bits);
    const cgx::layerwise_options plain{.defaults = {.bits = bits}}, with_ef{.defaults = {.bits = bits}, .error_feedback = true};
    auto mean_error = [&](const cgx::layerwise_options& o) {
      cgx::layerwise_plan<float, mpi> plan{mpi{MPI_COMM_WORLD}, n, ls, o};
      std::vector<double> acc(n, 0.0);
      for (int c = 0; c < calls; ++c) {
        auto x = x0;
        plan(x.data(), n);
        CHECK(layers_identical(x, ls));
        for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
      }
      double worst = 0;
      for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(acc[i] / calls - want[i]));
      return worst;
    };
    const double without = mean_error(plain), with = mean_error(with_ef);
    CAPTURE(without);
    CAPTURE(with);
    if (p > 1) {
      // Plain stochastic rounding averages its errors down like 1/sqrt(calls); error
      // feedback's errors telescope to its last residual, so its mean error falls like
      // 1/calls (measured 0.09x-0.17x at 2+ bits, 2-4 ranks). At 1 bit the clamp keeps the
      // extreme values of a constant input from being sent in full (two levels, each the
      // mean of a side, reach them only with a residual larger than the input's range):
      // measured 0.51x-0.62x.
      CHECK(with < (bits == 1 ? 0.75 : 0.25) * without);
    } else {
      CHECK(with < 1e-6);  // one rank: nothing is quantized
      CHECK(without < 1e-6);
    }

    // A NaN in bucket 0 of rank p - 1's input at call 1 travels to every rank; every
    // residual stays finite (that bucket's is dropped) and the next call is finite.
    cgx::layerwise_plan<float, mpi> plan{mpi{MPI_COMM_WORLD}, n, ls, with_ef};
    for (int c = 0; c < 3; ++c) {
      auto x = x0;
      if (c == 1 && r == p - 1) x[100] = std::numeric_limits<float>::quiet_NaN();
      plan(x.data(), n);
      CHECK(layers_identical(x, ls));
      bool finite_elsewhere = true, nan_bucket = true, finite_e = true;
      for (std::size_t i = 0; i < n; ++i) {
        if (c == 1 && i < 1024) nan_bucket = nan_bucket && std::isnan(x[i]);
        else finite_elsewhere = finite_elsewhere && std::isfinite(x[i]);
      }
      for (float e : plan.feedback().residual()) finite_e = finite_e && std::isfinite(e);
      CHECK(finite_elsewhere);
      CHECK(finite_e);
      if (c == 1 && p > 1) CHECK(nan_bucket);  // one rank: nothing is quantized, x is untouched
    }
  }
}

namespace {
// One call of `plan` (collective checking, settings that differ between ranks):
// errc::mismatch on every rank and the buffer untouched.
void refused_as_mismatch(cgx::layerwise_plan<float, mpi>& plan, int r, std::size_t n) {
  auto x = inputs<float>(r, n, 3);
  const auto orig = x;
  try {
    plan(x.data(), n);
    FAIL("no throw");
  } catch (const cgx::error& e) {
    CHECK(e.code() == cgx::errc::mismatch);
  }
  CHECK(x == orig);
}
}  // namespace

TEST_CASE("error feedback with a decay: 0 reduces with nearest rounding's bits, same bits on every rank, mismatch caught") {
  const int r = world_rank(), p = world_size();
  const std::vector<layer> ls{{0, 6000, false}, {6000, 40, true}, {6040, 3000, false}};
  const std::size_t n = 9040;
  for (int bits : {2, 4}) {
    CAPTURE(bits);
    // Decay 0 carries no residual: the bits of the plan with nearest rounding and no error
    // feedback, call after call (the residual is still kept, and dropped at each call).
    cgx::layerwise_plan<float, mpi, cgx::quant::nearest> nearest{mpi{MPI_COMM_WORLD}, n, ls, {.defaults = {.bits = bits}}};
    cgx::layerwise_plan<float, mpi> leaky{
        mpi{MPI_COMM_WORLD}, n, ls, {.defaults = {.bits = bits}, .error_feedback = true, .error_feedback_decay = 0.0}};
    cgx::layerwise_plan<float, mpi> whole{mpi{MPI_COMM_WORLD}, n, ls, {.defaults = {.bits = bits}, .error_feedback = true}};
    cgx::layerwise_plan<float, mpi> half{
        mpi{MPI_COMM_WORLD}, n, ls, {.defaults = {.bits = bits}, .error_feedback = true, .error_feedback_decay = 0.5}};
    CHECK(half.feedback().decay() == 0.5);
    bool differs_whole = false, differs_half = false;
    for (int c = 0; c < 4; ++c) {
      const auto x0 = inputs<float>(r, n, 40 + static_cast<std::size_t>(c));
      auto a = x0, b = x0, w = x0, h = x0;
      nearest(a.data(), n);
      leaky(b.data(), n);
      whole(w.data(), n);
      half(h.data(), n);
      CHECK(a == b);
      CHECK(layers_identical(h, ls));  // same bits on every rank with a decay
      if (c > 0 && p > 1) {
        differs_whole = differs_whole || w != a;
        differs_half = differs_half || (h != a && h != w);
      }
    }
    // From the second call the carried residual changes the bits (this test would not see
    // a decay that is ignored or that zeroes the residual).
    if (p > 1) {
      CHECK(differs_whole);
      CHECK(differs_half);
    }
  }
  // A decay outside [0, 1] is refused at construction (with or without error feedback).
  for (const double bad : {-0.5, 1.25, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    for (const bool ef : {true, false}) {
      try {
        cgx::layerwise_plan<float, mpi> plan{mpi{MPI_COMM_WORLD}, n, ls, {.error_feedback = ef, .error_feedback_decay = bad}};
        FAIL("no error");
      } catch (const cgx::error& e) {
        CHECK(e.code() == cgx::errc::invalid_argument);
      }
    }
  }
  if (p > 1) {
    // Ranks that set different decays: errc::mismatch on every rank, buffers untouched.
    cgx::layerwise_plan<float, mpi> plan{
        mpi{MPI_COMM_WORLD}, n, ls,
        {.defaults = {.bits = 2}, .error_feedback = true, .error_feedback_decay = r == 0 ? 0.5 : 1.0,
         .check = cgx::checking::collective}};
    refused_as_mismatch(plan, r, n);
  }
}

TEST_CASE("error feedback of the contributions only (error_feedback_sum = false)") {
  const int r = world_rank(), p = world_size();
  const std::vector<layer> ls{{0, 6000, false}, {6000, 40, true}, {6040, 3000, false}};
  const std::size_t n = 9040;
  for (int bits : {1, 2, 4}) {
    CAPTURE(bits);
    const cgx::layerwise_options all{.defaults = {.bits = bits}, .error_feedback = true};
    cgx::layerwise_options only = all;
    only.error_feedback_sum = false;
    cgx::layerwise_plan<float, mpi> a{mpi{MPI_COMM_WORLD}, n, ls, all}, c{mpi{MPI_COMM_WORLD}, n, ls, only};
    std::vector<bool> owned(n, false);
    for (const auto& pc : c.layout().pieces(r))
      for (std::size_t i = pc.begin; i < pc.begin + pc.count; ++i) owned[i] = true;
    bool differs = false, sum_residual = false;
    for (int call = 0; call < 4; ++call) {
      CAPTURE(call);
      auto x = inputs<float>(r, n, 60 + static_cast<std::size_t>(call)), y = x;
      a(x.data(), n);
      c(y.data(), n);
      CHECK(layers_identical(y, ls));  // same bits on every rank
      if (call == 0) CHECK(x == y);    // no residual yet: the same encoding of the same values
      differs = differs || x != y;
      const auto ea = a.feedback().residual(), ec = c.feedback().residual();
      bool zero_owned = true, same_contrib = true;
      for (std::size_t i = 0; i < n; ++i) {
        if (owned[i]) {
          zero_owned = zero_owned && ec[i] == 0.0f;
          sum_residual = sum_residual || ea[i] != 0.0f;
        } else {
          // a contribution's residual depends on the contribution alone, whichever the mode
          same_contrib = same_contrib && ea[i] == ec[i];
        }
      }
      CHECK(zero_owned);
      CHECK(same_contrib);
    }
    // With the sum's residual carried (the default) the owned chunk's bits change from the
    // second call; without it they do not depend on it (this test would not see a mode
    // that is ignored).
    if (p > 1) {
      CHECK(sum_residual);
      CHECK(differs);
    }
  }
  if (p > 1) {
    // Ranks that set different modes: errc::mismatch on every rank, buffers untouched.
    cgx::layerwise_plan<float, mpi> plan{mpi{MPI_COMM_WORLD}, n, ls,
                                         {.defaults = {.bits = 2}, .error_feedback = true, .error_feedback_sum = r != 0,
                                          .check = cgx::checking::collective}};
    refused_as_mismatch(plan, r, n);
  }
}

TEST_CASE("bad input throws cgx::error and leaves the buffer untouched") {
  const int r = world_rank(), p = world_size();
  const auto ls = model_layers();
  using plan_t = cgx::layerwise_plan<float, mpi>;
  // Layouts.
  CHECK_THROWS_AS(plan_t(mpi{MPI_COMM_WORLD}, 100, {{0, 60, false}, {50, 20, false}}), cgx::error);
  CHECK_THROWS_AS(plan_t(mpi{MPI_COMM_WORLD}, 100, {{90, 11, false}}), cgx::error);
  CHECK_THROWS_AS(plan_t(mpi{MPI_COMM_WORLD}, 100, {{101, 0, false}}), cgx::error);
  CHECK_THROWS_AS(plan_t(mpi{MPI_COMM_WORLD}, 100, {{0, 100, false}}, {.defaults = {.bits = 9, .min_compressed = 0}}), cgx::error);

  plan_t plan{mpi{MPI_COMM_WORLD}, model_size, ls, {.check = cgx::checking::collective}};
  const auto before = plan.settings();
  CHECK_THROWS_AS(plan.set_bits(0, 9), cgx::error);
  CHECK_THROWS_AS(plan.set_bits(0, -1), cgx::error);
  CHECK_THROWS_AS(plan.set_bits(99, 4), cgx::error);
  auto s = before;
  s[0].bucket = 100;
  CHECK_THROWS_AS(plan.set_settings(s), cgx::error);
  s.pop_back();
  CHECK_THROWS_AS(plan.set_settings(s), cgx::error);
  CHECK(plan.settings() == before);  // unchanged by the failed calls

  auto x = inputs<float>(r, model_size);
  const auto orig = x;
  CHECK_THROWS_AS(plan(nullptr, model_size), cgx::error);
  CHECK_THROWS_AS(plan(x.data(), model_size - 1), cgx::error);
  CHECK(x == orig);
  // One rank passes bad arguments: every rank throws, nobody moves data.
  try {
    plan(r == p - 1 ? nullptr : x.data(), model_size);
    FAIL("no throw");
  } catch (const cgx::error& e) {
    CHECK(e.code() == cgx::errc::invalid_argument);
  }
  CHECK(x == orig);
  if (p > 1) {
    // Ranks disagree on a layer's bits: mismatch on every rank, buffer untouched.
    if (r == 0) plan.set_bits(0, 2);
    try {
      plan(x.data(), model_size);
      FAIL("no throw");
    } catch (const cgx::error& e) {
      CHECK(e.code() == cgx::errc::mismatch);
    }
    CHECK(x == orig);
    plan.set_settings(before);
  }
  plan(x.data(), model_size);  // still usable
  CHECK(layers_identical(x, ls));
}

namespace {
// A fused buffer of layers of many sizes, a gap, layers out of offset order; mixed
// settings: widths 1..8 at every bucket, uncompressed layers.
std::vector<layer> checksum_layers() {
  return {{0, 5000, false},    {5000, 100, true}, {5100, 700, false},    {9000, 3001, false},
          {5800, 3000, false}, {12001, 1, true},  {12100, 2500, false}, {14600, 40000, false}};
}
constexpr std::size_t checksum_size = 54600;
std::vector<layer_setting> checksum_settings() {
  return {{1, 128}, {0, 1024}, {8, 512}, {3, 1024}, {5, 128}, {0, 1024}, {7, 512}, {2, 1024}};
}

// Three calls of a layer-wise plan: with the mixed settings, or (adaptive) with the
// settings adaptive_bits assigns from each result. One case: the hash of the three outputs.
template <class T, class X, class Rounding>
void layerwise_checksum(const std::string& what, cgx::layerwise_options o, bool adaptive) {
  using namespace cgx_checksums;
  const int r = world_rank();
  const auto ls = checksum_layers();
  o.check = cgx::checking::collective;
  cgx::layerwise_plan<T, X, Rounding> plan{make<X>(), checksum_size, ls, o};
  cgx::adaptive_bits ad{ls, plan.settings()};
  if (!adaptive) plan.set_settings(checksum_settings());
  fnv1a h;
  for (int c = 0; c < 3; ++c) {
    auto v = input<T>(r, checksum_size, 77 + static_cast<std::size_t>(c));
    plan(v.data(), checksum_size);
    h.add(v.data(), checksum_size);
    if (adaptive) {
      ad.observe(v.data());
      plan.set_settings(ad.assign());
    }
  }
  const bool s = std::is_same_v<Rounding, cgx::quant::stochastic>;
  record("layerwise/" + what + "/" + (s ? "s" : "n") + "/" + tname<T>() + "/" + xname<X>(), h.h);
}
}  // namespace

TEST_CASE("same bits (issue 17): layerwise_plan with mixed settings, error feedback, adaptive settings") {
  using cgx::comm::shm;
  cgx_checksums::family("layerwise/", [] {
    cgx::layerwise_options ef;
    ef.error_feedback = true;
    layerwise_checksum<float, mpi, cgx::quant::stochastic>("mixed", {}, false);
    layerwise_checksum<float, mpi, cgx::quant::nearest>("mixed", {}, false);
    layerwise_checksum<double, mpi, cgx::quant::nearest>("mixed", {}, false);
    layerwise_checksum<float, shm, cgx::quant::stochastic>("mixed", {}, false);
    layerwise_checksum<float, mpi, cgx::quant::stochastic>("error_feedback", ef, false);
    cgx::layerwise_options ef_half = ef;
    ef_half.error_feedback_decay = 0.5;
    layerwise_checksum<float, mpi, cgx::quant::stochastic>("error_feedback_decay", ef_half, false);
    layerwise_checksum<double, mpi, cgx::quant::nearest>("error_feedback", ef, false);
    cgx::layerwise_options ef_contrib = ef_half;
    ef_contrib.error_feedback_sum = false;
    layerwise_checksum<float, mpi, cgx::quant::stochastic>("error_feedback_contributions", ef_contrib, false);
    layerwise_checksum<float, mpi, cgx::quant::stochastic>("adaptive", {}, true);
  });
}
