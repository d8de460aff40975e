// allreduce_bench: cgx's compressed allreduce against MPI_Allreduce, measured in the
// same run over the same data, with the flags and columns of nccl-tests.
//
//   mpirun -np 4 allreduce_bench -b 4K -e 256M -f 4 [-n 10] [-w 2] [-c 1] [--passes 1]
//       [--bits 2,4,8,32] [--bucket 1024] [--rounding stochastic|nearest]
//       [--reducer sra|ring|tree|hier] [--transport mpi|shm] [--dtype float|double]
//       (hier: hierarchical<uncompressed, ring>, exact inside a node, compressed across nodes)
//       [--native-below SIZE|auto|static,...] [--threads N] [--verify] [--link NAME] [--json FILE]
//       [--project PROFILE|all] [--bytes SIZE]
//       [--eb smooth,rough] [--eb-bounds 1e-2,1e-3,1e-4] [--eb-prediction auto,none] [--eb-only]
//
// --native-below is the plans' plan_options::native_below_bytes (0: always compress).
// Its default is 64K, cgx::default_native_below_bytes, the static pick for ranks on
// several nodes, not the library's own default: the emulated networks (bench/netns-run)
// put every rank on one host, which a plan would take for one node. `auto` is the
// library's default, the measured choice per size class (cgx::auto_threshold: its rows
// end with "auto:cgx" or "auto:mpi", the path it took in the last measured iteration);
// `static` is cgx::static_threshold. A list (e.g. 0,auto) makes one plan per value and
// bit width, each timed in its own rows with MPI_Allreduce in the same loop: `0,auto`
// gives the fixed compressed path, the uncompressed one (def) and the measured choice
// side by side (bench/auto-sweep).
//
// The baseline is the better of Open MPI's default MPI_Allreduce and its ring
// (coll_tuned_allreduce_algorithm 4, selected through MPI_T on a duplicated
// communicator); both are timed in the same loop and recorded. The ring needs
// OMPI_MCA_coll_tuned_use_dynamic_rules=1 at launch (bench/netns-run sets it);
// without it, or with another MPI, only the default is timed.
//
// --threads is plan_options::threads: host threads per rank for (de)compression. The
// header and every JSON record name the instruction set the host kernels ran with
// (cgx/quant/host_isa.hpp: chosen at run time; CGX_HOST_ISA=sse2 forces another).
// --verify is plan_options::verify: every message carries its payload's CRC-32C, checked
// by the receiver (the header line says so).
// --link defaults to $CGX_LINK (set by bench/netns-run and bench/netns-cluster).
// --project prints the cost model's predictions (include/cgx/model.hpp) for 8 to 1024
// ranks on a named network profile and exits; it needs no MPI launch.
//
// --eb adds the error-bounded rows (cgx::error_bounded_plan, quant::error_bounded<1024>,
// --reducer sra or ring) after the sweep (--eb-only: instead of it), on fields of -e
// bytes per rank laid out as rows of 4096 values (4096 x 4096 floats at -e 64M):
//   smooth: sum_k a_k sin(2 pi (fx_k i + fy_k j) / 4096 + 0.7 r + k) over the waves
//           (fx, fy, a) = (2, 3, 1), (5, 1, 0.5), (1, 7, 0.3), (9, 4, 0.2) (amplitude 2),
//           + uniform noise of 1e-3 of the amplitude (+-0.002); rank r shifts the phases;
//   rough:  smooth + uniform noise of 10% of the amplitude (+-0.2).
// The bound E of a row is --eb-bounds times the data's range (the largest max - min of
// one rank's field; the range of the sum is about 2.9x larger). A row reports the bytes
// each rank sent over the whole allreduce (mean and max over ranks, MiB), the ratio to
// the uncompressed schedule's, the largest error of any element on any rank over E, the
// time and MPI_Allreduce's, timed in the same loop as the sweep's rows (-w, -n; one
// pass). --eb-prediction picks the codec's modes: auto (plain or delta per bucket, the
// default) and/or none (plain only: the stream of the codec before the delta mode).
// A row whose error exceeds E makes the bench exit with status 3.
//
// --bits 32 (float) or 64 (double) is the uncompressed passthrough. busbw is computed
// on the uncompressed size: algbw * 2(p-1)/p. Each iteration restores the input, so
// every call reduces the same data; the time of an iteration is the maximum over
// ranks; a row reports the median over iterations. cgx and MPI_Allreduce (default and
// ring) run in every iteration, in an order that rotates from one iteration to the
// next, so that all see the same machine noise and none is favoured by its position.
// Roofline (docs/benchmarks.md, "Roofline"): every sra and ring row also reports its floor
// on this host and link. floor(us): the bytes a rank must move through memory per call,
// 2 n sizeof(T) (its input read once, its output written once) plus 4 (p-1)/p w (the w
// compressed bytes of the whole buffer: what it sends, written once by its compressor
// and what it receives, read once by its decompressor, 2 (p-1)/p w each), at the copy
// bandwidth measured at the start of the run (a memcpy of 64 MiB on every rank at once,
// read + written bytes per second, the slowest rank's median of 7). wire(us): the bytes
// of all ranks, 2 (p-1) w, over the link's rate when the link's name carries one
// (tcp-1gbit, tcp-10gbit, ...: bench/netns-run's loopback, which all ranks share); "-"
// otherwise. x_roof: time / max(floor, wire).
// --passes P runs the whole sweep P times (each row's -w warm-up then -n iterations in
// every pass) and reports each row's median over all P x n iterations, printed in the
// last pass: a row's samples then span the whole run, so that a slow spell of a shared
// host (which lasts seconds to minutes) weighs on every row alike instead of on the
// rows it happened to meet.
#include <cgx/cgx.hpp>
#include <cgx/model.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

