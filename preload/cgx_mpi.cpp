/// \file cgx_mpi.cpp
/// libcgx_mpi: an MPI profiling-interface (PMPI) library that turns the opted-in
/// MPI_Allreduce calls of an unmodified MPI program into cgx's compressed allreduce
/// (docs/preload.md). Preloaded (LD_PRELOAD) or linked before MPI.
///
/// What is intercepted, and why:
///  - MPI_Allreduce: the calls of MPI_FLOAT / MPI_REAL(4) or MPI_DOUBLE /
///    MPI_DOUBLE_PRECISION / MPI_REAL8 with MPI_SUM on an opted-in intra-communicator of
///    more than one rank, of at least the minimum size, go to a cgx plan; everything else
///    goes to PMPI_Allreduce with the caller's arguments, unchanged.
///  - MPI_Comm_set_info, MPI_Comm_dup_with_info: the opt-in keys (cgx_bits,
///    cgx_error_bound, cgx_min_bytes) are remembered here, per communicator: Open MPI 4.1
///    and MPICH 4.0 both drop unknown keys (MPI_Comm_get_info does not return them).
///  - MPI_Comm_dup: the copy keeps its parent's keys (MPI-4: a duplicate keeps the hints).
///  - MPI_Comm_free, MPI_Finalize: the plans of the communicator (all plans) are released
///    first, then the report is printed (CGX_MPI_REPORT=1) and MPI is called.
///  - Under Open MPI the Fortran bindings (mpif.h, `use mpi`, `use mpi_f08`) call
///    PMPI_* directly, so their entry points (mpi_allreduce_, mpi_finalize_, ...) are
///    intercepted too and forward to the next definition (dlsym(RTLD_NEXT)). MPICH's
///    Fortran bindings call the C MPI_* functions, which are intercepted above.
///
/// Every MPI call cgx itself makes while a plan is built, run or freed (on the plan's own
/// duplicated communicators) goes straight to PMPI: a thread-local depth counter.

#include <dlfcn.h>
#include <mpi.h>

#include <cgx/error.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plans.hpp"

#define CGX_PRELOAD_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using clock_type = std::chrono::steady_clock;

// ---- re-entry: cgx's own MPI calls go straight to PMPI ------------------------------

thread_local int inside = 0;

struct inside_cgx {
  inside_cgx() noexcept { ++inside; }
  ~inside_cgx() { --inside; }
  inside_cgx(const inside_cgx&) = delete;
  inside_cgx& operator=(const inside_cgx&) = delete;
};

int world_rank() noexcept {
  int init = 0, fin = 0, r = -1;
  PMPI_Initialized(&init);
  PMPI_Finalized(&fin);
  if (init && !fin) PMPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void say(const std::string& what) noexcept {
  std::fprintf(stderr, "cgx_mpi (rank %d): %s\n", world_rank(), what.c_str());
  std::fflush(stderr);
}

// ---- settings: environment and info keys --------------------------------------------

/// What an opted-in communicator gets: a bit width (maxmin) or an absolute bound.
struct setting {
  int bits = 0;         ///< 1..8: maxmin; 0 with bound > 0: error-bounded; both 0: not opted in
  double bound = 0;     ///< the absolute error bound of every element of the result
  std::optional<std::size_t> min_bytes;  ///< calls of fewer bytes stay exact; unset: the default
  [[nodiscard]] bool on() const noexcept { return bits > 0 || bound > 0; }
};

/// The interposer's threshold when neither CGX_MPI_MIN_BYTES nor cgx_min_bytes is given:
/// 64 KiB, cgx's own threshold across nodes (cgx::default_native_below_bytes,
/// docs/threshold.md). Below it every call stays exact; above it the plan still picks its
/// own threshold (larger on one node).
constexpr std::size_t default_min_bytes = std::size_t{64} << 10;

std::optional<int> parse_bits(const char* s) {
  if (s == nullptr || *s == 0) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (*end != 0 || errno != 0 || v < 0 || v > 8) return std::nullopt;
  return static_cast<int>(v);
}

std::optional<double> parse_bound(const char* s) {
  if (s == nullptr || *s == 0) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (*end != 0 || errno != 0 || !std::isfinite(v) || v < 0) return std::nullopt;
  return v;
}

/// "65536", "64k", "64K", "16m", "1g" (KiB, MiB, GiB).
std::optional<std::size_t> parse_bytes(const char* s) {
  if (s == nullptr || *s == 0 || *s == '-') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s) return std::nullopt;
  unsigned shift = 0;
  if (*end == 'k' || *end == 'K') shift = 10;
  if (*end == 'm' || *end == 'M') shift = 20;
  if (*end == 'g' || *end == 'G') shift = 30;
  if (shift != 0) ++end;
  if (*end != 0 || v > (std::numeric_limits<std::size_t>::max() >> shift)) return std::nullopt;
  return static_cast<std::size_t>(v) << shift;
}

