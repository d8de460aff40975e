// The C API's boundary (include/cgx/c.h; issue 47, item 4; DESIGN.md 7a "Nothing
// crosses C but a code"): with a malformed CGX_TIMEOUT_MS in the environment every
// function of c.h is called and returns a code (the void inits return, and the next
// create returns CGX_ERR_INVALID_ARGUMENT naming CGX_TIMEOUT_MS and its value, on every
// rank); nothing throws or aborts; no message carries the "cgx: " prefix twice; NULL
// handles get a code; cgx_*_free sets the handle to NULL (MPI's MPI_Comm_free
// convention). The last case reads c.h and checks that every function it declares was
// called here, so a new entry point without a test here fails this test.
#include <doctest/doctest.h>

#include <cgx/c.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

// Revision 2 of the API added cgx_*_free, CGX_INIT_FAILED and noexcept declarations.
// (This test also builds against revision 1, the header of ad1d8b1, to show there what
// failed.)
#if defined(CGX_C_API_VERSION) && CGX_C_API_VERSION >= 2
#define CGX_TEST_V2 1
#else
#define CGX_TEST_V2 0
#endif
// Revision 3 added the measured choice's cgx_*_path.
#if defined(CGX_C_API_VERSION) && CGX_C_API_VERSION >= 3
#define CGX_TEST_V3 1
#else
#define CGX_TEST_V3 0
#endif

