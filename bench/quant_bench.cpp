/// \file quant_bench.cpp
/// Throughput of the host kernels of cgx::quant::maxmin against streaming baselines
/// measured in the same run, over the same buffer; with --rotated also of
/// cgx::quant::rotated<maxmin<...>> (the randomized Hadamard rotation, issue 51).
///
///   g++ -std=c++20 -O3 -Iinclude bench/quant_bench.cpp -o quant_bench
///   ./quant_bench [--mib N] [--bucket 128|512|1024|4096] [--threads N] [--reps N]
///                 [--bits LIST] [--isa scalar|sse2|avx2|avx512|neon] [--json FILE] [--check]
///                 [--rotated]
///
/// Built as a user builds (no -march): the kernels pick their instruction set at run
/// time (cgx/quant/host_isa.hpp); the header and every JSON record name the one that
/// ran, and --isa (or CGX_HOST_ISA) forces another one this CPU can run.
///
/// Every row is timed as best-of-N, and its baseline is timed in the same loop, one
/// baseline pass right before each pass of the measured op, so that both see the same
/// machine load (the development machines are shared). Throughput is counted in fp32
/// (or fp64) bytes of the uncompressed side: input bytes for compress, output bytes for
/// decompress and decompress_add.
///
/// Baselines:
///   read   sum of the input buffer (4 vector accumulators): compress and decompress
///   add    y[i] += x[i] over as many values as the op writes: decompress_add
///   write  y[i] = c (reported beside decompress, not used for its ratio)
///   three  decompress_add, compress and decompress called one after the other:
///          add_requantize (the same three in one pass, maxmin.hpp)
///   maxmin the same op of plain maxmin (same bits, bucket, rounding): the rows rot_* of
///          --rotated, whose ratio is then the rotated codec's share of maxmin's speed
///          (1 / ratio: its time per value relative to maxmin's). The compressed bytes of
///          the two are the same; --rotated checks that before timing.
///
/// --check exits with status 1 when, for float, bucket 1024 (or the chosen bucket), one
/// thread, the 4-bit figures miss: compress/nearest >= 0.8 x read, compress/stochastic
/// >= 0.5 x read, decompress_add >= 0.7 x add; or when any other bit width of an op is
/// more than 2x slower than that op's 4-bit figure (compared as ratios to the baseline). It is a gate for a human on a quiet
/// machine, never for CI.

#include <cgx/quant/maxmin.hpp>
#include <cgx/quant/rotated.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace cgx::quant;
using clock_type = std::chrono::steady_clock;

struct options {
  std::size_t mib = 256;
  std::size_t bucket = 1024;
  int threads = 1;
  int reps = 7;
  std::vector<int> bits = {1, 2, 3, 4, 5, 6, 7, 8};
  bool doubles = true;
  std::string json;
  bool check = false;
  bool rotated = false;  // also time rotated<maxmin<...>> (rows rot_*)
  std::string isa;  // empty: the detected path
};

/// 64-byte aligned, page-touched buffer.
template <class T>
struct buffer {
  struct del {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<T[], del> p;
  std::size_t n = 0;
  explicit buffer(std::size_t count) : p(static_cast<T*>(::operator new[](count * sizeof(T), std::align_val_t{64}))), n(count) {
    std::memset(static_cast<void*>(p.get()), 0, count * sizeof(T));
  }
  T* data() { return p.get(); }
};

template <class T>
struct vec {
  typedef T type __attribute__((vector_size(32)));
};

/// Streaming read: sum of x[0..n) with four independent vector accumulators.
template <class T>
__attribute__((noinline)) T read_sum(const T* x, std::size_t n) {
  using V = typename vec<T>::type;
  constexpr std::size_t L = 32 / sizeof(T);
  V a[4] = {};
  std::size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    for (int k = 0; k < 4; ++k) {
      V v;
      std::memcpy(&v, x + i + k * L, sizeof(V));
      a[k] += v;
    }
  }
  T s = 0;
  for (; i < n; ++i) s += x[i];
  for (int k = 0; k < 4; ++k)
    for (std::size_t l = 0; l < L; ++l) s += a[k][l];
  return s;
}