bool is_off(const char* s) {
  return std::strcmp(s, "off") == 0 || std::strcmp(s, "none") == 0 || std::strcmp(s, "0") == 0;
}

/// Reads bits / bound / min-bytes from three strings (environment or info values); a
/// bad value is reported on stderr (`where` names its source) and leaves compression off.
setting read_setting(const char* bits, const char* bound, const char* min_bytes, const char* where,
                     const char* bits_name, const char* bound_name, const char* min_name) {
  setting s;
  const bool has_bits = bits != nullptr && *bits != 0 && !is_off(bits);
  const bool has_bound = bound != nullptr && *bound != 0 && !is_off(bound);
  if (has_bits && has_bound) {
    say(std::string(where) + ": both " + bits_name + " and " + bound_name + " are set; choose one. MPI_Allreduce stays uncompressed");
    return s;
  }
  if (has_bits) {
    const auto b = parse_bits(bits);
    if (!b || *b == 0) {
      say(std::string(where) + ": " + bits_name + "='" + bits + "' is not a bit width 1..8; MPI_Allreduce stays uncompressed");
      return s;
    }
    s.bits = *b;
  }
  if (has_bound) {
    const auto e = parse_bound(bound);
    if (!e || *e <= 0) {
      say(std::string(where) + ": " + bound_name + "='" + bound +
          "' is not a positive finite absolute error bound; MPI_Allreduce stays uncompressed");
      return s;
    }
    s.bound = *e;
  }
  if (min_bytes != nullptr && *min_bytes != 0) {
    const auto m = parse_bytes(min_bytes);
    if (!m) {
      say(std::string(where) + ": " + min_name + "='" + min_bytes + "' is not a byte count (e.g. 65536, 64k, 1m); " +
          "using the default, " + std::to_string(default_min_bytes));
    } else {
      s.min_bytes = *m;
    }
  }
  return s;
}

struct config {
  setting env;          // CGX_MPI_BITS / CGX_MPI_ERROR_BOUND / CGX_MPI_MIN_BYTES: every communicator
  bool report = false;  // CGX_MPI_REPORT=1
  bool collective_check = false;  // CGX_MPI_CHECK=collective
};

const config& cfg() {
  static const config c = [] {
    config k;
    k.env = read_setting(std::getenv("CGX_MPI_BITS"), std::getenv("CGX_MPI_ERROR_BOUND"), std::getenv("CGX_MPI_MIN_BYTES"),
                         "environment", "CGX_MPI_BITS", "CGX_MPI_ERROR_BOUND", "CGX_MPI_MIN_BYTES");
    const char* r = std::getenv("CGX_MPI_REPORT");
    k.report = r != nullptr && *r != 0 && std::strcmp(r, "0") != 0;
    const char* chk = std::getenv("CGX_MPI_CHECK");
    k.collective_check = chk != nullptr && std::strcmp(chk, "collective") == 0;
    return k;
  }();
  return c;
}

/// An info value, or "" when the key is absent.
std::string info_value(MPI_Info info, const char* key) {
  char buf[256] = {0};
  int flag = 0;
  if (info == MPI_INFO_NULL) return {};
  if (PMPI_Info_get(info, key, static_cast<int>(sizeof(buf)) - 1, buf, &flag) != MPI_SUCCESS || !flag) return {};
  return buf;
}

