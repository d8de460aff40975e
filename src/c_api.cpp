// The C functions of include/cgx/c.h over the type-erased plans of c_plans.hpp.
// Nothing crosses C but a code (DESIGN.md 7a): every function is noexcept (c.h declares
// it so, and a definition without noexcept does not compile) and its body runs inside
// one of three guards below, the only catch-alls of the file: guarded() for the
// functions that return a cgx_errc, guarded_init() for the void init functions,
// query() for the four that return a value. Each maps cgx::error to its code,
// std::bad_alloc to CGX_ERR_NO_MEMORY and anything else to CGX_ERR_INTERNAL, and keeps
// the message in a thread_local string for cgx_last_error().
#include "c_plans.hpp"

#include <cgx/comm/mpi.hpp>
#include <cgx/config.hpp>
#include <cgx/error.hpp>
#include <cgx/plan_common.hpp>
#include <cgx/quant/rounding.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace cgx::c_api {

template <class T, class Rounding>
std::unique_ptr<allreduce_iface> make_allreduce(MPI_Comm comm, const allreduce_spec& s, const plan_options& o);

namespace {

// The C codes mirror cgx::errc, one up (0 is CGX_OK); a category c.h does not know (one
// added to cgx::errc later) is CGX_ERR_INTERNAL, never a neighbour's code.
constexpr cgx_errc code_of(errc e) noexcept {
  switch (e) {
    case errc::invalid_argument: return CGX_ERR_INVALID_ARGUMENT;
    case errc::mismatch: return CGX_ERR_MISMATCH;
    case errc::workspace: return CGX_ERR_WORKSPACE;
    case errc::communicator: return CGX_ERR_COMMUNICATOR;
    case errc::transport: return CGX_ERR_TRANSPORT;
    case errc::cuda: return CGX_ERR_CUDA;
    case errc::corrupt: return CGX_ERR_CORRUPT;
    case errc::peer_failed: return CGX_ERR_PEER_FAILED;
    case errc::timeout: return CGX_ERR_TIMEOUT;
  }
  return CGX_ERR_INTERNAL;
}
static_assert(code_of(errc::invalid_argument) == 1 && code_of(errc::timeout) == 9 && CGX_ERR_TIMEOUT == 9,
              "include/cgx/c.h: cgx_errc no longer mirrors cgx::errc");

// cgx::error::what() is "cgx: " + the text it was made with; a message that is thrown
// again as a cgx::error (agree() below) passes the text alone, so that the prefix
// appears once.
constexpr std::string_view prefix = "cgx: ";
std::string without_prefix(std::string_view m) {
  while (m.substr(0, prefix.size()) == prefix) m.remove_prefix(prefix.size());
  return std::string(m);
}

// The message of this thread's last failed call. `fixed` is used when the message itself
// cannot be stored (no memory for it).
thread_local std::string last_message;
thread_local const char* last_fixed = nullptr;

cgx_errc fail(cgx_errc code, const char* what) noexcept {
  try {
    last_message = what;
    last_fixed = nullptr;
  } catch (...) {
    last_fixed = "cgx: a call failed, and its message could not be stored (out of memory)";
  }
  return code;
}

// The message of an exception that is not a cgx::error, "cgx: <who>: ...".
cgx_errc fail_unexpected(const char* who, cgx_errc code, const char* kind, const char* what) noexcept {
  try {
    return fail(code, (std::string(prefix) + who + ": " + kind + (what != nullptr ? what : "")).c_str());
  } catch (...) {
    return fail(code, code == CGX_ERR_NO_MEMORY ? "cgx: out of memory (std::bad_alloc)" : "cgx: unexpected failure");
  }
}

// The one catch-all: runs f (of the function `who`), turning every exception into a
// code and this thread's message. Every function of c.h that returns a cgx_errc is
// `return guarded("name", [&] { ... });`; the void inits go through guarded_init, which
// uses it, the four queries through query.
template <class F>
cgx_errc guarded(const char* who, F&& f) noexcept {
  last_message.clear();
  last_fixed = nullptr;
  try {
    f();
    return CGX_OK;
  } catch (const cgx::error& e) {
    return fail(code_of(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail_unexpected(who, CGX_ERR_NO_MEMORY, "out of memory (std::bad_alloc)", nullptr);
  } catch (const std::exception& e) {
    return fail_unexpected(who, CGX_ERR_INTERNAL, "unexpected failure: ", e.what());
  } catch (...) {
    return fail_unexpected(who, CGX_ERR_INTERNAL, "unexpected failure (an exception of unknown type)", nullptr);
  }
}

// A void init function: it cannot return a code, so a failure is kept for the next
// create: `mark` (noexcept) marks the struct (timeout_ms = CGX_INIT_FAILED, which every
// create refuses) and the message stays in cgx_last_error(). f itself may also leave a
// message that is not a failure of the init (a malformed CGX_TIMEOUT_MS: the create
// reports it) through `note`.
template <class F, class Mark>
void guarded_init(const char* who, Mark&& mark, F&& f) noexcept {
  std::string note;
  if (guarded(who, [&] { f(note); }) != CGX_OK) {
    mark();
    return;
  }
  if (!note.empty()) (void)fail(CGX_ERR_INVALID_ARGUMENT, note.c_str());
}

// The four functions that return a value, not a code: `fallback` if f throws (none of
// their bodies can; this keeps them inside the rule). They leave cgx_last_error() alone.
template <class T, class F>
T query(T fallback, F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return fallback;
  }
}

[[noreturn]] void refuse(const std::string& what) { throw error(errc::invalid_argument, what); }

bool bucket_ok(std::size_t b) {
  return std::find(std::begin(compiled_buckets), std::end(compiled_buckets), b) != std::end(compiled_buckets);
}

// The environment's default wait limit (CGX_TIMEOUT_MS, else 10 minutes); a malformed
// value throws errc::invalid_argument naming the variable, its value and `who`.
std::uint32_t environment_timeout(const char* who) {
  try {
    return cgx::default_timeout_ms();
  } catch (const error& e) {
    throw error(e.code(), std::string(who) + ": " + without_prefix(e.what()) +
                              "; options.timeout_ms is CGX_DEFAULT_TIMEOUT, which reads it: fix the variable "
                              "or set timeout_ms");
  }
}

// The wait limit of options `c`: the environment's only for CGX_DEFAULT_TIMEOUT.
std::uint32_t timeout_of(const cgx_options& c, const char* who) {
  if (c.timeout_ms == CGX_DEFAULT_TIMEOUT) return environment_timeout(who);
  if (c.timeout_ms == CGX_INIT_FAILED)
    refuse(std::string(who) + ": options.timeout_ms is CGX_INIT_FAILED: the init function that filled this "
                              "configuration failed (its message was cgx_last_error() right after it, on its thread); "
                              "no plan was made");
  if (c.timeout_ms < 0 || c.timeout_ms > static_cast<std::int64_t>(UINT32_MAX))
    refuse(std::string(who) + ": options.timeout_ms " + std::to_string(c.timeout_ms) +
           " is outside 0..4294967295 (or CGX_DEFAULT_TIMEOUT)");
  return static_cast<std::uint32_t>(c.timeout_ms);
}

plan_options to_options(const cgx_options& c, const char* who) {
  checking check = checking::automatic;
  switch (c.check) {
    case CGX_CHECK_AUTOMATIC: check = checking::automatic; break;
    case CGX_CHECK_LOCAL: check = checking::local; break;
    case CGX_CHECK_COLLECTIVE: check = checking::collective; break;
    default: refuse(std::string(who) + ": options.check " + std::to_string(static_cast<int>(c.check)) +
                    " is not a cgx_checking value");
  }
  if (c.threads < 1) refuse(std::string(who) + ": options.threads must be >= 1 (got " + std::to_string(c.threads) + ")");
  // Every member named: plan_options' own default of timeout_ms (default_timeout_ms(),
  // which throws for a malformed CGX_TIMEOUT_MS) is not evaluated when the caller set one.
  return plan_options{.check = check,
                      .seed = c.seed,
                      .threads = c.threads,
                      .native_below_bytes =
                          c.native_below_bytes == CGX_AUTO_THRESHOLD ? auto_threshold : c.native_below_bytes,
                      .timeout_ms = timeout_of(c, who),
                      .verify = c.verify != 0};
}

void check_type(cgx_datatype t, const char* who) {
  if (t != CGX_FLOAT && t != CGX_DOUBLE)
    refuse(std::string(who) + ": type " + std::to_string(static_cast<int>(t)) + " is not CGX_FLOAT or CGX_DOUBLE");
}

void check_schedule(cgx_schedule s, const char* who) {
  if (s != CGX_SRA && s != CGX_RING)
    refuse(std::string(who) + ": schedule " + std::to_string(static_cast<int>(s)) + " is not CGX_SRA or CGX_RING");
}

// A hash of a configuration, for the agreement below.
std::int64_t mix(std::int64_t h, std::uint64_t v) {
  std::uint64_t x = static_cast<std::uint64_t>(h) ^ (v + 0x9E3779B97F4A7C15ull + (static_cast<std::uint64_t>(h) << 6));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<std::int64_t>(x ^ (x >> 29));
}

// The hash of a configuration: its fields `v` and the options every rank must share.
std::int64_t config_hash(std::int64_t h, std::initializer_list<std::uint64_t> v, const cgx_options& o) {
  for (std::uint64_t x : v) h = mix(h, x);
  h = mix(h, static_cast<std::uint64_t>(o.check));
  h = mix(h, o.native_below_bytes);
  h = mix(h, static_cast<std::uint64_t>(o.timeout_ms));
  return mix(h, static_cast<std::uint64_t>(o.verify != 0));
}

// The arguments every create function checks first: *plan is NULL from here on.
template <class Plan, class Config>
void check_create(Plan** plan, const Config* c, const char* who) {
  if (plan == nullptr) refuse(std::string(who) + ": plan (the pointer to the result) is NULL");
  *plan = nullptr;
  if (c == nullptr) refuse(std::string(who) + ": the configuration is NULL");
}

// Collective over comm: every rank says whether its own configuration was refused
// (`local_error`: its message) and the hash of its configuration, so that a creation
// refused on some ranks, or configured differently on some, fails on every rank instead
// of leaving the others inside the plan's collective construction. Throws on failure.
// Bounded: a non-blocking reduction polled against `limit_ms` (0: none), so that a rank
// late for the creation, or skipping it, makes the others return CGX_ERR_TIMEOUT instead
// of waiting; the late rank completes the reduction they left with MPI, then fails in the
// plan's own construction (comm::mpi's bounded duplication, which they never join).
void agree(MPI_Comm comm, const char* who, std::int64_t hash, const std::string& local_error, errc local_code,
           std::uint32_t limit_ms) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw error(errc::communicator, std::string(who) + ": MPI is not initialized (or already finalized)");
  if (comm == MPI_COMM_NULL) throw error(errc::communicator, std::string(who) + ": the communicator is MPI_COMM_NULL");
  int inter = 0;
  if (MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
    throw error(errc::communicator, std::string(who) + ": the communicator is not a usable intra-communicator");
  const std::int64_t bad = local_error.empty() ? 0 : 1;
  // MPI's buffers on the heap: a timed-out reduction stays with MPI (comm::detail::abandon).
  auto buf = std::make_shared<std::array<std::int64_t, 6>>(std::array<std::int64_t, 6>{bad, hash, -hash, 0, 0, 0});
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Iallreduce(buf->data(), buf->data() + 3, 3, MPI_INT64_T, MPI_MAX, comm, &req) != MPI_SUCCESS)
    throw error(errc::transport, std::string(who) + ": MPI_Iallreduce of the configurations failed");
  if (!cgx::comm::detail::wait_bounded(std::span<MPI_Request>(&req, 1), std::chrono::milliseconds(limit_ms),
                                       "MPI_Iallreduce of the configurations")) {
    cgx::comm::detail::abandon(std::span<MPI_Request>(&req, 1), buf);
    throw error(errc::timeout, std::string(who) + ": " +
                                   cgx::comm::detail::construction_timeout(std::chrono::milliseconds(limit_ms),
                                                                           "the agreement on the configurations "
                                                                           "(MPI_Iallreduce)") +
                                   "; no plan was made");
  }
  const std::int64_t* all = buf->data() + 3;
  if (bad) throw error(local_code, local_error);
  if (all[0] != 0)
    throw error(errc::invalid_argument,
                std::string(who) + ": another rank's configuration was refused (see its message); no plan was made");
  if (all[1] != hash || -all[2] != hash)
    throw error(errc::mismatch, std::string(who) + ": the ranks passed different configurations (type, bits, bucket, "
                                                   "rounding, schedule, max_count or options); no plan was made");
}

// Runs `check` (which throws cgx::error for a bad configuration), then agree(). Every
// local refusal (a bad field, a malformed CGX_TIMEOUT_MS) is found here, before any
// plan is built, and told to the other ranks by the agreement.
// The agreement's wait limit: the configuration's (as the plan's), or the default when
// the configuration's own cannot be read (that refusal is then what the agreement tells).
std::uint32_t agreement_limit(const cgx_options& o, const char* who) noexcept {
  try {
    return timeout_of(o, who);
  } catch (...) {
    return cgx::default_timeout_ms_value;
  }
}

template <class Check>
void validate_collectively(MPI_Comm comm, const char* who, std::int64_t hash, std::uint32_t limit_ms, Check&& check) {
  std::string message;
  errc code = errc::invalid_argument;
  try {
    check();
  } catch (const error& e) {
    message = without_prefix(e.what());  // agree() throws it again, with the prefix
    if (message.empty()) message = std::string(who) + ": the configuration was refused";
    code = e.code();
  }
  agree(comm, who, hash, message, code, limit_ms);
}

std::size_t size_of(cgx_datatype t) { return t == CGX_FLOAT ? sizeof(float) : sizeof(double); }

const char* type_name(cgx_datatype t) { return t == CGX_FLOAT ? "CGX_FLOAT" : "CGX_DOUBLE"; }

// A NULL plan: freed by cgx_*_free, or never created. Every function given one refuses it.
void check_plan(const void* plan, const char* who) {
  if (plan == nullptr) refuse(std::string(who) + ": the plan is NULL (freed, or never created)");
}

void check_call(cgx_datatype plan_type, cgx_datatype type, const void* plan, const char* who) {
  check_plan(plan, who);
  if (type != plan_type)
    refuse(std::string(who) + ": the buffer's type (" + (type == CGX_FLOAT || type == CGX_DOUBLE ? type_name(type) : "not a cgx_datatype") +
           ") is not the plan's (" + type_name(plan_type) + "); the buffer is untouched");
}

}  // namespace
}  // namespace cgx::c_api