namespace {

std::set<std::string> called;     // the functions of c.h this test called
std::vector<std::string> seen;    // every message cgx_last_error() gave

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// MPI_COMM_WORLD's Fortran handle (a variable, so that CALL's noexcept check is of the
// cgx function alone).
MPI_Fint world_f() noexcept {
  static const MPI_Fint f = MPI_Comm_c2f(MPI_COMM_WORLD);
  return f;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// One "cgx: " at the start of a message, never two.
void check_prefix(const std::string& m) {
  if (m.empty()) return;
  CAPTURE(m);
  CHECK(m.rfind("cgx: ", 0) == 0);
  CHECK(!contains(m, "cgx: cgx:"));
}

std::string last() {
  called.insert("cgx_last_error");
  std::string m = cgx_last_error();
  seen.push_back(m);
  check_prefix(m);
  return m;
}

// Records a call of `name` that returned rc; a failure has a message.
cgx_errc note(const char* name, cgx_errc rc) {
  called.insert(name);
  const std::string function = name;
  CAPTURE(function);
  const std::string m = last();
  if (rc != CGX_OK) CHECK(!m.empty());
  else CHECK(m.empty());
  return rc;
}

#if CGX_TEST_V2
// Every function of c.h is declared noexcept to C++ callers (the definitions must match).
#define CGX_NOEXCEPT_CHECK(expr) static_assert(noexcept(expr), #expr " is not noexcept")
#else
#define CGX_NOEXCEPT_CHECK(expr) static_assert(true)
#endif
#define CALL(f, ...) ([&] { CGX_NOEXCEPT_CHECK(f(__VA_ARGS__)); return note(#f, f(__VA_ARGS__)); }())
#define INIT(f, p) ([&] { CGX_NOEXCEPT_CHECK(f(p)); f(p); called.insert(#f); }())

// CGX_TIMEOUT_MS set to `value` for a scope (nullptr: unset), restored after.
class env_timeout {
 public:
  explicit env_timeout(const char* value) {
    const char* old = std::getenv("CGX_TIMEOUT_MS");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) setenv("CGX_TIMEOUT_MS", value, 1);
    else unsetenv("CGX_TIMEOUT_MS");
  }
  ~env_timeout() {
    if (had_) setenv("CGX_TIMEOUT_MS", old_.c_str(), 1);
    else unsetenv("CGX_TIMEOUT_MS");
  }
  env_timeout(const env_timeout&) = delete;
  env_timeout& operator=(const env_timeout&) = delete;

 private:
  bool had_ = false;
  std::string old_;
};

// Every rank's flag, on every rank.
bool all(bool mine) {
  int m = mine ? 1 : 0, a = 0;
  MPI_Allreduce(&m, &a, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return a != 0;
}

// The message of a create refused for the malformed variable: it names the function,
// the variable and its value.
void check_names_variable(const std::string& m, const char* who, const char* value) {
  CAPTURE(m);
  CHECK(contains(m, who));
  CHECK(contains(m, "CGX_TIMEOUT_MS"));
  CHECK(contains(m, value));
}

}  // namespace

TEST_CASE("malformed CGX_TIMEOUT_MS: the void inits return, and every create refuses it on every rank") {
  const env_timeout bad("5s");
  cgx_options o;
  std::memset(&o, 0xff, sizeof o);
  INIT(cgx_options_init, &o);  // ad1d8b1: terminate called after throwing 'cgx::error'
  CHECK(o.timeout_ms == CGX_DEFAULT_TIMEOUT);
  CHECK(o.threads == 1);
  CHECK(o.native_below_bytes == CGX_AUTO_THRESHOLD);
  // The init cannot return a code: it records the problem for cgx_last_error() at once;
  // the create that reads the variable refuses it (below).
  check_names_variable(last(), "cgx_options_init", "5s");

  cgx_allreduce_config c;
  INIT(cgx_allreduce_config_init, &c);
  check_names_variable(last(), "cgx_allreduce_config_init", "5s");
  CHECK(c.bits == 4);
  CHECK(c.options.timeout_ms == CGX_DEFAULT_TIMEOUT);
  c.max_count = 1000;
  cgx_error_bounded_config e;
  INIT(cgx_error_bounded_config_init, &e);
  check_names_variable(last(), "cgx_error_bounded_config_init", "5s");
  CHECK(e.type == CGX_DOUBLE);
  e.max_count = 1000;

  cgx_allreduce_plan* plan = reinterpret_cast<cgx_allreduce_plan*>(&c);  // must become NULL
  CHECK(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &c, &plan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(plan == nullptr);
  check_names_variable(last(), "cgx_allreduce_create", "5s");
  plan = reinterpret_cast<cgx_allreduce_plan*>(&c);
  CHECK(CALL(cgx_allreduce_create_f, world_f(), &c, &plan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(plan == nullptr);
  check_names_variable(last(), "cgx_allreduce_create", "5s");

  cgx_error_bounded_plan* eplan = reinterpret_cast<cgx_error_bounded_plan*>(&e);
  CHECK(CALL(cgx_error_bounded_create, MPI_COMM_WORLD, &e, &eplan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(eplan == nullptr);
  check_names_variable(last(), "cgx_error_bounded_create", "5s");
  eplan = reinterpret_cast<cgx_error_bounded_plan*>(&e);
  CHECK(CALL(cgx_error_bounded_create_f, world_f(), &e, &eplan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(eplan == nullptr);
  check_names_variable(last(), "cgx_error_bounded_create", "5s");

  // A configuration filled by hand, without the init, with the default timeout: the same.
  cgx_allreduce_config h;
  std::memset(&h, 0, sizeof h);
  h.type = CGX_DOUBLE;
  h.bits = 2;
  h.bucket = CGX_BUCKET_SMALL;
  h.max_count = 100;
  h.options.threads = 1;
  h.options.timeout_ms = CGX_DEFAULT_TIMEOUT;
  CHECK(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &h, &plan) == CGX_ERR_INVALID_ARGUMENT);
  check_names_variable(last(), "cgx_allreduce_create", "5s");
  CHECK(plan == nullptr);

  // Other malformed values, each refused the same way.
  for (const char* v : {"-1", "4294967296", "12 ms", "0x10"}) {
    const env_timeout other(v);
    CAPTURE(v);
    CHECK(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &c, &plan) == CGX_ERR_INVALID_ARGUMENT);
    check_names_variable(last(), "cgx_allreduce_create", v);
  }
}

TEST_CASE("malformed CGX_TIMEOUT_MS and an explicit timeout_ms: the variable is not read, every call works") {
  const env_timeout bad("5s");
  const int r = world_rank(), p = world_size();
  cgx_allreduce_config c;
  INIT(cgx_allreduce_config_init, &c);
  c.max_count = 3000;
  c.options.native_below_bytes = 0;
  c.options.timeout_ms = 60000;
  cgx_allreduce_plan* plan = nullptr;
  REQUIRE(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &c, &plan) == CGX_OK);
  std::vector<float> v(3000, static_cast<float>(r + 1));
  CHECK(CALL(cgx_allreduce, plan, v.data(), v.size(), CGX_FLOAT) == CGX_OK);
  CHECK(v[0] == 0.5f * static_cast<float>(p * (p + 1)));
  int provided = 0;
  MPI_Query_thread(&provided);
  const cgx_errc started = CALL(cgx_allreduce_start, plan, v.data(), v.size(), CGX_FLOAT);
  CHECK(started == (provided >= MPI_THREAD_SERIALIZED ? CGX_OK : CGX_ERR_TRANSPORT));
  CHECK(CALL(cgx_allreduce_wait, plan) == CGX_OK);
  cgx_stats st;
  CHECK(CALL(cgx_allreduce_stats, plan, &st) == CGX_OK);
  CHECK(st.count == 3000);
  std::size_t below = 1;
  CHECK(CALL(cgx_allreduce_native_below_bytes, plan, &below) == CGX_OK);
  CHECK(below == 0);
#if CGX_TEST_V3
  cgx_path path;
  CHECK(CALL(cgx_allreduce_path, plan, 3000 * sizeof(float), &path) == CGX_OK);
  CHECK(path.measured == 1);  // a fixed threshold (0): nothing to measure
  CHECK(path.compressed == 1);
#endif
  CHECK(CALL(cgx_allreduce_destroy, plan) == CGX_OK);
  plan = nullptr;
  REQUIRE(CALL(cgx_allreduce_create_f, world_f(), &c, &plan) == CGX_OK);
#if CGX_TEST_V2
  CHECK(CALL(cgx_allreduce_free, &plan) == CGX_OK);
  CHECK(plan == nullptr);
#else
  CHECK(CALL(cgx_allreduce_destroy, plan) == CGX_OK);
#endif

  cgx_error_bounded_config e;
  INIT(cgx_error_bounded_config_init, &e);
  e.max_count = 3000;
  e.options.native_below_bytes = 0;
  e.options.timeout_ms = 0;  // no limit: explicit, so the variable is not read either
  cgx_error_bounded_plan* eplan = nullptr;
  REQUIRE(CALL(cgx_error_bounded_create, MPI_COMM_WORLD, &e, &eplan) == CGX_OK);
  std::vector<double> d(3000, 0.5 * (r + 1));
  CHECK(CALL(cgx_error_bounded_allreduce, eplan, d.data(), d.size(), CGX_DOUBLE, 1e-3) == CGX_OK);
  CHECK(std::abs(d[7] - 0.25 * p * (p + 1)) <= 1e-3);
  CHECK(CALL(cgx_error_bounded_stats, eplan, &st) == CGX_OK);
  CHECK(st.count == 3000);
#if CGX_TEST_V3
  CHECK(CALL(cgx_error_bounded_path, eplan, 3000 * sizeof(double), &path) == CGX_OK);
  CHECK(path.compressed == 1);
  CHECK(CALL(cgx_error_bounded_path, eplan, 64, nullptr) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "cgx_error_bounded_path"));
#endif
  CHECK(CALL(cgx_error_bounded_destroy, eplan) == CGX_OK);
  eplan = nullptr;
  REQUIRE(CALL(cgx_error_bounded_create_f, world_f(), &e, &eplan) == CGX_OK);
#if CGX_TEST_V2
  CHECK(CALL(cgx_error_bounded_free, &eplan) == CGX_OK);
  CHECK(eplan == nullptr);
#else
  CHECK(CALL(cgx_error_bounded_destroy, eplan) == CGX_OK);
#endif
}

TEST_CASE("the variable malformed on one rank only: every rank's create fails, none hangs") {
  const int r = world_rank(), p = world_size();
  if (p < 2) return;
  const env_timeout mixed(r == 0 ? "5s" : "60000");
  cgx_allreduce_config c;
  INIT(cgx_allreduce_config_init, &c);
  c.max_count = 100;
  cgx_allreduce_plan* plan = nullptr;
  CHECK(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &c, &plan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(plan == nullptr);
  const std::string m = last();
  if (r == 0) check_names_variable(m, "cgx_allreduce_create", "5s");
  else CHECK(contains(m, "another rank's configuration was refused"));
  cgx_error_bounded_config e;
  INIT(cgx_error_bounded_config_init, &e);
  cgx_error_bounded_plan* eplan = nullptr;
  CHECK(CALL(cgx_error_bounded_create, MPI_COMM_WORLD, &e, &eplan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(eplan == nullptr);
}

TEST_CASE("a refusal's message carries the prefix once, on the refusing rank and the others") {
  const int r = world_rank(), p = world_size();
  cgx_allreduce_config c;
  INIT(cgx_allreduce_config_init, &c);
  c.bits = r == p - 1 ? 11 : 4;  // refused on the last rank (on every rank when p == 1)
  cgx_allreduce_plan* plan = nullptr;
  CHECK(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &c, &plan) == CGX_ERR_INVALID_ARGUMENT);
  const std::string m = last();
  CAPTURE(m);
  if (r == p - 1) CHECK(m.rfind("cgx: cgx_allreduce_create: bits 11 is outside 1..8", 0) == 0);
  cgx_error_bounded_config e;
  INIT(cgx_error_bounded_config_init, &e);
  e.schedule = static_cast<cgx_schedule>(r == p - 1 ? 7 : 0);
  cgx_error_bounded_plan* eplan = nullptr;
  CHECK(CALL(cgx_error_bounded_create, MPI_COMM_WORLD, &e, &eplan) == CGX_ERR_INVALID_ARGUMENT);
  const std::string m2 = last();
  CAPTURE(m2);
  if (r == p - 1) CHECK(m2.rfind("cgx: cgx_error_bounded_create: schedule 7", 0) == 0);
  CHECK(all(true));
}

TEST_CASE("NULL handles and NULL pointers: a code from every function, never a crash") {
  std::vector<float> v(10, 1.0f);
  cgx_stats st;
  std::size_t bytes = 0;
  CHECK(CALL(cgx_allreduce, nullptr, v.data(), v.size(), CGX_FLOAT) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "the plan is NULL"));
  CHECK(CALL(cgx_allreduce_start, nullptr, v.data(), v.size(), CGX_FLOAT) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_allreduce_wait, nullptr) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_allreduce_stats, nullptr, &st) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_allreduce_native_below_bytes, nullptr, &bytes) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_allreduce_destroy, nullptr) == CGX_OK);  // as free(NULL)
  CHECK(CALL(cgx_error_bounded_allreduce, nullptr, v.data(), v.size(), CGX_FLOAT, 1e-3) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_error_bounded_stats, nullptr, &st) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_error_bounded_destroy, nullptr) == CGX_OK);
  CHECK(CALL(cgx_allreduce_create, MPI_COMM_WORLD, nullptr, nullptr) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_error_bounded_create, MPI_COMM_WORLD, nullptr, nullptr) == CGX_ERR_INVALID_ARGUMENT);
  INIT(cgx_options_init, nullptr);
  INIT(cgx_allreduce_config_init, nullptr);
  INIT(cgx_error_bounded_config_init, nullptr);
  called.insert("cgx_errc_name");
  CHECK(std::string(cgx_errc_name(CGX_ERR_INTERNAL)) == "CGX_ERR_INTERNAL");
  CHECK(std::string(cgx_errc_name(-3)) == "unknown");
  called.insert("cgx_version");
  CHECK(std::string(cgx_version()).find('.') != std::string::npos);
  called.insert("cgx_bucket_supported");
  CHECK(cgx_bucket_supported(1024) == 1);
  CHECK(cgx_bucket_supported(7) == 0);