// ---- statistics (CGX_MPI_REPORT) ----------------------------------------------------

enum counter : int {
  n_compressed,    // calls that ran cgx's compressed schedule
  n_native,        // opted in, but the plan sent them with MPI_Allreduce (its own threshold)
  n_small,         // opted in, under the minimum size: exact
  n_passed,        // everything else: PMPI unchanged
  n_failed,        // calls that ended in an error
  n_plans,         // plans built
  b_user,          // bytes of the compressed calls' buffers
  b_raw,           // bytes the schedule would have sent uncompressed
  b_sent,          // bytes it sent
  t_cgx_ns,        // time in compressed and native-in-plan calls, plan building included
  n_counters
};
std::atomic<std::uint64_t> stats[n_counters];

void add(counter c, std::uint64_t v) noexcept { stats[c].fetch_add(v, std::memory_order_relaxed); }

// ---- the communicator table ----------------------------------------------------------

/// What the interposer knows about one of the caller's communicators.
struct comm_entry {
  std::optional<setting> info;  // from cgx_* info keys (overrides the environment)
  int size = -1;                // -1: not asked yet
  bool inter = false;
  std::uint64_t seq = 0;        // creation order: plans are freed in it, the same on every rank
  std::mutex call;              // one cgx call at a time per communicator (MPI_THREAD_MULTIPLE)
  std::map<int, std::unique_ptr<cgx_preload::plan>> plans;  // key: 16 * (0 float, 1 double) + bits
};

std::mutex table_lock;
// Never destroyed: a program that exits without MPI_Finalize (or whose Fortran
// MPI_Finalize does not reach this library: MPICH's mpi_f08) must not have its plans freed,
// with MPI calls, by a static destructor after main returns.
std::map<MPI_Comm, std::shared_ptr<comm_entry>>& table = *new std::map<MPI_Comm, std::shared_ptr<comm_entry>>;
std::uint64_t next_seq = 0;
std::atomic<bool> any_info{false};  // some communicator carries cgx_* keys

std::shared_ptr<comm_entry> find_entry(MPI_Comm c) {
  const std::lock_guard<std::mutex> g(table_lock);
  const auto it = table.find(c);
  return it == table.end() ? nullptr : it->second;
}

std::shared_ptr<comm_entry> get_entry(MPI_Comm c) {
  const std::lock_guard<std::mutex> g(table_lock);
  auto& e = table[c];
  if (!e) {
    e = std::make_shared<comm_entry>();
    e->seq = next_seq++;
  }
  return e;
}

/// Records the cgx_* keys of `info` for communicator c (MPI_Comm_set_info,
/// MPI_Comm_dup_with_info). `replace`: the communicator's keys are exactly these (a new
/// communicator); otherwise keys absent from info leave the earlier ones.
void record_info(MPI_Comm c, MPI_Info info, bool replace) {
  if (c == MPI_COMM_NULL) return;
  const std::string bits = info_value(info, "cgx_bits");
  const std::string bound = info_value(info, "cgx_error_bound");
  const std::string min = info_value(info, "cgx_min_bytes");
  if (bits.empty() && bound.empty() && min.empty()) {
    if (replace) {
      const auto e = find_entry(c);
      if (e) e->info.reset();
    }
    return;
  }
  const auto e = get_entry(c);
  setting s = read_setting(bits.c_str(), bound.c_str(), min.c_str(), "MPI_Comm_set_info", "cgx_bits", "cgx_error_bound",
                           "cgx_min_bytes");
  if (!replace && e->info && bits.empty() && bound.empty()) {  // only cgx_min_bytes changed
    setting old = *e->info;
    old.min_bytes = s.min_bytes;
    s = old;
  }
  if (bits.empty() && bound.empty() && !replace && !e->info) {
    // cgx_min_bytes alone on a communicator opted in by the environment.
    s.bits = cfg().env.bits;
    s.bound = cfg().env.bound;
  }
  e->info = s;
  any_info.store(true, std::memory_order_release);
}

