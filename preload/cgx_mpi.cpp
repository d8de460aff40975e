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
///  - MPI_Finalize: every plan is released first (in the order the communicators' states
///    were made), then the report is printed (CGX_MPI_REPORT=1) and MPI is called.
///  - Under Open MPI the Fortran bindings (mpif.h, `use mpi`, `use mpi_f08`) call
///    PMPI_* directly, so their entry points (mpi_allreduce_, mpi_finalize_, ...) are
///    intercepted too and forward to the next definition (dlsym(RTLD_NEXT)). MPICH's
///    Fortran bindings call the C MPI_* functions, which are intercepted above.
///
/// What is not intercepted: a communicator's end and its duplicates. The state of a
/// communicator (its hints, its plans, cgx's control communicator) is an MPI attribute
/// on it, whose delete callback MPI runs in MPI_Comm_free, MPI_Comm_disconnect and
/// MPI_Finalize alike, and whose copy callback gives MPI_Comm_dup and MPI_Comm_idup (in
/// C and Fortran) the parent's hints.
///
/// Decisions are collective: whether a call runs, which plan (size class) serves it and
/// when a plan is rebuilt are decided from one small non-blocking reduction per
/// compressed call (the agreement, on cgx's control communicator, polled against the wait
/// limit), which every rank that completes it reads the same way (see agree()).
///
/// Every MPI call cgx itself makes while a plan is built, run or freed (on the plan's own
/// duplicated communicators) goes straight to PMPI: a thread-local depth counter.

#include <dlfcn.h>
#include <mpi.h>

#include <cgx/comm/mpi.hpp>
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
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
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
/// docs/threshold.md). Below it every call stays exact; above it the plan chooses between
/// compressing and MPI_Allreduce per size class by timing both (cgx::auto_threshold).
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

/// CGX_TIMEOUT_MS: milliseconds below 2^32 (0: no limit); unset: 10 minutes, cgx's
/// default (cgx::plan_options::timeout_ms). Empty optional: not a number.
std::optional<std::uint32_t> parse_timeout(const char* env) {
  if (env == nullptr || *env == 0) return std::uint32_t{600000};
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*env == '-' || *end != 0 || errno != 0 || v > 0xffffffffull) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