#if CGX_TEST_V2
  CGX_NOEXCEPT_CHECK(cgx_last_error());
  CGX_NOEXCEPT_CHECK(cgx_errc_name(0));
  CGX_NOEXCEPT_CHECK(cgx_version());
  CGX_NOEXCEPT_CHECK(cgx_bucket_supported(0));
  CHECK(CALL(cgx_allreduce_free, nullptr) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "cgx_allreduce_free"));
  CHECK(CALL(cgx_error_bounded_free, nullptr) == CGX_ERR_INVALID_ARGUMENT);
  cgx_allreduce_plan* none = nullptr;
  CHECK(CALL(cgx_allreduce_free, &none) == CGX_OK);  // freeing nothing: nothing to do
  cgx_error_bounded_plan* enone = nullptr;
  CHECK(CALL(cgx_error_bounded_free, &enone) == CGX_OK);
#endif
}

#if CGX_TEST_V2
TEST_CASE("cgx_*_free sets the handle to NULL: a later use gets a code, a second free does nothing") {
  const env_timeout unset(nullptr);
  cgx_allreduce_config c;
  INIT(cgx_allreduce_config_init, &c);
  c.max_count = 100;
  cgx_allreduce_plan* plan = nullptr;
  REQUIRE(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &c, &plan) == CGX_OK);
  REQUIRE(plan != nullptr);
  CHECK(CALL(cgx_allreduce_free, &plan) == CGX_OK);
  CHECK(plan == nullptr);
  std::vector<float> v(100, 1.0f);
  CHECK(CALL(cgx_allreduce, plan, v.data(), v.size(), CGX_FLOAT) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "the plan is NULL"));
  CHECK(CALL(cgx_allreduce_free, &plan) == CGX_OK);

  cgx_error_bounded_config e;
  INIT(cgx_error_bounded_config_init, &e);
  e.max_count = 100;
  cgx_error_bounded_plan* eplan = nullptr;
  REQUIRE(CALL(cgx_error_bounded_create, MPI_COMM_WORLD, &e, &eplan) == CGX_OK);
  CHECK(CALL(cgx_error_bounded_free, &eplan) == CGX_OK);
  CHECK(eplan == nullptr);
  std::vector<double> d(100, 1.0);
  CHECK(CALL(cgx_error_bounded_allreduce, eplan, d.data(), d.size(), CGX_DOUBLE, 1e-3) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(CALL(cgx_error_bounded_free, &eplan) == CGX_OK);
}