/// A duplicate keeps its parent's keys.
void inherit(MPI_Comm parent, MPI_Comm child) {
  if (child == MPI_COMM_NULL) return;
  const auto p = find_entry(parent);
  if (!p || !p->info) return;
  get_entry(child)->info = p->info;
}

/// Frees the plans of one entry, in key order (the same on every rank).
void release_plans(comm_entry& e) noexcept {
  const inside_cgx guard;
  for (auto& kv : e.plans) {
    try {
      kv.second.reset();
    } catch (...) {  // a destructor that throws: nothing to do but go on
    }
  }
  e.plans.clear();
}

/// MPI_Comm_free: the communicator's plans go first.
void forget(MPI_Comm c) noexcept {
  std::shared_ptr<comm_entry> e;
  {
    const std::lock_guard<std::mutex> g(table_lock);
    const auto it = table.find(c);
    if (it == table.end()) return;
    e = std::move(it->second);
    table.erase(it);
  }
  const std::lock_guard<std::mutex> g(e->call);
  release_plans(*e);
}

/// Drops the plan of a failed call: a failed plan refuses every later call, and the next
/// call builds a new one (every rank of a failed call throws, so all rebuild together).
void release_one(comm_entry& e, int key) noexcept {
  const auto it = e.plans.find(key);
  if (it == e.plans.end()) return;
  const inside_cgx guard;
  try {
    it->second.reset();
  } catch (...) {
  }
  e.plans.erase(it);
}

// ---- the report ----------------------------------------------------------------------

std::string mib(double bytes) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return b;
}