/// Streaming read-modify-write: y[i] += x[i].
template <class T>
__attribute__((noinline)) void add_stream(T* __restrict__ y, const T* __restrict__ x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

/// Streaming write: y[i] = c.
template <class T>
__attribute__((noinline)) void write_stream(T* __restrict__ y, T c, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = c;
}

volatile double g_sink = 0;

/// Runs f(begin, end) over [0, n) split on `threads` threads, by 4096-value blocks.
template <class F>
void par(int threads, std::size_t n, F&& f) {
  const std::size_t blk = 4096;
  const std::size_t nblk = (n + blk - 1) / blk;
  for_each_range(host_exec{threads}, nblk, [&](std::size_t b0, std::size_t b1) {
    const std::size_t e = std::min(n, b1 * blk);
    if (b0 * blk < e) f(b0 * blk, e);
  });
}

double seconds_of(const auto& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct record {
  std::string op, rounding, dtype;
  int bits;
  std::size_t bucket;
  int threads;
  double gbps, baseline_gbps, ratio, write_gbps, max_err_units;
};

std::vector<record> g_records;

/// Best-of-reps of the op and of its baseline, each baseline pass right before an op pass.
template <class Op, class Base>
std::pair<double, double> best_pair(int reps, Op&& op, Base&& base) {
  double to = 1e30, tb = 1e30;
  for (int r = 0; r < reps; ++r) {
    tb = std::min(tb, seconds_of(base));
    to = std::min(to, seconds_of(op));
  }
  return {to, tb};
}

void print_header() {
  std::printf("%-15s %-6s %4s %6s %-10s %3s %10s %9s %9s %7s %9s %9s\n", "op", "dtype", "bits", "bucket",
              "rounding", "thr", "time_ms", "GB/s", "base_GB/s", "ratio", "write_GB/s", "err/unit");
}

void print_record(const record& r, double ms) {
  std::printf("%-15s %-6s %4d %6zu %-10s %3d %10.3f %9.2f %9.2f %7.3f", r.op.c_str(), r.dtype.c_str(), r.bits,
              r.bucket, r.rounding.c_str(), r.threads, ms, r.gbps, r.baseline_gbps, r.ratio);
  if (r.write_gbps > 0)
    std::printf(" %9.2f", r.write_gbps);
  else
    std::printf(" %9s", "-");
  if (r.max_err_units >= 0)
    std::printf(" %9.3f", r.max_err_units);
  std::printf("\n");
  std::fflush(stdout);
}

/// Largest |decoded - x| in units of its bucket, over the first `m` values: a sanity
/// check that the timed kernels compute something sensible (<= 0.5 nearest, < 1 stochastic).
template <class Q, class T>
double max_err_units(const T* x, const T* y, const std::byte* comp, std::size_t n, std::size_t m) {
  using M = meta_t<T>;
  double e = 0;
  m = std::min(m, n);
  for (std::size_t i = 0; i < m; ++i) {
    M rec[2];
    std::memcpy(rec, comp + (i / Q::bucket_size) * sizeof(rec), sizeof(rec));
    if (rec[1] > 0) e = std::max(e, std::fabs(double(y[i]) - double(x[i])) / double(rec[1]));
  }
  return e;
}

/// The rows rot_* of --rotated: each op of rotated<maxmin<Bits, B, ...>> against the same
/// op of plain maxmin, timed in the same loop (ratio = maxmin's time / the rotated one's).
template <int Bits, std::size_t B, class T, class Mk>
void bench_rotated(const options& o, T* x, T* y, std::byte* comp, std::size_t n, Mk&& mk) {
  using QS = maxmin<Bits, B, stochastic>;
  using QN = maxmin<Bits, B, nearest>;
  using RS = rotated<QS>;
  using RN = rotated<QN>;
  if (RS::template compressed_bytes<T>(n) != QS::template compressed_bytes<T>(n)) {
    std::fprintf(stderr, "rotated: compressed size differs from maxmin's\n");
    std::exit(1);
  }
  const host_exec ex{o.threads};
  rng_state rng;
  rng.seed = 43;
  {
    auto [to, tb] = best_pair(
        o.reps, [&] { ++rng.counter; RS::template compress<T>(x, n, comp, rng, ex); },
        [&] { ++rng.counter; QS::template compress<T>(x, n, comp, rng, ex); });
    mk("rot_compress", "stochastic", to, tb, 0, -1);
  }
  {
    auto [to, tb] = best_pair(
        o.reps, [&] { RN::template compress<T>(x, n, comp, rng, ex); },
        [&] { QN::template compress<T>(x, n, comp, rng, ex); });
    mk("rot_compress", "nearest", to, tb, 0, -1);
  }
  RN::template compress<T>(x, n, comp, rng, ex);
  {
    auto [to, tb] = best_pair(
        o.reps, [&] { RN::template decompress<T>(comp, n, y, ex); },
        [&] { QN::template decompress<T>(comp, n, y, ex); });
    mk("rot_decompress", "-", to, tb, 0, -1);
  }
  {
    auto [to, tb] = best_pair(
        o.reps, [&] { RN::template decompress_add<T>(comp, n, y, ex); },
        [&] { QN::template decompress_add<T>(comp, n, y, ex); });
    mk("rot_decomp_add", "-", to, tb, 0, -1);
  }
  {
    std::vector<std::byte> out(RS::template compressed_bytes<T>(n));
    auto [to, tb] = best_pair(
        o.reps, [&] { RS::template add_requantize<T>(comp, y, n, out.data(), rng, ex); },
        [&] { QS::template add_requantize<T>(comp, y, n, out.data(), rng, ex); });
    mk("rot_add_requant", "stochastic", to, tb, 0, -1);
  }
}

template <int Bits, std::size_t B, class T>
void bench_bits(const options& o, T* x, T* y, std::byte* comp, std::size_t n) {
  const double bytes = double(n) * sizeof(T);
  const char* dt = sizeof(T) == 4 ? "float" : "double";
  const int th = o.threads;
  const host_exec ex{th};
  auto read_base = [&] {
    par(th, n, [&](std::size_t b, std::size_t e) { g_sink = g_sink + double(read_sum(x + b, e - b)); });
  };
  rng_state rng;
  rng.seed = 42;
  auto mk = [&](const char* op, const char* rnd, double to, double tb, double tw, double err) {
    record r{op, rnd, dt, Bits, B, th, bytes / to / 1e9, bytes / tb / 1e9, tb / to,
             tw > 0 ? bytes / tw / 1e9 : 0.0, err};
    print_record(r, to * 1e3);
    g_records.push_back(r);
  };
  // compress, both roundings
  {
    using Q = maxmin<Bits, B, stochastic>;
    auto [to, tb] = best_pair(o.reps, [&] { ++rng.counter; Q::template compress<T>(x, n, comp, rng, ex); }, read_base);
    Q::template decompress<T>(comp, n, y, ex);
    mk("compress", "stochastic", to, tb, 0, max_err_units<Q>(x, y, comp, n, 1 << 20));
  }
  using Q = maxmin<Bits, B, nearest>;
  {
    auto [to, tb] = best_pair(o.reps, [&] { Q::template compress<T>(x, n, comp, rng, ex); }, read_base);
    Q::template decompress<T>(comp, n, y, ex);
    mk("compress", "nearest", to, tb, 0, max_err_units<Q>(x, y, comp, n, 1 << 20));
  }
  // decompress: ratio against the read baseline, write baseline reported beside it
  {
    double to = 1e30, tr = 1e30, tw = 1e30;
    for (int r = 0; r < o.reps; ++r) {
      tr = std::min(tr, seconds_of(read_base));
      tw = std::min(tw, seconds_of([&] {
                      par(th, n, [&](std::size_t b, std::size_t e) { write_stream(y + b, T(1), e - b); });
                    }));
      to = std::min(to, seconds_of([&] { Q::template decompress<T>(comp, n, y, ex); }));
    }
    mk("decompress", "-", to, tr, tw, -1);
  }
  // decompress_add: y += decoded, against y += x
  {
    auto [to, tb] = best_pair(
        o.reps, [&] { Q::template decompress_add<T>(comp, n, y, ex); },
        [&] { par(th, n, [&](std::size_t b, std::size_t e) { add_stream(y + b, x + b, e - b); }); });
    mk("decompress_add", "-", to, tb, 0, -1);
  }
  // add_requantize: the owner's fused last step (y += decoded, compress y, decode it back
  // into y), against the same three calls made one after the other
  {
    using QS = maxmin<Bits, B, stochastic>;
    std::vector<std::byte> out(QS::template compressed_bytes<T>(n));
    QS::template compress<T>(x, n, comp, rng, ex);
    auto [to, tb] = best_pair(
        o.reps, [&] { QS::template add_requantize<T>(comp, y, n, out.data(), rng, ex); },
        [&] {
          QS::template decompress_add<T>(comp, n, y, ex);
          QS::template compress<T>(y, n, out.data(), rng, ex);
          QS::template decompress<T>(out.data(), n, y, ex);
        });
    mk("add_requantize", "stochastic", to, tb, 0, -1);
  }
  if (o.rotated) bench_rotated<Bits, B, T>(o, x, y, comp, n, mk);
}

template <std::size_t B, class T>
void bench_type(const options& o, const std::vector<int>& bits) {
  const std::size_t n = o.mib * (std::size_t{1} << 20) / sizeof(T);
  buffer<T> x(n), y(n);
  buffer<std::byte> comp(maxmin<8, B, nearest>::template compressed_bytes<T>(n) + 64);
  std::mt19937_64 g(7);
  std::normal_distribution<double> nd(0.0, 1e-3);
  for (std::size_t i = 0; i < n; ++i) x.data()[i] = static_cast<T>(nd(g) * (1.0 + double((i >> 14) % 7)));
  for (int b : bits) {
    switch (b) {
      case 1: bench_bits<1, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      case 2: bench_bits<2, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      case 3: bench_bits<3, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      case 4: bench_bits<4, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      case 5: bench_bits<5, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      case 6: bench_bits<6, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      case 7: bench_bits<7, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      case 8: bench_bits<8, B, T>(o, x.data(), y.data(), comp.data(), n); break;
      default: std::fprintf(stderr, "bits %d not in 1..8\n", b); std::exit(2);
    }
  }
}

template <std::size_t B>
void bench_bucket(const options& o) {
  bench_type<B, float>(o, o.bits);
  if (o.doubles && std::find(o.bits.begin(), o.bits.end(), 4) != o.bits.end()) bench_type<B, double>(o, {4});
}

void write_json(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::perror(path.c_str());
    std::exit(2);
  }
  std::fprintf(f, "[\n");
  for (std::size_t i = 0; i < g_records.size(); ++i) {
    const record& r = g_records[i];
    std::fprintf(f,
                 "  {\"op\": \"%s\", \"bits\": %d, \"bucket\": %zu, \"rounding\": \"%s\", \"dtype\": \"%s\", "
                 "\"threads\": %d, \"isa\": \"%s\", \"gbps\": %.4f, \"baseline_gbps\": %.4f, \"ratio\": %.4f",
                 r.op.c_str(), r.bits, r.bucket, r.rounding.c_str(), r.dtype.c_str(), r.threads,
                 cgx::quant::to_string(cgx::quant::active_host_isa()), r.gbps, r.baseline_gbps, r.ratio);
    if (r.write_gbps > 0) std::fprintf(f, ", \"write_gbps\": %.4f", r.write_gbps);
    std::fprintf(f, "}%s\n", i + 1 < g_records.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  std::fclose(f);
}

/// The gate of --check; returns the number of missed targets.
int check_targets(const options& o) {
  int missed = 0;
  auto find = [&](const std::string& op, const std::string& rnd, int bits) -> const record* {
    for (const auto& r : g_records)
      if (r.op == op && r.rounding == rnd && r.bits == bits && r.dtype == "float") return &r;
    return nullptr;
  };
  struct target {
    const char* op;
    const char* rnd;
    double min_ratio;
  };
  const target ts[] = {{"compress", "nearest", 0.8}, {"compress", "stochastic", 0.5}, {"decompress_add", "-", 0.7}};
  for (const auto& t : ts) {
    const record* r4 = find(t.op, t.rnd, 4);
    if (!r4) {
      std::printf("check: no 4-bit %s/%s row (run with 4 in --bits)\n", t.op, t.rnd);
      ++missed;
      continue;
    }
    const bool ok = r4->ratio >= t.min_ratio;
    std::printf("check: %-14s %-10s 4 bits ratio %.3f (target >= %.2f) %s\n", t.op, t.rnd, r4->ratio, t.min_ratio,
                ok ? "ok" : "MISSED");
    missed += !ok;
  }
  const target all[] = {{"compress", "nearest", 0}, {"compress", "stochastic", 0}, {"decompress", "-", 0},
                        {"decompress_add", "-", 0}};
  for (const auto& t : all) {
    const record* r4 = find(t.op, t.rnd, 4);
    if (!r4) continue;
    for (int b : o.bits) {
      const record* r = find(t.op, t.rnd, b);
      if (!r || b == 4) continue;
      // compared as ratios to the baselines timed beside each row: load on a shared machine
      // moves the absolute GB/s of rows timed seconds apart, much less their ratios
      if (r->ratio * 2 < r4->ratio) {
        std::printf("check: %s %s %d bits ratio %.3f (%.2f GB/s) is more than 2x below 4 bits (%.3f, %.2f GB/s) "
                    "MISSED\n", t.op, t.rnd, b, r->ratio, r->gbps, r4->ratio, r4->gbps);
        ++missed;
      }
    }
  }
  std::printf("check: %s\n", missed ? "targets missed" : "all targets met");
  return missed;
}

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--mib N] [--bucket 128|512|1024|4096] [--threads N] [--reps N] [--bits 1,2,..] "
               "[--no-double] [--isa scalar|sse2|avx2|avx512|neon] [--json FILE] [--check] [--rotated]\n",
               argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (a == "--mib") {
      o.mib = std::strtoull(next(), nullptr, 10);
    } else if (a == "--bucket") {
      o.bucket = std::strtoull(next(), nullptr, 10);
    } else if (a == "--threads") {
      o.threads = std::atoi(next());
    } else if (a == "--reps") {
      o.reps = std::atoi(next());
    } else if (a == "--bits") {
      o.bits.clear();
      std::string s = next();
      for (std::size_t p = 0; p < s.size();) {
        const std::size_t q = s.find(',', p);
        o.bits.push_back(std::atoi(s.substr(p, q - p).c_str()));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else if (a == "--no-double") {
      o.doubles = false;
    } else if (a == "--json") {
      o.json = next();
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--rotated") {
      o.rotated = true;
    } else if (a == "--isa") {
      o.isa = next();
    } else {
      usage(argv[0]);
    }
  }
  if (o.mib == 0 || o.reps < 1 || o.threads < 1) usage(argv[0]);
  if (!o.isa.empty()) {
    cgx::quant::host_isa i{};
    if (!cgx::quant::parse_host_isa(o.isa.c_str(), i)) usage(argv[0]);
    try {
      cgx::quant::force_host_isa(i);
    } catch (const cgx::error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
  }
  std::printf("# cgx quant_bench: %zu MiB, bucket %zu, %d thread(s), best of %d; GB/s of uncompressed bytes\n",
              o.mib, o.bucket, o.threads, o.reps);
  std::printf("# host kernels: %s (this CPU's best: %s)\n", cgx::quant::to_string(cgx::quant::active_host_isa()),
              cgx::quant::to_string(cgx::quant::detected_host_isa()));
  std::printf("# baseline: read-sum (compress, decompress), y+=x (decompress_add), the three separate calls (add_requantize); ratio = op / baseline\n");
  print_header();
  switch (o.bucket) {
#if !defined(CGX_BENCH_ONLY_1024)  // CMake option CGX_BENCH_QUICK: bucket 1024 alone, a third of the build
    case 128: bench_bucket<128>(o); break;
    case 512: bench_bucket<512>(o); break;
    case 4096: bench_bucket<4096>(o); break;
#endif
    case 1024: bench_bucket<1024>(o); break;
    default:
#if defined(CGX_BENCH_ONLY_1024)
      std::fprintf(stderr, "bucket %zu not compiled in (1024 only: built with CGX_BENCH_QUICK=ON)\n", o.bucket);
#else
      std::fprintf(stderr, "bucket %zu not compiled in (128, 512, 1024, 4096)\n", o.bucket);
#endif
      return 2;
  }
  if (!o.json.empty()) write_json(o.json);
  if (o.check) return check_targets(o) ? 1 : 0;
  return 0;
}