TEST_CASE("a configuration marked CGX_INIT_FAILED is refused by every create, on every rank") {
  cgx_allreduce_config c;
  INIT(cgx_allreduce_config_init, &c);
  c.options.timeout_ms = CGX_INIT_FAILED;  // what an init that failed leaves
  cgx_allreduce_plan* plan = nullptr;
  CHECK(CALL(cgx_allreduce_create, MPI_COMM_WORLD, &c, &plan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "CGX_INIT_FAILED"));
  CHECK(plan == nullptr);
  cgx_error_bounded_config e;
  INIT(cgx_error_bounded_config_init, &e);
  e.options.timeout_ms = CGX_INIT_FAILED;
  cgx_error_bounded_plan* eplan = nullptr;
  CHECK(CALL(cgx_error_bounded_create, MPI_COMM_WORLD, &e, &eplan) == CGX_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "CGX_INIT_FAILED"));
}
#endif

TEST_CASE("every function that c.h declares was called by this test (runs last)") {
  std::ifstream in(CGX_C_HEADER);
  REQUIRE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::regex decl(R"(CGX_C_API[^;(]*\b(cgx_[a-z0-9_]+)\s*\()");
  std::set<std::string> declared;
  for (std::sregex_iterator it(text.begin(), text.end(), decl), end; it != end; ++it) declared.insert((*it)[1].str());
  CHECK(declared.size() >= 20);
  for (const auto& f : declared) {
    CAPTURE(f);
    CHECK(called.count(f) == 1);
  }
  for (const auto& m : seen) check_prefix(m);
  MESSAGE(declared.size() << " functions declared in c.h, all called; " << seen.size() << " messages, each with one prefix");
}