void print_report() {
  const inside_cgx guard;
  std::uint64_t mine[n_counters];
  for (int i = 0; i < n_counters; ++i) mine[i] = stats[i].load();
  std::uint64_t sum[n_counters] = {}, max[n_counters] = {};
  int rank = 0, size = 1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  PMPI_Reduce(mine, sum, n_counters, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  PMPI_Reduce(mine, max, n_counters, MPI_UINT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  const auto& c = cfg();
  int level = MPI_THREAD_SINGLE;
  PMPI_Query_thread(&level);
  std::string mode = "info keys only";
  if (c.env.bits > 0) mode = "CGX_MPI_BITS=" + std::to_string(c.env.bits);
  if (c.env.bound > 0) {
    char b[64];
    std::snprintf(b, sizeof(b), "CGX_MPI_ERROR_BOUND=%g", c.env.bound);
    mode = b;
  }
  std::fprintf(stderr,
               "cgx_mpi report (%d ranks, %s): MPI_Allreduce calls, all ranks: %llu compressed, %llu opted in but "
               "sent uncompressed by cgx (below its threshold), %llu opted in but below the minimum size (exact), "
               "%llu passed through unchanged, %llu failed; plans built: %llu%s\n",
               size, mode.c_str(), static_cast<unsigned long long>(sum[n_compressed]),
               static_cast<unsigned long long>(sum[n_native]), static_cast<unsigned long long>(sum[n_small]),
               static_cast<unsigned long long>(sum[n_passed]), static_cast<unsigned long long>(sum[n_failed]),
               static_cast<unsigned long long>(sum[n_plans]),
               level == MPI_THREAD_MULTIPLE ? " (MPI_THREAD_MULTIPLE: one cgx call at a time per communicator)" : "");
  const double raw = static_cast<double>(sum[b_raw]), sent = static_cast<double>(sum[b_sent]);
  std::fprintf(stderr,
               "cgx_mpi report: compressed calls reduced %s of buffers; sent %s instead of %s (%.2fx, %s saved, all "
               "ranks); time in cgx: %.3f s on the slowest rank (%.3f s all ranks)\n",
               mib(static_cast<double>(sum[b_user]) / size).c_str(), mib(sent).c_str(), mib(raw).c_str(),
               sent > 0 ? raw / sent : 1.0, mib(raw - sent).c_str(), static_cast<double>(max[t_cgx_ns]) * 1e-9,
               static_cast<double>(sum[t_cgx_ns]) * 1e-9);
  std::fflush(stderr);
}

/// MPI_Finalize: the report, then every plan, in creation order.
void before_finalize() noexcept {
  if (cfg().report) {
    try {
      print_report();
    } catch (...) {
    }
  }
  std::vector<std::shared_ptr<comm_entry>> all;
  {
    const std::lock_guard<std::mutex> g(table_lock);
    for (auto& kv : table) all.push_back(kv.second);
    table.clear();
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->seq < b->seq; });
  for (auto& e : all) {
    const std::lock_guard<std::mutex> g(e->call);
    release_plans(*e);
  }
}

// ---- MPI_Allreduce -------------------------------------------------------------------

/// 0: float, 1: double, -1: neither (or not a predefined type of that size).
int value_kind(MPI_Datatype t) {
  if (t == MPI_DATATYPE_NULL) return -1;
  if (t == MPI_FLOAT) return 0;
  if (t == MPI_DOUBLE) return 1;
  // The Fortran types a Fortran program's MPI_ALLREDUCE passes (real, double precision),
  // when they are IEEE binary32 / binary64 as with gfortran.
  const MPI_Datatype f32[] = {MPI_REAL, MPI_REAL4};
  const MPI_Datatype f64[] = {MPI_DOUBLE_PRECISION, MPI_REAL8};
  int size = 0;
  for (MPI_Datatype f : f32)
    if (f != MPI_DATATYPE_NULL && t == f) return PMPI_Type_size(t, &size) == MPI_SUCCESS && size == 4 ? 0 : -1;
  for (MPI_Datatype f : f64)
    if (f != MPI_DATATYPE_NULL && t == f) return PMPI_Type_size(t, &size) == MPI_SUCCESS && size == 8 ? 1 : -1;
  return -1;
}

int mpi_code(const cgx::error& e) noexcept {
  switch (e.code()) {
    case cgx::errc::invalid_argument: return MPI_ERR_ARG;
    case cgx::errc::workspace: return MPI_ERR_NO_MEM;
    default: return MPI_ERR_OTHER;
  }
}

/// Reports a failed call on stderr and through comm's error handler; returns the code.
int fail(MPI_Comm comm, int code, const std::string& what, int count) {
  add(n_failed, 1);
  say("MPI_Allreduce of " + std::to_string(count) + " values failed in cgx: " + what +
      " (the result buffer may hold partial sums; a later call builds a new plan)");
  const inside_cgx guard;
  PMPI_Comm_call_errhandler(comm, code);
  return code;
}

/// The common body of the C and Fortran MPI_Allreduce; `pass` runs the call unchanged.
template <class Pass>
int allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, Pass pass) {
  if (inside > 0) return pass();
  const config& c = cfg();
  if (!c.env.on() && !any_info.load(std::memory_order_acquire)) {
    add(n_passed, 1);
    return pass();
  }
  const int kind = op == MPI_SUM ? value_kind(type) : -1;
  if (kind < 0 || count <= 0 || comm == MPI_COMM_NULL || recvbuf == nullptr) {
    add(n_passed, 1);
    return pass();
  }
  std::shared_ptr<comm_entry> e = find_entry(comm);
  const setting s = e && e->info ? *e->info : c.env;
  if (!s.on()) {
    add(n_passed, 1);
    return pass();
  }
  const std::size_t value_bytes = kind == 0 ? sizeof(float) : sizeof(double);
  const std::size_t n = static_cast<std::size_t>(count);
  const std::size_t min_bytes = s.min_bytes ? *s.min_bytes : default_min_bytes;
  if (n * value_bytes < min_bytes) {
    add(n_small, 1);
    return pass();
  }
  if (!e) e = get_entry(comm);
  const std::lock_guard<std::mutex> g(e->call);
  if (e->size < 0) {
    int inter = 0, size = 1;
    PMPI_Comm_test_inter(comm, &inter);
    PMPI_Comm_size(comm, &size);
    e->inter = inter != 0;
    e->size = size;
  }
  if (e->inter || e->size < 2) {  // nothing to send on one rank; cgx has no inter-communicators
    add(n_passed, 1);
    return pass();
  }
  const auto t0 = clock_type::now();
  const int key = 16 * kind + s.bits;
  try {
    const inside_cgx guard;
    auto& p = e->plans[key];
    if (!p || p->capacity() < n) {
      p.reset();  // a larger size class replaces the smaller (collective: every rank has the same count)
      cgx_preload::plan_request req;
      req.comm = comm;
      req.capacity = std::bit_ceil(std::max<std::size_t>(n, 4096));
      req.bits = s.bits;
      // A threshold the user gave is the plan's too (on one node as well); otherwise the
      // plan picks its own (cgx::auto_threshold: larger on one node).
      req.native_below = s.min_bytes ? *s.min_bytes : std::numeric_limits<std::size_t>::max();
      req.collective_check = c.collective_check;
      p = kind == 0 ? cgx_preload::make_plan_f32(req) : cgx_preload::make_plan_f64(req);
      add(n_plans, 1);
    }
    if (sendbuf != MPI_IN_PLACE && sendbuf != recvbuf) std::memmove(recvbuf, sendbuf, n * value_bytes);
    const cgx_preload::traffic t = p->run(recvbuf, n, s.bound);
    add(t.native ? n_native : n_compressed, 1);
    if (!t.native) {
      add(b_user, n * value_bytes);
      add(b_raw, t.raw);
      add(b_sent, t.sent);
    }
    add(t_cgx_ns, static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count()));
    return MPI_SUCCESS;
  } catch (const cgx::error& err) {
    release_one(*e, key);
    return fail(comm, mpi_code(err), err.what(), count);
  } catch (const std::bad_alloc&) {
    release_one(*e, key);
    return fail(comm, MPI_ERR_NO_MEM, "out of memory", count);
  } catch (const std::exception& err) {
    release_one(*e, key);
    return fail(comm, MPI_ERR_OTHER, err.what(), count);
  } catch (...) {
    release_one(*e, key);
    return fail(comm, MPI_ERR_OTHER, "unknown exception", count);
  }
}

}  // namespace