using namespace cgx::c_api;  // NOLINT: this file defines the C API

struct cgx_allreduce_plan {
  std::unique_ptr<allreduce_iface> impl;
  cgx_datatype type = CGX_FLOAT;
  cgx_stats stats{};
  std::size_t pending = 0;   // count of the call in flight (start .. wait)
  double started = 0;        // MPI_Wtime() at its start
};

struct cgx_error_bounded_plan {
  std::unique_ptr<error_bounded_iface> impl;
  cgx_datatype type = CGX_DOUBLE;
  cgx_stats stats{};
  std::uint32_t calls = 0;
};

namespace {

// The bodies of the C functions below, each run inside its function's guard; `who` is
// the C function's name, for messages.

void allreduce_create(MPI_Comm comm, const cgx_allreduce_config* c, cgx_allreduce_plan** plan, const char* who) {
  check_create(plan, c, who);
  std::optional<cgx::plan_options> o;
  const std::int64_t h = config_hash(1, {static_cast<std::uint64_t>(c->type), static_cast<std::uint64_t>(c->bits),
                                        c->bucket, static_cast<std::uint64_t>(c->rounding),
                                        static_cast<std::uint64_t>(c->schedule), c->max_count},
                                     c->options);
  validate_collectively(comm, who, h, agreement_limit(c->options, who), [&] {
    check_type(c->type, who);
    if (c->bits < 1 || c->bits > 8) refuse(std::string(who) + ": bits " + std::to_string(c->bits) + " is outside 1..8");
    if (!bucket_ok(c->bucket))
      refuse(std::string(who) + ": bucket " + std::to_string(c->bucket) +
             " is not compiled into the C library (use 128 or 1024: CGX_BUCKET_SMALL, CGX_BUCKET_DEFAULT)");
    if (c->rounding != CGX_STOCHASTIC && c->rounding != CGX_NEAREST)
      refuse(std::string(who) + ": rounding " + std::to_string(static_cast<int>(c->rounding)) +
             " is not CGX_STOCHASTIC or CGX_NEAREST");
    check_schedule(c->schedule, who);
    o = to_options(c->options, who);
  });
  const allreduce_spec s{c->bits, c->bucket, c->schedule, c->max_count};
  auto p = std::make_unique<cgx_allreduce_plan>();
  p->type = c->type;
  if (c->type == CGX_FLOAT)
    p->impl = c->rounding == CGX_NEAREST ? make_allreduce<float, cgx::quant::nearest>(comm, s, *o)
                                         : make_allreduce<float, cgx::quant::stochastic>(comm, s, *o);
  else
    p->impl = c->rounding == CGX_NEAREST ? make_allreduce<double, cgx::quant::nearest>(comm, s, *o)
                                         : make_allreduce<double, cgx::quant::stochastic>(comm, s, *o);
  *plan = p.release();
}

void error_bounded_create(MPI_Comm comm, const cgx_error_bounded_config* c, cgx_error_bounded_plan** plan,
                          const char* who) {
  check_create(plan, c, who);
  std::optional<cgx::plan_options> o;
  const std::int64_t h = config_hash(
      2, {static_cast<std::uint64_t>(c->type), static_cast<std::uint64_t>(c->schedule), c->max_count}, c->options);
  validate_collectively(comm, who, h, agreement_limit(c->options, who), [&] {
    check_type(c->type, who);
    check_schedule(c->schedule, who);
    o = to_options(c->options, who);
  });
  auto p = std::make_unique<cgx_error_bounded_plan>();
  p->type = c->type;
  p->impl = make_error_bounded(comm, c->type, c->schedule, c->max_count, *o);
  *plan = p.release();
}

void record(cgx_allreduce_plan* p, std::size_t n, double seconds) {
  cgx_stats s{};
  s.count = n;
  s.native = p->impl->last_native() ? 1 : 0;
  s.calls = p->impl->calls();
  s.seconds = seconds;
  s.raw_bytes = n * size_of(p->type);
  s.compressed_bytes = s.native ? 0 : p->impl->compressed_bytes(n);
  p->stats = s;
}

void allreduce_wait(cgx_allreduce_plan* plan) {
  if (!plan->impl->in_flight()) return;
  plan->impl->wait();
  record(plan, plan->pending, MPI_Wtime() - plan->started);
}

// Frees `plan` (NULL: nothing); a reduction in flight is waited for first and its
// failure thrown after the plan is freed.
void allreduce_release(cgx_allreduce_plan* plan) {
  const std::unique_ptr<cgx_allreduce_plan> owner(plan);  // the plan's destructors do not throw
  if (plan != nullptr && plan->impl && plan->impl->in_flight()) allreduce_wait(plan);
}

// The stats of `plan` into *stats (cgx_allreduce_stats, cgx_error_bounded_stats).
template <class Plan>
void copy_stats(const Plan* plan, cgx_stats* stats, const char* who) {
  check_plan(plan, who);
  if (stats == nullptr) refuse(std::string(who) + ": the result pointer is NULL");
  *stats = plan->stats;
}

// The plan that cgx_*_free(&plan) frees, the caller's handle set to NULL.
template <class Plan>
Plan* take(Plan** plan, const char* who) {
  if (plan == nullptr) refuse(std::string(who) + ": the pointer to the plan is NULL (pass &plan)");
  return std::exchange(*plan, nullptr);
}

void options_defaults(cgx_options* o, const char* who, std::string& note) {
  if (o == nullptr) refuse(std::string(who) + ": the pointer to fill is NULL; nothing was filled");
  // Not cgx::plan_options{} itself: its timeout_ms reads CGX_TIMEOUT_MS, and throws for a
  // malformed value, which a void function cannot report. The create reads it instead.
  const cgx::plan_options d{.timeout_ms = 0};
  o->check = CGX_CHECK_AUTOMATIC;
  o->seed = d.seed;
  o->threads = d.threads;
  o->native_below_bytes = CGX_AUTO_THRESHOLD;
  o->timeout_ms = CGX_DEFAULT_TIMEOUT;
  o->verify = 0;
  // Said at once too (cgx_last_error()), though the init itself succeeded.
  try {
    (void)environment_timeout(who);
  } catch (const cgx::error& e) {
    note = std::string(e.what()) + "; every create with this configuration returns CGX_ERR_INVALID_ARGUMENT until it is fixed";
  }
}

}  // namespace