struct config {
  setting env;          // CGX_MPI_BITS / CGX_MPI_ERROR_BOUND / CGX_MPI_MIN_BYTES: every communicator
  bool report = false;  // CGX_MPI_REPORT=1
  bool collective_check = false;  // CGX_MPI_CHECK=collective
  std::uint32_t timeout_ms = 600000;  // CGX_TIMEOUT_MS: the wait limit of every call, construction included
  bool disabled = false;              // CGX_TIMEOUT_MS is malformed: nothing is compressed
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
    const char* t = std::getenv("CGX_TIMEOUT_MS");
    if (const auto ms = parse_timeout(t)) {
      k.timeout_ms = *ms;
    } else {
      say(std::string("environment: CGX_TIMEOUT_MS='") + t +
          "' is not a wait limit in milliseconds (0 to 4294967295; 0: no limit); MPI_Allreduce stays uncompressed");
      k.disabled = true;
    }
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

// ---- per-communicator state, on the communicator (an MPI attribute) -------------------
//
// What the library knows about one of the caller's communicators hangs on it as an
// attribute (MPI_Comm_create_keyval): MPI runs the delete callback when the communicator
// goes, by MPI_Comm_free, MPI_Comm_disconnect or MPI_Finalize alike, and the copy
// callback when it is duplicated (MPI_Comm_dup, MPI_Comm_idup, MPI_Comm_dup_with_info):
// a duplicate gets its parent's hints, never its plans. A handle that MPI reuses for a
// new communicator therefore never meets the old one's state.

/// cgx's two duplicates of a caller's communicator, made by the first opted-in call with
/// MPI_Comm_idup: the control communicator (the agreements and the notices) and the
/// plans' parent. When a call gives up waiting (its wait limit passed), the duplication
/// stays pending (MPI cannot cancel it) and the next call waits for it again. Its memory
/// is MPI's until it completes: when the communicator goes first, it is kept for the
/// life of the process.
struct pending_dup {
  MPI_Comm out[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

/// What one rank brings to the agreement of a call (see agree()).
struct proposal {
  std::int64_t count = 0;  ///< values
  std::int64_t key = 0;    ///< 16 * (0 float, 1 double) + bits: which plan
  std::int64_t hash = 0;   ///< the setting (bits, bound, minimum size, checking): 62 bits
  std::int64_t gen = -1;   ///< the generation of this rank's plan of that key; -1: none
  std::int64_t ever = -1;  ///< the largest generation this rank ever built on this communicator
  std::int64_t cap = -1;   ///< the capacity of that plan; -1: none
};
constexpr int n_fields = 6;

/// One call's agreement: max of (fields, -fields) over the ranks of the control
/// communicator, in flight until the call (or a later one) has processed it.
struct pending_round {
  std::int64_t index = 0;  ///< this rank's agreements on the communicator are numbered 0, 1, ...
  int kind = 0;            ///< the call's value type and setting (to build the agreed plan)
  setting s;
  std::int64_t in[2 * n_fields] = {};
  std::int64_t out[2 * n_fields] = {};
  MPI_Request req = MPI_REQUEST_NULL;
  bool abandoned = false;  ///< its call gave up waiting for it (and told the peers)
};

/// Memory that MPI may still write into (the buffers of operations that were given up on
/// and whose communicator is gone): kept for the life of the process (comm::detail::abandon).
void keep_forever(std::shared_ptr<void> p) noexcept { cgx::comm::detail::abandon({}, std::move(p)); }

struct plan_slot {
  std::unique_ptr<cgx_preload::plan> plan;
  std::int64_t gen = -1;
};

/// What the interposer knows about one of the caller's communicators.
struct comm_state {
  std::mutex info_lock;         // guards info (MPI_Comm_set_info may come from another thread)
  std::optional<setting> info;  // from cgx_* info keys (overrides the environment)
  std::uint64_t seq = 0;        // creation order: plans are freed in it at MPI_Finalize
  std::mutex call;              // one cgx call at a time per communicator (MPI_THREAD_MULTIPLE); guards the rest
  MPI_Comm control = MPI_COMM_NULL;       // cgx's duplicate for the agreements and the notices
  MPI_Comm parent = MPI_COMM_NULL;        // cgx's duplicate the plans duplicate (their construction)
  std::shared_ptr<pending_dup> creating;  // their MPI_Comm_idup, while a call gave up waiting for it
  std::deque<std::shared_ptr<pending_round>> rounds;  // posted, not yet processed; oldest first
  std::int64_t next_round = 0;            // the index of this rank's next agreement
  std::int64_t abandoned = -1;            // the largest agreement index a peer said it gave up on
  std::vector<std::shared_ptr<std::int64_t>> notices;  // the buffers of the notices sent
  std::map<int, plan_slot> plans;         // key: 16 * (0 float, 1 double) + bits
  std::int64_t ever = -1;                 // the largest plan generation built here
  bool finalized = false;                 // MPI_Finalize released everything (no more MPI calls)

  std::optional<setting> hints() {
    const std::lock_guard<std::mutex> g(info_lock);
    return info;
  }
};

std::mutex registry_lock;
// Every live state, for MPI_Finalize's ordered release. Never destroyed: a program that
// exits without MPI_Finalize must not have its plans freed, with MPI calls, by a static
// destructor after main returns.
std::map<std::uint64_t, comm_state*>& registry = *new std::map<std::uint64_t, comm_state*>;
std::uint64_t next_seq = 0;
std::atomic<bool> any_info{false};  // some communicator carries cgx_* keys
std::atomic<int> keyval{MPI_KEYVAL_INVALID};

comm_state* new_state() {
  auto* s = new comm_state;
  const std::lock_guard<std::mutex> g(registry_lock);
  s->seq = next_seq++;
  try {
    registry.emplace(s->seq, s);
  } catch (...) {
    delete s;
    throw;
  }
  return s;
}

/// Frees the plans of one state, in key order (the same on every rank), then its
/// control communicator. Call with s.call held.
void release_plans(comm_state& s) noexcept {
  const inside_cgx guard;
  for (auto& kv : s.plans) {
    try {
      kv.second.plan.reset();
    } catch (...) {  // a destructor that throws: nothing to do but go on
    }
  }
  s.plans.clear();
  // Pending operations on them complete normally (MPI_Comm_free).
  if (s.control != MPI_COMM_NULL) PMPI_Comm_free(&s.control);
  if (s.parent != MPI_COMM_NULL) PMPI_Comm_free(&s.parent);
  if (s.creating) keep_forever(std::move(s.creating));
  for (auto& r : s.rounds) keep_forever(std::move(r));
  s.rounds.clear();
  for (auto& n : s.notices) keep_forever(std::move(n));
  s.notices.clear();
}

/// The attribute's delete callback: MPI_Comm_free, MPI_Comm_disconnect, MPI_Finalize.
int delete_state(MPI_Comm, int, void* attr, void*) {
  auto* s = static_cast<comm_state*>(attr);
  if (s == nullptr) return MPI_SUCCESS;
  {
    const std::lock_guard<std::mutex> g(registry_lock);
    registry.erase(s->seq);
  }
  {
    const std::lock_guard<std::mutex> g(s->call);
    if (!s->finalized) release_plans(*s);
  }
  delete s;
  return MPI_SUCCESS;
}

/// The attribute's copy callback: a duplicate keeps its parent's hints (MPI-4: duplicates
/// keep the hints), never its plans or control communicator.
int copy_state(MPI_Comm, int, void*, void* in, void* out, int* flag) {
  *flag = 0;
  auto* parent = static_cast<comm_state*>(in);
  if (parent == nullptr) return MPI_SUCCESS;
  const std::optional<setting> h = parent->hints();
  if (!h) return MPI_SUCCESS;
  try {
    comm_state* s = new_state();
    s->info = h;
    *static_cast<void**>(out) = s;
    *flag = 1;
  } catch (...) {
    return MPI_ERR_NO_MEM;
  }
  return MPI_SUCCESS;
}

/// The keyval, created on first use (MPI is initialized by then).
int the_keyval() {
  int k = keyval.load(std::memory_order_acquire);
  if (k != MPI_KEYVAL_INVALID) return k;
  static std::mutex lock;
  const std::lock_guard<std::mutex> g(lock);
  k = keyval.load(std::memory_order_acquire);
  if (k == MPI_KEYVAL_INVALID) {
    if (PMPI_Comm_create_keyval(copy_state, delete_state, &k, nullptr) != MPI_SUCCESS)
      throw cgx::error(cgx::errc::transport, "MPI_Comm_create_keyval failed");
    keyval.store(k, std::memory_order_release);
  }
  return k;
}

/// The state of c, or null.
comm_state* find_state(MPI_Comm c) {
  const int k = keyval.load(std::memory_order_acquire);
  if (k == MPI_KEYVAL_INVALID || c == MPI_COMM_NULL) return nullptr;
  void* v = nullptr;
  int flag = 0;
  if (PMPI_Comm_get_attr(c, k, &v, &flag) != MPI_SUCCESS || !flag) return nullptr;
  return static_cast<comm_state*>(v);
}

/// The state of c, made (and attached) when it has none.
comm_state* get_state(MPI_Comm c) {
  static std::mutex lock;  // two threads must not attach two states to one communicator
  const int k = the_keyval();
  const std::lock_guard<std::mutex> g(lock);
  if (comm_state* s = find_state(c)) return s;
  comm_state* s = new_state();
  if (PMPI_Comm_set_attr(c, k, s) != MPI_SUCCESS) {
    delete_state(c, k, s, nullptr);
    throw cgx::error(cgx::errc::transport, "MPI_Comm_set_attr failed");
  }
  return s;
}

/// Records the cgx_* keys of `info` for communicator c (MPI_Comm_set_info,
/// MPI_Comm_dup_with_info). `replace`: the communicator's keys are exactly these (a new
/// communicator); otherwise keys absent from info leave the earlier ones.
void record_info(MPI_Comm c, MPI_Info info, bool replace) noexcept {
  if (c == MPI_COMM_NULL) return;
  try {
    const std::string bits = info_value(info, "cgx_bits");
    const std::string bound = info_value(info, "cgx_error_bound");
    const std::string min = info_value(info, "cgx_min_bytes");
    if (bits.empty() && bound.empty() && min.empty()) {
      if (replace) {
        if (comm_state* e = find_state(c)) {
          const std::lock_guard<std::mutex> g(e->info_lock);
          e->info.reset();
        }
      }
      return;
    }
    comm_state* e = get_state(c);
    setting s = read_setting(bits.c_str(), bound.c_str(), min.c_str(), "MPI_Comm_set_info", "cgx_bits",
                             "cgx_error_bound", "cgx_min_bytes");
    const std::lock_guard<std::mutex> g(e->info_lock);
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
  } catch (const std::exception& x) {
    say(std::string("the cgx_* keys of a communicator could not be recorded: ") + x.what());
  } catch (...) {
    say("the cgx_* keys of a communicator could not be recorded");
  }
}

/// Drops the plan of a failed call: the next call's agreement sees it gone and every
/// rank builds a new one together.
void release_one(comm_state& e, int key) noexcept {
  const auto it = e.plans.find(key);
  if (it == e.plans.end()) return;
  const inside_cgx guard;
  try {
    it->second.plan.reset();
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
               "sent uncompressed by cgx (its measured choice, or below the threshold given), %llu opted in but below the minimum size (exact), "
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


/// MPI_Finalize: the report, then every plan and control communicator, in the order the
/// states were made.
void before_finalize() noexcept {
  if (cfg().report) {
    try {
      print_report();
    } catch (...) {
    }
  }
  std::vector<comm_state*> all;
  {
    const std::lock_guard<std::mutex> g(registry_lock);
    try {
      for (auto& kv : registry) all.push_back(kv.second);  // seq order
    } catch (...) {
    }
  }
  for (comm_state* s : all) {
    const std::lock_guard<std::mutex> g(s->call);
    release_plans(*s);
    s->finalized = true;  // the delete callbacks that PMPI_Finalize may run make no MPI call
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
/// `moved`: whether data may have moved (else the buffer is untouched).
int fail(MPI_Comm comm, int code, std::string what, int count, bool moved) {
  add(n_failed, 1);
  if (what.rfind("cgx: ", 0) == 0) what.erase(0, 5);  // cgx::error's prefix: the line names cgx already
  say("MPI_Allreduce of " + std::to_string(count) + " values failed in cgx: " + what +
      (moved ? " (the result buffer may hold partial sums; a later call builds a new plan)" : ""));
  const inside_cgx guard;
  PMPI_Comm_call_errhandler(comm, code);
  return code;
}

/// The point in time a call's waits end; max() for no limit.
clock_type::time_point deadline_of(std::uint32_t limit_ms) {
  if (limit_ms == 0) return clock_type::time_point::max();
  return clock_type::now() + std::chrono::milliseconds(limit_ms);
}

/// Waits for `req` until `deadline` (comm::detail::wait_until): true when it completed,
/// false when the deadline passed first (it stays pending).
bool wait_until(MPI_Request& req, clock_type::time_point deadline, const char* what) {
  return cgx::comm::detail::wait_until(std::span<MPI_Request>(&req, 1), deadline, what);
}

std::string waited(std::uint32_t limit_ms) {
  return "waited more than " + std::to_string(limit_ms) + " ms (CGX_TIMEOUT_MS)";
}

/// The control communicators of s: cgx's two duplicates of the caller's communicator,
/// made by the first opted-in call (MPI_Comm_idup, polled against the deadline). A call
/// that gives up leaves them pending and the next one waits for them again: every rank
/// duplicates the communicator once, in the same call of a correct program.
void ensure_control(comm_state& s, MPI_Comm user, clock_type::time_point deadline, std::uint32_t limit_ms) {
  if (s.control != MPI_COMM_NULL) return;
  if (!s.creating) {
    auto d = std::make_shared<pending_dup>();
    int rc = PMPI_Comm_idup(user, &d->out[0], &d->req[0]);
    if (rc == MPI_SUCCESS) rc = PMPI_Comm_idup(user, &d->out[1], &d->req[1]);
    s.creating = std::move(d);  // (a first one that started stays with MPI)
    if (rc != MPI_SUCCESS) throw cgx::error(cgx::errc::transport, "MPI_Comm_idup of the communicator failed");
  }
  for (MPI_Request& r : s.creating->req)
    if (!wait_until(r, deadline, "MPI_Comm_idup"))
      throw cgx::error(cgx::errc::timeout,
                       waited(limit_ms) + " for the other ranks to join the first compressed MPI_Allreduce on this "
                                          "communicator (cgx's duplication of it, MPI_Comm_idup); no data moved, and "
                                          "the next call on this communicator waits for that duplication again");
  s.control = s.creating->out[0];
  s.parent = s.creating->out[1];
  s.creating.reset();
  const int k = keyval.load(std::memory_order_acquire);
  for (MPI_Comm c : {s.control, s.parent}) {
    PMPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    if (k != MPI_KEYVAL_INVALID) PMPI_Comm_delete_attr(c, k);  // the hints they copied: they are cgx's own
  }
}

constexpr int notice_tag = 1;

/// Tells every peer that this rank gave up on agreement `index` (a small message on the
/// control communicator, never waited for): a peer that completes that agreement later
/// knows that the call is dead and fails at once.
void send_notices(comm_state& s, std::int64_t index) noexcept {
  int me = 0, p = 0;
  if (PMPI_Comm_rank(s.control, &me) != MPI_SUCCESS || PMPI_Comm_size(s.control, &p) != MPI_SUCCESS) return;
  try {
    auto buf = std::make_shared<std::int64_t>(index);
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      MPI_Request req = MPI_REQUEST_NULL;
      if (PMPI_Isend(buf.get(), 1, MPI_INT64_T, r, notice_tag, s.control, &req) == MPI_SUCCESS)
        PMPI_Request_free(&req);
    }
    s.notices.push_back(std::move(buf));
  } catch (...) {  // out of memory: the peers find out by their own wait limit
  }
}

/// Receives the notices that have arrived (s.abandoned: the largest index).
void read_notices(comm_state& s) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (PMPI_Iprobe(MPI_ANY_SOURCE, notice_tag, s.control, &flag, &st) != MPI_SUCCESS || !flag) return;
    std::int64_t v = -1;
    if (PMPI_Recv(&v, 1, MPI_INT64_T, st.MPI_SOURCE, notice_tag, s.control, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    s.abandoned = std::max(s.abandoned, v);
  }
}

/// Posts this call's agreement: one MPI_Iallreduce on the control communicator. Every
/// call that gets this far posts exactly one, whatever happened to the earlier ones, so
/// the k-th agreement of every rank belongs to its k-th such call: calls pair by their
/// position, as MPI's collectives do.
std::shared_ptr<pending_round> post_round(comm_state& s, const proposal& mine, int kind, const setting& st) {
  auto r = std::make_shared<pending_round>();
  r->index = s.next_round;
  r->kind = kind;
  r->s = st;
  const std::int64_t f[n_fields] = {mine.count, mine.key, mine.hash, mine.gen, mine.ever, mine.cap};
  for (int i = 0; i < n_fields; ++i) {
    r->in[i] = f[i];
    r->in[n_fields + i] = -f[i];
  }
  if (PMPI_Iallreduce(r->in, r->out, 2 * n_fields, MPI_INT64_T, MPI_MAX, s.control, &r->req) != MPI_SUCCESS)
    throw cgx::error(cgx::errc::transport, "MPI_Iallreduce (cgx's agreement) failed");
  ++s.next_round;
  s.rounds.push_back(r);
  return r;
}

/// A completed agreement: every rank that completes it gets the same.
struct agreement {
  proposal max, min;
  [[nodiscard]] bool mismatch() const noexcept {
    return max.count != min.count || max.key != min.key || max.hash != min.hash;
  }
  /// Every rank holds the same plan (one generation, built together), large enough.
  [[nodiscard]] bool reuse() const noexcept { return min.gen == max.gen && min.gen >= 0 && min.cap >= max.count; }
};

agreement decode(const pending_round& r) {
  agreement a;
  std::int64_t* mx[n_fields] = {&a.max.count, &a.max.key, &a.max.hash, &a.max.gen, &a.max.ever, &a.max.cap};
  std::int64_t* mn[n_fields] = {&a.min.count, &a.min.key, &a.min.hash, &a.min.gen, &a.min.ever, &a.min.cap};
  for (int i = 0; i < n_fields; ++i) {
    *mx[i] = r.out[i];
    *mn[i] = -r.out[n_fields + i];
  }
  return a;
}

/// What an agreement makes every rank that completes it do collectively: nothing when it
/// refuses the call (a mismatch) or reuses the plan; otherwise every rank builds the
/// agreed plan together (from s.parent, bounded by the wait limit), also for an agreement
/// whose call this rank gave up on (so the plans' parent sees the same constructions, in
/// the same order, on every rank). Returns the plan's key, or -1 when nothing was built.
int follow(comm_state& s, const pending_round& r, const agreement& a, const config& c) {
  if (a.mismatch() || a.reuse()) return -1;
  const int key = static_cast<int>(a.max.key);
  auto& slot = s.plans[key];
  slot.plan.reset();
  slot.gen = -1;
  cgx_preload::plan_request req;
  req.comm = s.parent;
  req.capacity = std::bit_ceil(std::max<std::size_t>(static_cast<std::size_t>(a.max.count), 4096));
  req.bits = r.s.bits;
  // A threshold the user gave is the plan's too (on one node as well); otherwise the
  // plan chooses per size class by timing both paths (cgx::auto_threshold).
  req.native_below = r.s.min_bytes ? *r.s.min_bytes : std::numeric_limits<std::size_t>::max();
  req.collective_check = c.collective_check;
  req.timeout_ms = c.timeout_ms;
  const std::int64_t gen = std::max(a.max.gen, a.max.ever) + 1;  // the same on every rank
  s.ever = std::max(s.ever, gen);
  slot.plan = r.kind == 0 ? cgx_preload::make_plan_f32(req) : cgx_preload::make_plan_f64(req);
  slot.gen = gen;
  add(n_plans, 1);
  return key;
}

std::int64_t setting_hash(const setting& s, std::size_t min_bytes, bool check) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h](std::uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  };
  mix(static_cast<std::uint64_t>(s.bits));
  mix(std::bit_cast<std::uint64_t>(s.bound));
  mix(s.min_bytes ? *s.min_bytes : ~std::uint64_t{0});
  mix(min_bytes);
  mix(check ? 1 : 0);
  return static_cast<std::int64_t>(h >> 2);  // 62 bits: negating it cannot overflow
}

/// The common body of the C and Fortran MPI_Allreduce; `pass` runs the call unchanged.
///
/// A compressed call: (1) the control communicators, once; (2) this call's agreement is
/// posted; (3) the agreements of earlier calls that gave up waiting are completed in
/// order (bounded) and followed without data (follow()); (4) this call's agreement
/// completes (bounded): different counts or settings refuse the call on every rank
/// before any data moves; otherwise every rank reuses its plan or all build a new one;
/// (5) a rank that learns that a peer gave up on this call (a notice) fails at once, a
/// late rank never succeeds; (6) the data moves. A call that gives up in (3) or (4)
/// tells its peers (send_notices) and leaves its agreement for the next call.
template <class Pass>
int allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, Pass pass) {
  if (inside > 0) return pass();
  const config& c = cfg();
  if (c.disabled || (!c.env.on() && !any_info.load(std::memory_order_acquire))) {
    add(n_passed, 1);
    return pass();
  }
  const int kind = op == MPI_SUM ? value_kind(type) : -1;
  if (kind < 0 || count <= 0 || comm == MPI_COMM_NULL || recvbuf == nullptr) {
    add(n_passed, 1);
    return pass();
  }
  comm_state* e = find_state(comm);
  const std::optional<setting> hinted = e != nullptr ? e->hints() : std::nullopt;
  const setting s = hinted ? *hinted : c.env;
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
  int inter = 0, size = 1;
  if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || PMPI_Comm_size(comm, &size) != MPI_SUCCESS || inter ||
      size < 2) {  // nothing to send on one rank; cgx has no inter-communicators
    add(n_passed, 1);
    return pass();
  }
  const auto t0 = clock_type::now();
  const int key = 16 * kind + s.bits;
  int touched = -1;  // the key of a plan that was built or run: a failure drops it
  bool moved = false;
  std::shared_ptr<pending_round> mine;
  std::unique_lock<std::mutex> g;
  try {
    if (e == nullptr) e = get_state(comm);
    g = std::unique_lock<std::mutex>(e->call);
    const inside_cgx guard;
    const auto deadline = deadline_of(c.timeout_ms);
    ensure_control(*e, comm, deadline, c.timeout_ms);
    proposal prop;
    prop.count = count;
    prop.key = key;
    prop.hash = setting_hash(s, min_bytes, c.collective_check);
    const auto it = e->plans.find(key);
    if (it != e->plans.end() && it->second.plan) {
      prop.gen = it->second.gen;
      prop.cap = static_cast<std::int64_t>(it->second.plan->capacity());
    }
    prop.ever = e->ever;
    mine = post_round(*e, prop, kind, s);
    const std::int64_t index = mine->index;
    agreement a;
    while (!e->rounds.empty()) {
      const std::shared_ptr<pending_round> r = e->rounds.front();
      if (!wait_until(r->req, deadline, "MPI_Iallreduce (cgx's agreement)"))
        throw cgx::error(cgx::errc::timeout,
                         waited(c.timeout_ms) + " for the other ranks to join " +
                             (r == mine ? std::string("this MPI_Allreduce")
                                        : "an earlier MPI_Allreduce on this communicator that gave up waiting") +
                             " (cgx's agreement on the count and the plan); no data moved");
      e->rounds.pop_front();
      if (r == mine) {
        a = decode(*r);
        break;
      }
      touched = follow(*e, *r, decode(*r), c);  // an earlier call's: its plan, no data
      touched = -1;
    }
    mine.reset();
    // Every rank that completed this agreement decides the same from here on.
    if (a.max.count != a.min.count)
      throw cgx::error(cgx::errc::mismatch, "the ranks passed different counts to this MPI_Allreduce (from " +
                                                std::to_string(a.min.count) + " to " + std::to_string(a.max.count) +
                                                " values); every rank refuses it, no data moved");
    if (a.mismatch())
      throw cgx::error(cgx::errc::mismatch,
                       "the ranks differ in this MPI_Allreduce's value type or cgx setting (bits, error bound, "
                       "minimum size: hints or environment); every rank refuses it, no data moved");
    touched = key;
    pending_round self;
    self.kind = kind;
    self.s = s;
    follow(*e, self, a, c);
    touched = -1;  // the agreed plan: a late rank keeps it (its peers build or keep the same)
    read_notices(*e);
    if (e->abandoned >= index)
      throw cgx::error(cgx::errc::timeout,
                       "this rank arrived after a peer gave up waiting for it in this MPI_Allreduce (the peer's "
                       "wait limit, CGX_TIMEOUT_MS, passed); no data moved");
    touched = key;
    auto& slot = e->plans[key];
    if (!slot.plan || slot.gen != (a.reuse() ? a.max.gen : std::max(a.max.gen, a.max.ever) + 1))
      throw cgx::error(cgx::errc::mismatch,  // its plan changed since it posted the agreement (earlier failures)
                       "this rank's plan is not the one its peers agreed on; no data moved");
    if (sendbuf != MPI_IN_PLACE && sendbuf != recvbuf) std::memmove(recvbuf, sendbuf, n * value_bytes);
    moved = true;
    const cgx_preload::traffic t = slot.plan->run(recvbuf, n, s.bound);
    add(t.native ? n_native : n_compressed, 1);
    if (!t.native) {
      add(b_user, n * value_bytes);
      add(b_raw, t.raw);
      add(b_sent, t.sent);
    }
    add(t_cgx_ns, static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count()));
    return MPI_SUCCESS;
  } catch (...) {
    // This call's agreement, still pending: the peers hear that this rank gave up.
    if (mine && !mine->abandoned && e != nullptr && e->control != MPI_COMM_NULL) {
      mine->abandoned = true;
      const inside_cgx guard;
      send_notices(*e, mine->index);
    }
    if (touched >= 0 && e != nullptr) release_one(*e, touched);
    try {
      throw;
    } catch (const cgx::error& err) {
      return fail(comm, mpi_code(err), err.what(), count, moved);
    } catch (const std::bad_alloc&) {
      return fail(comm, MPI_ERR_NO_MEM, "out of memory", count, moved);
    } catch (const std::exception& err) {
      return fail(comm, MPI_ERR_OTHER, err.what(), count, moved);
    } catch (...) {
      return fail(comm, MPI_ERR_OTHER, "unknown exception", count, moved);
    }
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

// MPI_Comm_dup_with_info copies the attributes (the parent's hints, copy_state), then the
// hints of its info replace them.
CGX_PRELOAD_EXPORT int MPI_Comm_dup_with_info(MPI_Comm comm, MPI_Info info, MPI_Comm* newcomm) {
  const int rc = PMPI_Comm_dup_with_info(comm, info, newcomm);
  if (inside == 0 && rc == MPI_SUCCESS) record_info(*newcomm, info, true);
  return rc;
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
// MPI_* functions, so under MPICH nothing of this is compiled. MPI_COMM_FREE,
// MPI_COMM_DISCONNECT, MPI_COMM_DUP and MPI_COMM_IDUP need no wrapper: the attribute's
// callbacks run inside them, whichever binding was called.

#if defined(OPEN_MPI) && OPEN_MPI
namespace {

using f_allreduce = void (*)(void*, void*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*, MPI_Fint*);
using f_finalize = void (*)(MPI_Fint*);
using f_set_info = void (*)(MPI_Fint*, MPI_Fint*, MPI_Fint*);
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

void fortran_set_info(f_set_info next, MPI_Fint* comm, MPI_Fint* info, MPI_Fint* ierr) {
  MPI_Fint rc = MPI_SUCCESS;
  MPI_Fint* e = ierr != nullptr ? ierr : &rc;
  if (next != nullptr) next(comm, info, e);
  if (inside == 0 && *e == MPI_SUCCESS) record_info(PMPI_Comm_f2c(*comm), PMPI_Info_f2c(*info), false);
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
#define CGX_F_SET_INFO(sym)                                           \
  CGX_PRELOAD_EXPORT void sym(MPI_Fint* c, MPI_Fint* i, MPI_Fint* e) { \
    static const auto next = next_symbol<f_set_info>(#sym);           \
    fortran_set_info(next, c, i, e);                                  \
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
CGX_F_ALL(CGX_F_SET_INFO, mpi_comm_set_info, MPI_COMM_SET_INFO)
CGX_F_ALL(CGX_F_DUP_WITH_INFO, mpi_comm_dup_with_info, MPI_COMM_DUP_WITH_INFO)
#endif  // OPEN_MPI