// ---- the C entry points ----------------------------------------------------------------

CGX_PRELOAD_EXPORT int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                                     MPI_Comm comm) {
  return allreduce(sendbuf, recvbuf, count, datatype, op, comm,
                   [&] { return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm); });
}

CGX_PRELOAD_EXPORT int MPI_Comm_set_info(MPI_Comm comm, MPI_Info info) {
  const int rc = PMPI_Comm_set_info(comm, info);
  if (inside == 0 && rc == MPI_SUCCESS) record_info(comm, info, false);
  return rc;
}

CGX_PRELOAD_EXPORT int MPI_Comm_dup_with_info(MPI_Comm comm, MPI_Info info, MPI_Comm* newcomm) {
  const int rc = PMPI_Comm_dup_with_info(comm, info, newcomm);
  if (inside == 0 && rc == MPI_SUCCESS) record_info(*newcomm, info, true);
  return rc;
}

CGX_PRELOAD_EXPORT int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
  const int rc = PMPI_Comm_dup(comm, newcomm);
  if (inside == 0 && rc == MPI_SUCCESS) inherit(comm, *newcomm);
  return rc;
}

CGX_PRELOAD_EXPORT int MPI_Comm_free(MPI_Comm* comm) {
  if (inside == 0 && comm != nullptr) forget(*comm);
  return PMPI_Comm_free(comm);
}

CGX_PRELOAD_EXPORT int MPI_Finalize(void) {
  if (inside == 0) before_finalize();
  return PMPI_Finalize();
}

// ---- Open MPI's Fortran entry points ---------------------------------------------------
//
// Open MPI 4.1's Fortran bindings (libmpi_mpifh for mpif.h and `use mpi`, libmpi_usempif08
// for `use mpi_f08`) call PMPI_Allreduce, PMPI_Finalize, ... themselves, past the C
// symbols above. Their entry points are intercepted here and forward to the next
// definition (the MPI library's), with the caller's arguments, unless the call is one
// cgx takes. The f08 entry points take the same arguments (buffers by address, handles
// as one integer, ierror possibly absent: a null pointer). MPICH's bindings call the C
// MPI_* functions, so under MPICH nothing of this is compiled.