// The bucket sizes compiled in (CMake option CGX_BENCH_QUICK: 1024 alone, and stochastic
// rounding alone, for CI builds).
#if defined(CGX_BENCH_ONLY_1024)
#define CGX_BENCH_BUCKETS 1024
#else
#define CGX_BENCH_BUCKETS 128, 512, 1024
#endif

namespace {

struct options {
  std::size_t min_bytes = 4 << 10;
  std::size_t max_bytes = 64 << 20;
  double factor = 4;
  int iters = 10;
  int warmup = 2;
  int passes = 1;
  int check = 1;
  std::vector<int> bits = {4};
  int bucket = 1024;
  std::string rounding = "stochastic";
  std::string reducer = "sra";
  std::string transport = "mpi";
  std::string dtype = "float";
  std::vector<std::size_t> native_below = {cgx::default_native_below_bytes};  // --native-below (see the file comment)
  int threads = 1;                                              // --threads: plan_options::threads
  bool verify = false;                                          // --verify: plan_options::verify
  std::string link = std::getenv("CGX_LINK") ? std::getenv("CGX_LINK") : "none";
  std::string json;
  std::string project;           // --project: print the model's projections and exit
  std::size_t project_bytes = 64 << 20;
  std::vector<std::string> eb_fields;                          // --eb: error-bounded rows on these fields
  std::vector<double> eb_bounds = {1e-2, 1e-3, 1e-4};          // --eb-bounds: E / the data's range
  std::vector<std::string> eb_prediction = {"auto"};           // --eb-prediction: auto, none
  bool eb_only = false;                                        // --eb-only: skip the sweep
};

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) out.push_back(t);
  return out;
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "allreduce_bench: %s (see the comment at the top of bench/allreduce_bench.cpp)\n", what.c_str());
  std::exit(2);
}

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double mul = 1;
  if (end && *end) {
    switch (*end) {
      case 'K': case 'k': mul = 1024; break;
      case 'M': case 'm': mul = 1024.0 * 1024; break;
      case 'G': case 'g': mul = 1024.0 * 1024 * 1024; break;
      default: usage_error("bad size " + s);
    }
  }
  if (!(v >= 0)) usage_error("bad size " + s);
  return static_cast<std::size_t>(v * mul);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-b") o.min_bytes = parse_size(val());
    else if (a == "-e") o.max_bytes = parse_size(val());
    else if (a == "-f") o.factor = std::atof(val().c_str());
    else if (a == "-n") o.iters = std::atoi(val().c_str());
    else if (a == "-w") o.warmup = std::atoi(val().c_str());
    else if (a == "-c") o.check = std::atoi(val().c_str());
    else if (a == "--passes") o.passes = std::atoi(val().c_str());
    else if (a == "--threads") o.threads = std::atoi(val().c_str());
    else if (a == "--verify") o.verify = true;
    else if (a == "--bits") {
      o.bits.clear();
      std::stringstream ss(val());
      for (std::string t; std::getline(ss, t, ',');) o.bits.push_back(std::atoi(t.c_str()));
    } else if (a == "--bucket") o.bucket = std::atoi(val().c_str());
    else if (a == "--rounding") o.rounding = val();
    else if (a == "--reducer") o.reducer = val();
    else if (a == "--transport") o.transport = val();
    else if (a == "--dtype") o.dtype = val();
    else if (a == "--native-below") {
      o.native_below.clear();
      for (const std::string& v : split_list(val()))
        o.native_below.push_back(v == "auto"     ? cgx::auto_threshold
                                 : v == "static" ? cgx::static_threshold
                                                 : parse_size(v));
      if (o.native_below.empty()) usage_error("--native-below needs a value");
    }
    else if (a == "--link") o.link = val();
    else if (a == "--json") o.json = val();
    else if (a == "--project") o.project = val();
    else if (a == "--bytes") o.project_bytes = parse_size(val());
    else if (a == "--eb") o.eb_fields = split_list(val());
    else if (a == "--eb-bounds") {
      o.eb_bounds.clear();
      for (const std::string& t : split_list(val())) o.eb_bounds.push_back(std::atof(t.c_str()));
    } else if (a == "--eb-prediction") o.eb_prediction = split_list(val());
    else if (a == "--eb-only") o.eb_only = true;
    else usage_error("unknown argument " + a);
  }
  if (o.min_bytes == 0 || o.max_bytes < o.min_bytes || o.factor <= 1 || o.iters < 1 || o.warmup < 0 || o.passes < 1 ||
      o.threads < 1)
    usage_error("need 0 < -b <= -e, -f > 1, -n >= 1, -w >= 0, --passes >= 1, --threads >= 1");
  for (const std::string& f : o.eb_fields)
    if (f != "smooth" && f != "rough") usage_error("unknown --eb field " + f + " (smooth, rough)");
  for (double b : o.eb_bounds)
    if (!(b > 0)) usage_error("--eb-bounds must be positive");
  for (const std::string& m : o.eb_prediction)
    if (m != "auto" && m != "none") usage_error("unknown --eb-prediction " + m + " (auto, none)");
  if (o.eb_only && o.eb_fields.empty()) usage_error("--eb-only needs --eb");
  return o;
}