namespace {
// cgx_allreduce_path and cgx_error_bounded_path: plan->impl->path_for(bytes) into *path.
template <class Plan>
cgx_errc path_of(const Plan* plan, size_t bytes, cgx_path* path, const char* who) noexcept {
  return guarded(who, [&] {
    check_plan(plan, who);
    if (path == nullptr) refuse(std::string(who) + ": the result pointer is NULL");
    const cgx::path_pick k = plan->impl->path_for(bytes);
    path->measured = k.measured ? 1 : 0;
    path->compressed = k.compressed ? 1 : 0;
    path->native_seconds = k.native_s;
    path->compressed_seconds = k.compressed_s;
    path->calls = k.calls;
    path->decisions = k.decisions;
    path->flips = k.flips;
  });
}

}  // namespace

extern "C" {

const char* cgx_last_error(void) noexcept {
  return query<const char*>("", [] { return last_fixed != nullptr ? last_fixed : last_message.c_str(); });
}

const char* cgx_errc_name(int code) noexcept {
  return query<const char*>("unknown", [code]() -> const char* {
    switch (code) {
      case CGX_OK: return "CGX_OK";
      case CGX_ERR_INVALID_ARGUMENT: return "CGX_ERR_INVALID_ARGUMENT";
      case CGX_ERR_MISMATCH: return "CGX_ERR_MISMATCH";
      case CGX_ERR_WORKSPACE: return "CGX_ERR_WORKSPACE";
      case CGX_ERR_COMMUNICATOR: return "CGX_ERR_COMMUNICATOR";
      case CGX_ERR_TRANSPORT: return "CGX_ERR_TRANSPORT";
      case CGX_ERR_CUDA: return "CGX_ERR_CUDA";
      case CGX_ERR_CORRUPT: return "CGX_ERR_CORRUPT";
      case CGX_ERR_PEER_FAILED: return "CGX_ERR_PEER_FAILED";
      case CGX_ERR_TIMEOUT: return "CGX_ERR_TIMEOUT";
      case CGX_ERR_NO_MEMORY: return "CGX_ERR_NO_MEMORY";
      case CGX_ERR_INTERNAL: return "CGX_ERR_INTERNAL";
      default: return "unknown";
    }
  });
}

#define CGX_C_STR2(x) #x
#define CGX_C_STR(x) CGX_C_STR2(x)
const char* cgx_version(void) noexcept {
  return query<const char*>("", [] {
    return CGX_C_STR(CGX_VERSION_MAJOR) "." CGX_C_STR(CGX_VERSION_MINOR) "." CGX_C_STR(CGX_VERSION_PATCH);
  });
}

int cgx_bucket_supported(size_t bucket) noexcept {
  return query(0, [bucket] { return bucket_ok(bucket) ? 1 : 0; });
}

void cgx_options_init(cgx_options* o) noexcept {
  static const char* const who = "cgx_options_init";
  guarded_init(
      who, [o]() noexcept { if (o != nullptr) o->timeout_ms = CGX_INIT_FAILED; },
      [&](std::string& note) { options_defaults(o, who, note); });
}

void cgx_allreduce_config_init(cgx_allreduce_config* c) noexcept {
  static const char* const who = "cgx_allreduce_config_init";
  guarded_init(
      who, [c]() noexcept { if (c != nullptr) c->options.timeout_ms = CGX_INIT_FAILED; },
      [&](std::string& note) {
        if (c == nullptr) refuse(std::string(who) + ": the pointer to fill is NULL; nothing was filled");
        c->type = CGX_FLOAT;
        c->bits = 4;
        c->bucket = CGX_BUCKET_DEFAULT;
        c->rounding = CGX_STOCHASTIC;
        c->schedule = CGX_SRA;
        c->max_count = 0;
        options_defaults(&c->options, who, note);
      });
}

void cgx_error_bounded_config_init(cgx_error_bounded_config* c) noexcept {
  static const char* const who = "cgx_error_bounded_config_init";
  guarded_init(
      who, [c]() noexcept { if (c != nullptr) c->options.timeout_ms = CGX_INIT_FAILED; },
      [&](std::string& note) {
        if (c == nullptr) refuse(std::string(who) + ": the pointer to fill is NULL; nothing was filled");
        c->type = CGX_DOUBLE;
        c->schedule = CGX_SRA;
        c->max_count = 0;
        options_defaults(&c->options, who, note);
      });
}

cgx_errc cgx_allreduce_create(MPI_Comm comm, const cgx_allreduce_config* c, cgx_allreduce_plan** plan) noexcept {
  static const char* const who = "cgx_allreduce_create";
  return guarded(who, [&] { allreduce_create(comm, c, plan, who); });
}

cgx_errc cgx_allreduce_create_f(MPI_Fint comm, const cgx_allreduce_config* c, cgx_allreduce_plan** plan) noexcept {
  static const char* const who = "cgx_allreduce_create_f";
  return guarded(who, [&] { allreduce_create(MPI_Comm_f2c(comm), c, plan, who); });
}

cgx_errc cgx_allreduce(cgx_allreduce_plan* plan, void* buf, size_t count, cgx_datatype type) noexcept {
  static const char* const who = "cgx_allreduce";
  return guarded(who, [&] {
    check_call(plan != nullptr ? plan->type : type, type, plan, who);
    const double t0 = MPI_Wtime();
    plan->impl->run(buf, count);
    record(plan, count, MPI_Wtime() - t0);
  });
}

cgx_errc cgx_allreduce_start(cgx_allreduce_plan* plan, void* buf, size_t count, cgx_datatype type) noexcept {
  static const char* const who = "cgx_allreduce_start";
  return guarded(who, [&] {
    check_call(plan != nullptr ? plan->type : type, type, plan, who);
    const double t0 = MPI_Wtime();
    plan->impl->start(buf, count);
    plan->pending = count;
    plan->started = t0;
  });
}

cgx_errc cgx_allreduce_wait(cgx_allreduce_plan* plan) noexcept {
  static const char* const who = "cgx_allreduce_wait";
  return guarded(who, [&] {
    check_plan(plan, who);
    allreduce_wait(plan);
  });
}

cgx_errc cgx_allreduce_stats(const cgx_allreduce_plan* plan, cgx_stats* stats) noexcept {
  return guarded("cgx_allreduce_stats", [&] { copy_stats(plan, stats, "cgx_allreduce_stats"); });
}

cgx_errc cgx_allreduce_native_below_bytes(const cgx_allreduce_plan* plan, size_t* bytes) noexcept {
  static const char* const who = "cgx_allreduce_native_below_bytes";
  return guarded(who, [&] {
    check_plan(plan, who);
    if (bytes == nullptr) refuse(std::string(who) + ": the result pointer is NULL");
    *bytes = plan->impl->native_below_bytes();
  });
}

cgx_errc cgx_allreduce_path(const cgx_allreduce_plan* plan, size_t bytes, cgx_path* path) noexcept {
  return path_of(plan, bytes, path, "cgx_allreduce_path");
}

cgx_errc cgx_error_bounded_path(const cgx_error_bounded_plan* plan, size_t bytes, cgx_path* path) noexcept {
  return path_of(plan, bytes, path, "cgx_error_bounded_path");
}

cgx_errc cgx_allreduce_free(cgx_allreduce_plan** plan) noexcept {
  return guarded("cgx_allreduce_free", [&] { allreduce_release(take(plan, "cgx_allreduce_free")); });
}

cgx_errc cgx_allreduce_destroy(cgx_allreduce_plan* plan) noexcept {
  return guarded("cgx_allreduce_destroy", [&] { allreduce_release(plan); });
}

cgx_errc cgx_error_bounded_create(MPI_Comm comm, const cgx_error_bounded_config* c,
                                  cgx_error_bounded_plan** plan) noexcept {
  static const char* const who = "cgx_error_bounded_create";
  return guarded(who, [&] { error_bounded_create(comm, c, plan, who); });
}

cgx_errc cgx_error_bounded_create_f(MPI_Fint comm, const cgx_error_bounded_config* c,
                                    cgx_error_bounded_plan** plan) noexcept {
  static const char* const who = "cgx_error_bounded_create_f";
  return guarded(who, [&] { error_bounded_create(MPI_Comm_f2c(comm), c, plan, who); });
}

cgx_errc cgx_error_bounded_allreduce(cgx_error_bounded_plan* plan, void* buf, size_t count, cgx_datatype type,
                                     double bound) noexcept {
  static const char* const who = "cgx_error_bounded_allreduce";
  return guarded(who, [&] {
    check_call(plan != nullptr ? plan->type : type, type, plan, who);
    const double t0 = MPI_Wtime();
    plan->impl->run(buf, count, bound);
    const double t = MPI_Wtime() - t0;
    const cgx::error_bounded_stats e = plan->impl->stats();
    if (!e.native) ++plan->calls;
    cgx_stats s{};
    s.count = count;
    s.native = e.native ? 1 : 0;
    s.calls = plan->calls;
    s.seconds = t;
    s.raw_bytes = count * size_of(plan->type);
    s.compressed_bytes = e.bytes_sent;
    s.schedule_raw_bytes = e.raw_bytes;
    s.bound = e.bound;
    s.step_bound = e.step_bound;
    plan->stats = s;
  });
}

cgx_errc cgx_error_bounded_stats(const cgx_error_bounded_plan* plan, cgx_stats* stats) noexcept {
  return guarded("cgx_error_bounded_stats", [&] { copy_stats(plan, stats, "cgx_error_bounded_stats"); });
}

cgx_errc cgx_error_bounded_free(cgx_error_bounded_plan** plan) noexcept {
  // (The plan's destructors do not throw.)
  return guarded("cgx_error_bounded_free", [&] { delete take(plan, "cgx_error_bounded_free"); });
}

cgx_errc cgx_error_bounded_destroy(cgx_error_bounded_plan* plan) noexcept {
  return guarded("cgx_error_bounded_destroy", [&] { delete plan; });
}

}  // extern "C"