#if defined(OPEN_MPI) && OPEN_MPI
namespace {

using f_allreduce = void (*)(void*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using f_finalize = void (*)(MPI_Fint*);
using f_comm_free = void (*)(MPI_Fint*, MPI_Fint*);
using f_set_info = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*);
using f_dup = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*);
using f_dup_with_info = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);

template <class Fn>
Fn next_symbol(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) say(std::string("no definition of ") + name + " after libcgx_mpi (dlsym: RTLD_NEXT)");
  return reinterpret_cast<Fn>(p);
}

/// Whether a Fortran buffer argument is the address of MPI_IN_PLACE (or MPI_BOTTOM):
/// Open MPI's Fortran constants are common blocks, one symbol per name mangling.
bool is_symbol(const void* p, const char* const (&names)[4]) {
  for (const char* n : names) {
    const void* s = dlsym(RTLD_DEFAULT, n);
    if (s != nullptr && s == p) return true;
  }
  return false;
}
constexpr const char* in_place_names[4] = {"mpi_fortran_in_place_", "mpi_fortran_in_place", "mpi_fortran_in_place__",
                                            "MPI_FORTRAN_IN_PLACE"};
constexpr const char* bottom_names[4] = {"mpi_fortran_bottom_", "mpi_fortran_bottom", "mpi_fortran_bottom__",
                                          "MPI_FORTRAN_BOTTOM"};

void fortran_allreduce(f_allreduce next, void* s, void* r, MPI_Fint* n, MPI_Fint* t, MPI_Fint* o, MPI_Fint* c,
                       MPI_Fint* ierr) {
  auto pass = [&] {
    if (next == nullptr) return MPI_ERR_INTERN;
    MPI_Fint rc = MPI_SUCCESS;
    next(s, r, n, t, o, c, ierr != nullptr ? ierr : &rc);
    return static_cast<int>(ierr != nullptr ? *ierr : rc);
  };
  if (inside > 0 || next == nullptr || n == nullptr || t == nullptr || o == nullptr || c == nullptr) {
    pass();
    return;
  }
  // Only the candidates pay for the symbol lookups below.
  const MPI_Op op = PMPI_Op_f2c(*o);
  const MPI_Datatype type = PMPI_Type_f2c(*t);
  if (op != MPI_SUM || value_kind(type) < 0 || is_symbol(s, bottom_names) || is_symbol(r, bottom_names)) {
    add(n_passed, 1);
    pass();
    return;
  }
  const void* send = is_symbol(s, in_place_names) ? MPI_IN_PLACE : s;
  const int rc = allreduce(send, r, static_cast<int>(*n), type, op, PMPI_Comm_f2c(*c), pass);
  if (ierr != nullptr) *ierr = static_cast<MPI_Fint>(rc);
}

void fortran_finalize(f_finalize next, MPI_Fint* ierr) {
  if (inside == 0) before_finalize();
  MPI_Fint rc = MPI_SUCCESS;
  if (next != nullptr) next(ierr != nullptr ? ierr : &rc);
  else if (ierr != nullptr) *ierr = PMPI_Finalize();
}

void fortran_comm_free(f_comm_free next, MPI_Fint* comm, MPI_Fint* ierr) {
  if (inside == 0 && comm != nullptr) forget(PMPI_Comm_f2c(*comm));
  MPI_Fint rc = MPI_SUCCESS;
  if (next != nullptr) next(comm, ierr != nullptr ? ierr : &rc);
}

void fortran_set_info(f_set_info next, MPI_Fint* comm, MPI_Fint* info, MPI_Fint* ierr) {
  MPI_Fint rc = MPI_SUCCESS;
  MPI_Fint* e = ierr != nullptr ? ierr : &rc;
  if (next != nullptr) next(comm, info, e);
  if (inside == 0 && *e == MPI_SUCCESS) record_info(PMPI_Comm_f2c(*comm), PMPI_Info_f2c(*info), false);
}