// Gradient-like data, different on every rank.
template <class T>
void fill(std::vector<T>& x, int rank) {
  std::uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1) + 12345;
  for (std::size_t i = 0; i < x.size(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const double u = static_cast<double>(s >> 11) * 0x1p-53;
    const double scale = std::pow(10.0, -3.0 + static_cast<double>((i >> 16) % 4));
    x[i] = static_cast<T>(scale * (u - 0.5) * 3.4);
  }
}

// A type-erased plan: `run` sums buf[0..n) in place.
struct runner {
  std::function<void(void*, std::size_t)> run;
  std::size_t native_below = 0;  // the plan's native_below_bytes()
  std::function<bool()> last_native = [] { return false; };  // the plan's last_native()
  int bits = 0;                  // set by run()
  std::size_t asked = 0;         // plan_options::native_below_bytes as asked
};

// One timed iteration: cgx (`run`), MPI_Allreduce on MPI_COMM_WORLD and on ring_comm (if
// not null), each between barriers on data freshly restored from `input` into `work`, in
// an order that rotates with `it` so that none always goes first (right after the barrier
// that follows the restore) or last. One buffer for all three, so that none is favoured by
// where its pages lie or by what is left of them in the caches. The slowest rank's times.
template <class T, class Run>
std::array<double, 3> time_rotation(int it, const T* input, T* work, std::size_t n, MPI_Datatype mt, MPI_Comm ring_comm,
                                    Run&& run) {
  std::array<double, 3> t{0, 0, 0};
  for (int slot = 0; slot < 3; ++slot) {
    const int which = (slot + it) % 3;
    if (which == 2 && ring_comm == MPI_COMM_NULL) continue;
    std::memcpy(work, input, n * sizeof(T));
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (which == 0) run(work);
    else MPI_Allreduce(MPI_IN_PLACE, work, static_cast<int>(n), mt, MPI_SUM, which == 1 ? MPI_COMM_WORLD : ring_comm);
    t[static_cast<std::size_t>(which)] = MPI_Wtime() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, t.data(), 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

// The plan options the command line asks for.
cgx::plan_options plan_options_of(const options& o) {
  cgx::plan_options po;
  po.native_below_bytes = o.native_below.front();
  po.threads = o.threads;
  po.verify = o.verify;
  return po;
}

template <class T, class Q, class R, class X>
runner make_plan(X x, std::size_t max_count, const options& o) {
  const cgx::plan_options po = plan_options_of(o);
  auto plan = std::make_shared<cgx::allreduce_plan<T, Q, R, X>>(std::move(x), max_count, po);
  return {[plan](void* b, std::size_t n) { (*plan)(static_cast<T*>(b), n); }, plan->native_below_bytes(),
          [plan] { return plan->last_native(); }};
}

template <class T, class Q, class R>
runner with_transport(std::size_t max_count, const options& o) {
  if (o.transport == "mpi") return make_plan<T, Q, R>(cgx::comm::mpi{MPI_COMM_WORLD}, max_count, o);
  if (o.transport == "shm") {
    if constexpr (std::is_same_v<R, cgx::comm::hierarchical<cgx::comm::uncompressed, cgx::comm::ring>>)
      usage_error("--reducer hier needs --transport mpi");
    else
      return make_plan<T, Q, R>(cgx::comm::shm{MPI_COMM_WORLD}, max_count, o);
  }
  usage_error("unknown transport " + o.transport);
}

template <class T, class Q>
runner with_reducer(std::size_t max_count, const options& o) {
  if (o.reducer == "sra") return with_transport<T, Q, cgx::comm::scatter_reduce_allgather>(max_count, o);
  if (o.reducer == "ring") return with_transport<T, Q, cgx::comm::ring>(max_count, o);
  if (o.reducer == "tree") return with_transport<T, Q, cgx::comm::tree>(max_count, o);
  if (o.reducer == "hier")
    return with_transport<T, Q, cgx::comm::hierarchical<cgx::comm::uncompressed, cgx::comm::ring>>(
        max_count, o);
  usage_error("unknown reducer " + o.reducer);
}

// Run-time bits/bucket/rounding to types, over the compiled set.
template <class T>
runner make_runner(int bits, std::size_t max_count, const options& o) {
  if (bits == 8 * static_cast<int>(sizeof(T))) return with_reducer<T, cgx::quant::none>(max_count, o);
  return cgx::dispatch<1, 2, 4, 8>(bits, [&](auto b) -> runner {
    return cgx::dispatch<CGX_BENCH_BUCKETS>(o.bucket, [&](auto k) -> runner {
      constexpr int B = decltype(b)::value;
      constexpr std::size_t K = static_cast<std::size_t>(decltype(k)::value);
      if (o.rounding == "stochastic") return with_reducer<T, cgx::quant::maxmin<B, K, cgx::quant::stochastic>>(max_count, o);
#if !defined(CGX_BENCH_ONLY_1024)
      if (o.rounding == "nearest") return with_reducer<T, cgx::quant::maxmin<B, K, cgx::quant::nearest>>(max_count, o);
#else
      if (o.rounding == "nearest") usage_error("--rounding nearest is not compiled in (built with CGX_BENCH_QUICK=ON)");
#endif
      usage_error("unknown rounding " + o.rounding);
    });
  });
}

template <class T>
std::size_t wire_bytes(int bits, int bucket, std::size_t n) {
  if (bits == 8 * static_cast<int>(sizeof(T))) return n * sizeof(T);
  return cgx::dispatch<1, 2, 4, 8>(bits, [&](auto b) {
    return cgx::dispatch<CGX_BENCH_BUCKETS>(bucket, [&](auto k) {
      return cgx::quant::maxmin<decltype(b)::value, static_cast<std::size_t>(decltype(k)::value)>::template compressed_bytes<T>(n);
    });
  });
}

// Open MPI control variables through MPI_T: reads (and optionally writes) an int cvar by
// name. Returns false when the MPI library has no such variable.
bool cvar_int(const char* name, int* read, const int* write) {
  int n = 0;
  if (MPI_T_cvar_get_num(&n) != MPI_SUCCESS) return false;
  for (int i = 0; i < n; ++i) {
    char nm[256], desc[16];
    int nl = sizeof nm, dl = sizeof desc, verb = 0, bind = 0, scope = 0;
    MPI_Datatype dt;
    MPI_T_enum en;
    if (MPI_T_cvar_get_info(i, nm, &nl, &verb, &dt, &en, desc, &dl, &bind, &scope) != MPI_SUCCESS) continue;
    if (std::strcmp(nm, name) != 0) continue;
    // Writes only to int variables; bool variables (any other type) read as 0 or 1.
    if (write && dt != MPI_INT) return false;
    MPI_T_cvar_handle h;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(i, nullptr, &h, &count) != MPI_SUCCESS || count != 1) return false;
    bool ok = true;
    if (write) ok = MPI_T_cvar_write(h, write) == MPI_SUCCESS;
    if (ok && read) {
      alignas(8) unsigned char raw[16] = {};
      ok = MPI_T_cvar_read(h, raw) == MPI_SUCCESS;
      if (dt == MPI_INT) std::memcpy(read, raw, sizeof(int));
      else *read = std::any_of(raw, raw + sizeof raw, [](unsigned char c) { return c != 0; }) ? 1 : 0;
    }
    MPI_T_cvar_handle_free(&h);
    return ok;
  }
  return false;
}

// A duplicate of MPI_COMM_WORLD on which Open MPI's tuned component runs its ring
// allreduce (algorithm 4): the forced algorithm is read when a communicator is created,
// so it is set, the communicator duplicated, and the setting restored for every other
// communicator. MPI_COMM_NULL where that is not possible (not Open MPI, or dynamic rules
// off). Every rank gets the same answer: the cvars come from the launch environment.
MPI_Comm ring_baseline_comm() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return MPI_COMM_NULL;
  int dynamic = 0, before = 0, ring = 4, now = 0;
  MPI_Comm c = MPI_COMM_NULL;
  if (cvar_int("coll_tuned_use_dynamic_rules", &dynamic, nullptr) && dynamic == 1 &&
      cvar_int("coll_tuned_allreduce_algorithm", &before, nullptr) &&
      cvar_int("coll_tuned_allreduce_algorithm", &now, &ring) && now == ring) {
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    cvar_int("coll_tuned_allreduce_algorithm", nullptr, &before);
  }
  MPI_T_finalize();
  int have = c != MPI_COMM_NULL ? 1 : 0, all = 0;
  MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all && c != MPI_COMM_NULL) MPI_Comm_free(&c);
  return all ? c : MPI_COMM_NULL;
}

// --project: the cost model's time of every reducer and bit width for 8 to 1024 ranks
// on one machine profile, and the fastest choice, against the uncompressed ring.
void project(const cgx::model::machine& m, double bytes) {
  using namespace cgx::model;
  std::printf("# projection (include/cgx/model.hpp): %s\n#   %.*s\n", std::string(m.name).c_str(),
              static_cast<int>(m.description.size()), m.description.data());
  std::printf("# %.0f MiB fp32 per rank, bucket 1024; times in ms; speedup = mpi ring / best cgx\n", bytes / (1 << 20));
  std::printf("%6s %6s | %10s | %9s %9s %9s | %9s %9s %9s | %-12s %8s\n", "ranks", "nodes", "mpi ring", "sra 8b",
              "sra 4b", "sra 2b", "best 8b", "best 4b", "best 2b", "best", "speedup");
  for (int p = 8; p <= 1024; p *= 2) {
    const int L = std::min(m.ranks_per_node, p);
    const double base = predict(algorithm::mpi_ring, problem{bytes, p, 0}, m).total_s();
    double sra[3], best[3];
    std::string best_name[3];
    const int widths[3] = {8, 4, 2};
    double overall = 1e300;
    std::string overall_name;
    for (int k = 0; k < 3; ++k) {
      const problem pr{bytes, p, widths[k]};
      sra[k] = predict(algorithm::sra, pr, m).total_s();
      best[k] = 1e300;
      for (algorithm a : all_algorithms) {
        if (a == algorithm::mpi_ring || (a == algorithm::hierarchical && L == p)) continue;
        const double t = predict(a, pr, m).total_s();
        if (t < best[k]) {
          best[k] = t;
          best_name[k] = std::string(name(a));
        }
      }
      if (best[k] < overall) {
        overall = best[k];
        overall_name = best_name[k] + " " + std::to_string(widths[k]) + "b";
      }
    }
    char b[3][32];
    for (int k = 0; k < 3; ++k) std::snprintf(b[k], sizeof b[k], "%.1f %s", best[k] * 1e3, best_name[k].c_str());
    std::printf("%6d %6d | %10.1f | %9.1f %9.1f %9.1f | %9s %9s %9s | %-12s %7.2fx\n", p, (p + L - 1) / L, base * 1e3,
                sra[0] * 1e3, sra[1] * 1e3, sra[2] * 1e3, b[0], b[1], b[2], overall_name.c_str(), base / overall);
  }
  std::printf("\n");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- --eb: the error-bounded rows ------------------------------------------------------

// A type-erased error_bounded_plan: `run` sums buf[0..n) in place within the bound.
struct eb_runner {
  std::function<void(void*, std::size_t, double)> run;
  std::function<cgx::error_bounded_stats()> stats;
  std::size_t native_below = 0;  // the plan's native_below_bytes()
};

template <class T, class Q, class R, class X>
eb_runner make_eb_plan(X x, std::size_t max_count, const options& o) {
  const cgx::plan_options po = plan_options_of(o);
  auto plan = std::make_shared<cgx::error_bounded_plan<T, Q, R, X>>(std::move(x), max_count, po);
  return {[plan](void* b, std::size_t n, double e) { (*plan)(static_cast<T*>(b), n, e); },
          [plan] { return plan->last_stats(); }, plan->native_below_bytes()};
}

template <class T, class Q, class R>
eb_runner eb_with_transport(std::size_t max_count, const options& o) {
  if (o.transport == "mpi") return make_eb_plan<T, Q, R>(cgx::comm::mpi{MPI_COMM_WORLD}, max_count, o);
  if (o.transport == "shm") return make_eb_plan<T, Q, R>(cgx::comm::shm{MPI_COMM_WORLD}, max_count, o);
  usage_error("unknown transport " + o.transport);
}

template <class T>
eb_runner make_eb_runner(const std::string& prediction, std::size_t max_count, const options& o) {
  using auto_q = cgx::quant::error_bounded<1024, cgx::quant::eb_prediction::automatic>;
  using plain_q = cgx::quant::error_bounded<1024, cgx::quant::eb_prediction::none>;
  using sra = cgx::comm::scatter_reduce_allgather;
  using ring = cgx::comm::ring;
  if (o.reducer != "sra" && o.reducer != "ring") usage_error("--eb needs --reducer sra or ring");
  const bool r = o.reducer == "ring";
  if (prediction == "none")
    return r ? eb_with_transport<T, plain_q, ring>(max_count, o) : eb_with_transport<T, plain_q, sra>(max_count, o);
  return r ? eb_with_transport<T, auto_q, ring>(max_count, o) : eb_with_transport<T, auto_q, sra>(max_count, o);
}

std::uint64_t eb_mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Value idx of rank r's --eb field (see the file comment), rows of 4096 values.
double eb_value(bool rough, int r, std::size_t idx) {
  struct wave {
    double fx, fy, a;
  };
  constexpr wave waves[4] = {{2, 3, 1.0}, {5, 1, 0.5}, {1, 7, 0.3}, {9, 4, 0.2}};
  constexpr double two_pi = 6.283185307179586;
  const double i = static_cast<double>(idx % 4096), j = static_cast<double>(idx / 4096);
  double v = 0;
  for (int k = 0; k < 4; ++k)
    v += waves[k].a * std::sin(two_pi * (waves[k].fx * i / 4096.0 + waves[k].fy * j / 4096.0) + 0.7 * r + k);
  const std::uint64_t h = (static_cast<std::uint64_t>(r) << 40) ^ idx;
  auto unit = [](std::uint64_t z) { return static_cast<double>(eb_mix(z) >> 11) * 0x1p-53; };
  v += 2e-3 * (2 * unit(h) - 1);
  if (rough) v += 0.2 * (2 * unit(h ^ 0x5555555555ull) - 1);
  return v;
}

// The --eb rows, on fields of n values in `input` (overwritten) timed through `work`.
// Returns 3 if a row's error exceeded its bound, else 0.
template <class T>
int run_eb(const options& o, int rank, int p, std::vector<T>& input, std::vector<T>& work, MPI_Comm ring_comm,
           FILE* js, bool& first_record) {
  const MPI_Datatype mt = std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
  const std::size_t n = input.size();
  int rc = 0;
  std::vector<double> exact(n);
  for (const std::string& field : o.eb_fields) {
    const bool rough = field == "rough";
    for (std::size_t i = 0; i < n; ++i) input[i] = static_cast<T>(eb_value(rough, rank, i));
    for (std::size_t i = 0; i < n; ++i) exact[i] = static_cast<double>(input[i]);
    MPI_Allreduce(MPI_IN_PLACE, exact.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const auto [lo, hi] = std::minmax_element(input.begin(), input.end());
    double range = n == 0 ? 0.0 : static_cast<double>(*hi) - static_cast<double>(*lo);
    MPI_Allreduce(MPI_IN_PLACE, &range, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    for (const std::string& prediction : o.eb_prediction) {
      const eb_runner plan = make_eb_runner<T>(prediction, n, o);
      if (rank == 0) {
        std::printf("\n# error-bounded rows: field %s, %zu x 4096 values per rank (rows of 4096), range %.4f (max over "
                    "ranks of one rank's max - min); prediction %s; E = bound x range; the plan hands calls under %zu "
                    "bytes to MPI_Allreduce\n",
                    field.c_str(), (n + 4095) / 4096, range, prediction.c_str(), plan.native_below);
        std::printf("%7s %5s %8s %10s | %9s %9s %9s %7s %8s | %10s %10s %10s %10s %8s\n", "field", "pred", "bound",
                    "E", "MiB/rank", "max_MiB", "raw_MiB", "ratio", "err/E", "time(us)", "def(us)", "ring(us)",
                    "mpi(us)", "speedup");
      }
      for (double rel : o.eb_bounds) {
        const double bound = rel * range;
        std::vector<double> tc, tm, tr;
        for (int it = 0; it < o.warmup + o.iters; ++it) {
          const auto all = time_rotation(it, input.data(), work.data(), n, mt, ring_comm,
                                         [&](T* data) { plan.run(data, n, bound); });
          if (it >= o.warmup) {
            tc.push_back(all[0]);
            tm.push_back(all[1]);
            tr.push_back(all[2]);
          }
        }
        // One more call on fresh data: its error on every element and its bytes.
        std::memcpy(work.data(), input.data(), n * sizeof(T));
        plan.run(work.data(), n, bound);
        const cgx::error_bounded_stats st = plan.stats();
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(static_cast<double>(work[i]) - exact[i]));
        double sums[2] = {static_cast<double>(st.bytes_sent), static_cast<double>(st.raw_bytes)};
        double most[2] = {static_cast<double>(st.bytes_sent), worst};
        MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        const double err_over = most[1] / bound;
        if (!(err_over <= 1.0)) rc = 3;
        if (rank != 0) continue;
        const double tcg = median(tc), tdef = median(tm), tring = median(tr);
        const bool ring_better = ring_comm != MPI_COMM_NULL && tring < tdef;
        const double tb = ring_better ? tring : tdef;
        const double mib = 1024.0 * 1024.0;
        const double per_rank = sums[0] / p, raw_per_rank = sums[1] / p;
        const double ratio = sums[0] > 0 ? sums[1] / sums[0] : 1.0;
        char ring_us[32] = "-", ring_s[32] = "null";
        if (ring_comm != MPI_COMM_NULL) {
          std::snprintf(ring_us, sizeof ring_us, "%.1f", tring * 1e6);
          std::snprintf(ring_s, sizeof ring_s, "%.6e", tring);
        }
        std::fprintf(stderr, "\r");
        std::printf("%7s %5s %8.0e %10.3e | %9.2f %9.2f %9.2f %6.2fx %8.4f | %10.1f %10.1f %10s %10.1f %7.2fx%s\n",
                    field.c_str(), prediction.c_str(), rel, bound, per_rank / mib, most[0] / mib, raw_per_rank / mib,
                    ratio, err_over, tcg * 1e6, tdef * 1e6, ring_us, tb * 1e6, tb / tcg,
                    st.native ? "  (native)" : "");
        std::fflush(stdout);
        if (js) {
          std::fprintf(js,
                       "%s  {\"kind\": \"error_bounded\", \"field\": \"%s\", \"prediction\": \"%s\", "
                       "\"bound_rel\": %.3e, \"bound\": %.6e, \"range\": %.6e, \"bytes\": %zu, \"count\": %zu, "
                       "\"dtype\": \"%s\", \"ranks\": %d, \"reducer\": \"%s\", \"transport\": \"%s\", \"bucket\": 1024, "
                       "\"link\": \"%s\", \"iters\": %d, \"isa\": \"%s\", \"threads\": %d, \"native\": %s, "
                       "\"sent_bytes_per_rank\": %.1f, \"sent_bytes_max_rank\": %.0f, \"raw_bytes_per_rank\": %.1f, "
                       "\"ratio\": %.4f, \"max_err_over_bound\": %.6f, \"time_s\": %.6e, \"mpi_time_s\": %.6e, "
                       "\"mpi_default_time_s\": %.6e, \"mpi_ring_time_s\": %s, \"baseline\": \"%s\", \"speedup\": %.5f}",
                       first_record ? "" : ",\n", field.c_str(), prediction.c_str(), rel, bound, range, n * sizeof(T), n,
                       o.dtype.c_str(), p, o.reducer.c_str(), o.transport.c_str(), o.link.c_str(), o.iters,
                       cgx::quant::to_string(cgx::quant::active_host_isa()), o.threads, st.native ? "true" : "false",
                       per_rank, most[0], raw_per_rank, ratio, err_over, tcg, tb, tdef, ring_s,
                       ring_better ? "ring" : "default", tb / tcg);
          first_record = false;
        }
      }
    }
  }
  if (rc != 0 && rank == 0) std::fprintf(stderr, "allreduce_bench: an error-bounded row exceeded its bound\n");
  return rc;
}

template <class T>
int run(const options& o, int rank, int p) {
  const MPI_Datatype mt = std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
  const std::size_t max_count = o.max_bytes / sizeof(T);
  std::vector<T> input(max_count), work(max_count);
  const MPI_Comm ring_comm = ring_baseline_comm();
  fill(input, rank);
  std::vector<runner> plans;
  if (!o.eb_only)
    for (int b : o.bits)
      for (std::size_t nb : o.native_below) {
        options one = o;
        one.native_below = {nb};
        plans.push_back(make_runner<T>(b, max_count, one));
        plans.back().bits = b;
        plans.back().asked = nb;
      }

  FILE* js = nullptr;
  if (rank == 0 && !o.json.empty()) {
    js = std::fopen(o.json.c_str(), "w");
    if (!js) usage_error("cannot write " + o.json);
    std::fprintf(js, "[\n");
  }
  bool first_record = true;
  const bool roofline = o.reducer == "sra" || o.reducer == "ring";
  // The copy bandwidth every rank sees while all copy at once; the slowest rank's.
  double copy_bps = cgx::model::copy_bandwidth(std::size_t{64} << 20, [] { MPI_Barrier(MPI_COMM_WORLD); });
  MPI_Allreduce(MPI_IN_PLACE, &copy_bps, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  const double link_bps = cgx::model::link_rate_bps(o.link);
  if (rank == 0) {
    std::printf("# allreduce_bench: %d ranks, dtype %s, reducer %s, transport %s, bucket %d, rounding %s, link %s\n", p,
                o.dtype.c_str(), o.reducer.c_str(), o.transport.c_str(), o.bucket, o.rounding.c_str(), o.link.c_str());
    std::printf("# host kernels: %s (this CPU's best: %s), %d thread(s) per rank%s\n",
                cgx::quant::to_string(cgx::quant::active_host_isa()), cgx::quant::to_string(cgx::quant::detected_host_isa()),
                o.threads, o.verify ? ", messages checksummed (--verify: CRC-32C)" : "");
    if (o.passes == 1)
      std::printf("# time: median over %d iterations (after %d warm-up) of the max over ranks; MPI_Allreduce timed in "
                  "the same loop\n", o.iters, o.warmup);
    else
      std::printf("# time: median over %d passes of the sweep x %d iterations (each after %d warm-up) of the max over "
                  "ranks; MPI_Allreduce timed in the same loop\n", o.passes, o.iters, o.warmup);
    std::printf("# mpi: the better of Open MPI's default allreduce (def) and its ring (ring: %s); speedup = mpi / time\n",
                ring_comm != MPI_COMM_NULL ? "timed" : "not available, see the file comment");
    char rate[64] = " (rate unknown: no wire column)";
    if (link_bps > 0) std::snprintf(rate, sizeof rate, " at %.3f Gbit/s, shared by the ranks", link_bps / 1e9);
    std::printf("# roofline: copy bandwidth %.2f GB/s per rank (read + written, all %d ranks copying 64 MiB at once, "
                "measured now); link %s%s; floor = 2 n sizeof(T) + 4 (p-1)/p w bytes at that bandwidth, wire = "
                "2 (p-1) w over the link%s\n",
                copy_bps / 1e9, p, o.link.c_str(), rate, roofline ? "" : " (sra and ring rows only)");
    for (std::size_t k = 0; k < plans.size() && k < o.native_below.size(); ++k) {
      if (plans[k].native_below == cgx::auto_threshold)
        std::printf("# cgx (auto) chooses per size class between compressing and MPI_Allreduce by timing both "
                    "(native_below_bytes auto_threshold)\n");
      else
        std::printf("# cgx hands calls under %zu bytes to MPI_Allreduce (native_below_bytes%s)\n", plans[k].native_below,
                    plans[k].asked == cgx::static_threshold ? ", static pick" : "");
    }
    if (!o.eb_only)
      std::printf("%12s %11s %6s %7s %4s %6s | %10s %8s %8s | %10s %10s %10s %8s | %7s %10s %10s | %9s %9s %7s\n",
                  "size(B)", "count", "type", "reducer", "bits", "bucket", "time(us)", "algbw", "busbw", "def(us)",
                  "ring(us)", "mpi(us)", "speedup", "ratio", "max_abs", "rel_l2", "floor(us)", "wire(us)", "x_roof");
  }
  std::vector<std::size_t> counts;
  if (!o.eb_only) {
    for (double sz = static_cast<double>(o.min_bytes); sz <= static_cast<double>(o.max_bytes) * 1.0000001; sz *= o.factor)
      if (const std::size_t n = static_cast<std::size_t>(sz) / sizeof(T); n != 0) counts.push_back(n);
  }
  // Each row's times (cgx, MPI default, MPI ring), gathered over the passes.
  struct samples {
    std::vector<double> tc, tm, tr;
  };
  std::vector<samples> rows(counts.size() * plans.size());
  std::vector<double> exact;
  for (int pass = 0; pass < o.passes; ++pass) {
    for (std::size_t row = 0; row < counts.size(); ++row) {
      const std::size_t n = counts[row];
      const bool last_pass = pass + 1 == o.passes;
      if (o.check && last_pass) {
        exact.assign(input.begin(), input.begin() + static_cast<std::ptrdiff_t>(n));
        MPI_Allreduce(MPI_IN_PLACE, exact.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      }
      for (std::size_t k = 0; k < plans.size(); ++k) {
        if (rank == 0) {
          if (o.passes > 1) std::fprintf(stderr, "\r[bench] pass %d/%d, ", pass + 1, o.passes);
          else std::fprintf(stderr, "\r[bench] ");
          std::fprintf(stderr, "%zu bytes, %d bits ...      ", n * sizeof(T), plans[k].bits);
        }
        auto& [tc, tm, tr] = rows[row * plans.size() + k];
        for (int it = 0; it < o.warmup + o.iters; ++it) {
          const auto all = time_rotation(it, input.data(), work.data(), n, mt, ring_comm,
                                         [&](T* data) { plans[k].run(data, n); });
          if (it >= o.warmup) {
            tc.push_back(all[0]);
            tm.push_back(all[1]);
            tr.push_back(all[2]);
          }
        }
        if (!last_pass) continue;
        double max_abs = 0, rel = 0;
        if (o.check) {
          std::memcpy(work.data(), input.data(), n * sizeof(T));
          plans[k].run(work.data(), n);
          double num = 0, den = 0;
          for (std::size_t i = 0; i < n; ++i) {
            const double e = static_cast<double>(work[i]) - exact[i];
            max_abs = std::max(max_abs, std::fabs(e));
            num += e * e;
            den += exact[i] * exact[i];
          }
          rel = den > 0 ? std::sqrt(num / den) : 0;
        }
        if (rank == 0) {
          const double t = median(tc), tdef = median(tm), tring = median(tr);
          const bool ring_better = ring_comm != MPI_COMM_NULL && tring < tdef;
          const double tb = ring_better ? tring : tdef;
          const bool measured = plans[k].native_below == cgx::auto_threshold;
          const char* auto_note = !measured ? "" : plans[k].last_native() ? "  auto:mpi" : "  auto:cgx";
          char nb_js[64];
          if (measured)
            std::snprintf(nb_js, sizeof nb_js, "\"auto\", \"auto_pick\": \"%s\"", plans[k].last_native() ? "mpi" : "cgx");
          else
            std::snprintf(nb_js, sizeof nb_js, "%zu", plans[k].native_below);
          const double bytes = static_cast<double>(n * sizeof(T));
          const double algbw = bytes / t / 1e9, busbw = algbw * 2.0 * (p - 1) / p;
          const std::size_t w = wire_bytes<T>(plans[k].bits, o.bucket, n);
          const double ratio = bytes / static_cast<double>(std::max<std::size_t>(1, w));
          const cgx::model::roofline f = cgx::model::allreduce_roofline(n, sizeof(T), w, p, copy_bps, link_bps);
          char floor_us[32] = "-", wire_us[32] = "-", x_roof[32] = "-", wire_js[32] = "null", roof_js[96] = "";
          if (roofline) {
            std::snprintf(floor_us, sizeof floor_us, "%.1f", f.mem_s * 1e6);
            std::snprintf(x_roof, sizeof x_roof, "%.2fx", t / f.bound_s());
            if (f.wire_s > 0) {
              std::snprintf(wire_us, sizeof wire_us, "%.1f", f.wire_s * 1e6);
              std::snprintf(wire_js, sizeof wire_js, "%.6e", f.wire_s);
            }
            std::snprintf(roof_js, sizeof roof_js, ", \"mem_bytes\": %.0f, \"mem_floor_s\": %.6e, \"x_roof\": %.4f",
                          f.mem_bytes, f.mem_s, t / f.bound_s());
          }
          std::fprintf(stderr, "\r");
          char ring_us[32] = "-", ring_s[32] = "null";
          if (ring_comm != MPI_COMM_NULL) {
            std::snprintf(ring_us, sizeof ring_us, "%.1f", tring * 1e6);
            std::snprintf(ring_s, sizeof ring_s, "%.6e", tring);
          }
          std::printf("%12zu %11zu %6s %7s %4d %6d | %10.1f %8.3f %8.3f | %10.1f %10s %10.1f %7.2fx | %6.2fx %10.3e %10.3e "
                      "| %9s %9s %7s%s\n",
                      n * sizeof(T), n, o.dtype.c_str(), o.reducer.c_str(), plans[k].bits, o.bucket, t * 1e6, algbw, busbw,
                      tdef * 1e6, ring_us, tb * 1e6, tb / t, ratio, max_abs, rel, floor_us, wire_us, x_roof, auto_note);
          std::fflush(stdout);
          if (js) {
            std::fprintf(js,
                         "%s  {\"bytes\": %zu, \"count\": %zu, \"dtype\": \"%s\", \"ranks\": %d, \"reducer\": \"%s\", "
                         "\"transport\": \"%s\", \"bits\": %d, \"bucket\": %d, \"rounding\": \"%s\", \"link\": \"%s\", "
                         "\"iters\": %d, \"passes\": %d, \"isa\": \"%s\", \"threads\": %d, "
                         "\"time_s\": %.6e, \"algbw_gbps\": %.5f, \"busbw_gbps\": %.5f, \"mpi_time_s\": %.6e, "
                         "\"mpi_default_time_s\": %.6e, \"mpi_ring_time_s\": %s, \"baseline\": \"%s\", "
                         "\"speedup\": %.5f, \"ratio\": %.4f, \"max_abs_err\": %.6e, \"rel_l2\": %.6e, "
                         "\"copy_bw_gbps\": %.4f, \"wire_s\": %s%s, \"native_below\": %s}",
                         first_record ? "" : ",\n", n * sizeof(T), n, o.dtype.c_str(), p, o.reducer.c_str(),
                         o.transport.c_str(), plans[k].bits, o.bucket, o.rounding.c_str(), o.link.c_str(), o.iters, o.passes,
                         cgx::quant::to_string(cgx::quant::active_host_isa()), o.threads, t,
                         algbw, busbw,
                         tb, tdef, ring_s,
                         ring_better ? "ring" : "default", tb / t, ratio, max_abs, rel, copy_bps / 1e9,
                         roofline ? wire_js : "null", roof_js, nb_js);
            first_record = false;
          }
        }
      }
    }
  }
  int rc = 0;
  if (!o.eb_fields.empty()) rc = run_eb<T>(o, rank, p, input, work, ring_comm, js, first_record);
  if (js) {
    std::fprintf(js, "\n]\n");
    std::fclose(js);
  }
  if (rank == 0) std::fprintf(stderr, "\r[bench] done.                              \n");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  {
    // --project needs no MPI launch: answer it before MPI_Init.
    const options o = parse(argc, argv);
    if (!o.project.empty()) {
      try {
        if (o.project == "all")
          for (const auto& m : cgx::model::profiles) project(m, static_cast<double>(o.project_bytes));
        else
          project(cgx::model::profile(o.project), static_cast<double>(o.project_bytes));
      } catch (const cgx::error& e) {
        std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
        return 2;
      }
      return 0;
    }
  }
  MPI_Init(&argc, &argv);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const options o = parse(argc, argv);
  int rc = 0;
  try {
    if (o.dtype == "float") rc = run<float>(o, rank, p);
    else if (o.dtype == "double") rc = run<double>(o, rank, p);
    else usage_error("unknown dtype " + o.dtype);
  } catch (const cgx::error& e) {
    std::fprintf(stderr, "allreduce_bench (rank %d): %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