void fortran_dup(f_dup next, MPI_Fint* comm, MPI_Fint* newcomm, MPI_Fint* ierr) {
  MPI_Fint rc = MPI_SUCCESS;
  MPI_Fint* e = ierr != nullptr ? ierr : &rc;
  if (next != nullptr) next(comm, newcomm, e);
  if (inside == 0 && *e == MPI_SUCCESS) inherit(PMPI_Comm_f2c(*comm), PMPI_Comm_f2c(*newcomm));
}

void fortran_dup_with_info(f_dup_with_info next, MPI_Fint* comm, MPI_Fint* info, MPI_Fint* newcomm, MPI_Fint* ierr) {
  MPI_Fint rc = MPI_SUCCESS;
  MPI_Fint* e = ierr != nullptr ? ierr : &rc;
  if (next != nullptr) next(comm, info, newcomm, e);
  if (inside == 0 && *e == MPI_SUCCESS) record_info(PMPI_Comm_f2c(*newcomm), PMPI_Info_f2c(*info), true);
}

}  // namespace

// One wrapper per symbol, each forwarding to the next definition of its own name.
#define CGX_F_ALLREDUCE(sym)                                                                                         \
  CGX_PRELOAD_EXPORT void sym(void* s, void* r, MPI_Fint* n, MPI_Fint* t, MPI_Fint* o, MPI_Fint* c, MPI_Fint* e) { \
    static const auto next = next_symbol<f_allreduce>(#sym);                                                        \
    fortran_allreduce(next, s, r, n, t, o, c, e);                                                                   \
  }
#define CGX_F_FINALIZE(sym)                                 \
  CGX_PRELOAD_EXPORT void sym(MPI_Fint* e) {                \
    static const auto next = next_symbol<f_finalize>(#sym); \
    fortran_finalize(next, e);                              \
  }
#define CGX_F_COMM_FREE(sym)                                 \
  CGX_PRELOAD_EXPORT void sym(MPI_Fint* c, MPI_Fint* e) {    \
    static const auto next = next_symbol<f_comm_free>(#sym); \
    fortran_comm_free(next, c, e);                           \
  }
#define CGX_F_SET_INFO(sym)                                           \
  CGX_PRELOAD_EXPORT void sym(MPI_Fint* c, MPI_Fint* i, MPI_Fint* e) { \
    static const auto next = next_symbol<f_set_info>(#sym);           \
    fortran_set_info(next, c, i, e);                                  \
  }
#define CGX_F_DUP(sym)                                                \
  CGX_PRELOAD_EXPORT void sym(MPI_Fint* c, MPI_Fint* d, MPI_Fint* e) { \
    static const auto next = next_symbol<f_dup>(#sym);                \
    fortran_dup(next, c, d, e);                                       \
  }
#define CGX_F_DUP_WITH_INFO(sym)                                                   \
  CGX_PRELOAD_EXPORT void sym(MPI_Fint* c, MPI_Fint* i, MPI_Fint* d, MPI_Fint* e) { \
    static const auto next = next_symbol<f_dup_with_info>(#sym);                   \
    fortran_dup_with_info(next, c, i, d, e);                                       \
  }
// mpif.h and `use mpi` (every mangling Open MPI defines), then `use mpi_f08`.
#define CGX_F_ALL(macro, lower, upper) macro(lower) macro(lower##_) macro(lower##__) macro(upper) macro(lower##_f08_)
CGX_F_ALL(CGX_F_ALLREDUCE, mpi_allreduce, MPI_ALLREDUCE)
CGX_F_ALL(CGX_F_FINALIZE, mpi_finalize, MPI_FINALIZE)
CGX_F_ALL(CGX_F_COMM_FREE, mpi_comm_free, MPI_COMM_FREE)
CGX_F_ALL(CGX_F_SET_INFO, mpi_comm_set_info, MPI_COMM_SET_INFO)
CGX_F_ALL(CGX_F_DUP, mpi_comm_dup, MPI_COMM_DUP)
CGX_F_ALL(CGX_F_DUP_WITH_INFO, mpi_comm_dup_with_info, MPI_COMM_DUP_WITH_INFO)
#endif  // OPEN_MPI
